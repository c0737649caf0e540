#pragma once
// The host path of the Python module: NumPy arrays in, copied into HostTensors (double, (B, S, H, D)
// row-major, whatever the array's strides), and results out as new NumPy arrays.
#include <pybind11/numpy.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab::python {

namespace py = pybind11;

// The array's extents, outermost first.
std::vector<std::int64_t> dims_of(const py::array&);

// The DType of an array of float64, float32 or float16 in native byte order; InputError naming the
// array (`name`) for any other dtype.
DType dtype_of(const py::array&, const std::string& name);

// A copy of the array's values in double, row-major. A 4-d array is read in `layout` and stored in
// (B, S, H, D); an array of another rank (the LSE) is stored as it is.
HostTensor to_host_tensor(const py::array&, Layout);

// A new NumPy array of `dtype` (f64, f32 or f16) holding `t`. A 4-d t, in (B, S, H, D), is returned in
// `layout` (for bhsd, a transposed view of the (B, S, H, D) array).
py::array to_numpy(const HostTensor& t, DType dtype, Layout);

}  // namespace flashlab::python
