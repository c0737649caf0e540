#pragma once
// The host path of the Python module: arrays read through Python's buffer protocol (NumPy arrays, and
// anything else that exports a strided buffer) and copied into HostTensors; results handed back as
// HostArray, which exports a buffer that np.asarray views without a copy. The NumPy C API is not used,
// so the module works with NumPy 1 and 2 alike.
#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab::python {

namespace py = pybind11;

// One input array, as its buffer describes it.
class HostInput {
 public:
  HostInput(const py::buffer& array, std::string name);

  InputDims dims() const;
  // float64, float32 or float16 in native byte order; InputError naming the array for anything else.
  DType dtype() const;
  // A copy of the values in double, row-major. A 4-d array is read in `layout` and stored in (B, S, H, D);
  // an array of another rank (the LSE) is stored as it is.
  HostTensor to_host_tensor(Layout) const;

 private:
  py::buffer_info info_;
  std::string name_;
};

// A result in host memory: a HostTensor's values in `dtype` (f64, f32 or f16), shown with its dims in
// `layout` (for bhsd, a transposed view of (B, S, H, D) memory, as the input was read).
class HostArray {
 public:
  HostArray(const HostTensor& t, DType dtype, Layout layout);
  py::buffer_info buffer();

 private:
  std::vector<std::byte> bytes_;
  std::vector<py::ssize_t> shape_, strides_;  // strides in bytes
  DType dtype_;
};

}  // namespace flashlab::python
