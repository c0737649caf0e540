#pragma once
// The device path of the Python module: tensors in GPU memory handed over through DLPack (PyTorch,
// CuPy, or this module's own DeviceArray), read in place, and results handed back the same way.
//
// A tensor comes in as the capsule its producer's __dlpack__(stream=1) returned: the producer has made
// the legacy default stream, on which every kernel here runs, wait for its pending work. The capsule is
// consumed (renamed "used_dltensor") and its deleter runs when the call ends, after the kernels have
// finished. The kernels read row-major (B, S, H, D) memory: a tensor must be contiguous in the call's
// layout, or, for bhsd, a (B, H, S, D) view of (B, S, H, D) memory (x.transpose(1, 2) of a contiguous
// tensor); anything else is refused with one sentence, never copied.
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/problem.hpp"

namespace flashlab::python {

namespace py = pybind11;

// One input tensor in GPU memory, described from its DLPack capsule, which it holds until it is destroyed.
class DeviceInput {
 public:
  // Consumes `capsule` (q.__dlpack__(stream=1)). Throws InputError naming the tensor (`name`) unless it
  // is a CUDA tensor of f64, f32, f16, bf16 or float8_e4m3fn (DLPack 1.1's type code 10, read as e4m3). With
  // `uint8_is_e4m3` (a call that asked for e4m3) uint8 is read as e4m3 bytes too: producers whose DLPack has no
  // float8 export e4m3 tensors as their uint8 view.
  DeviceInput(py::capsule capsule, std::string name, bool uint8_is_e4m3 = false);

  const std::string& name() const { return name_; }
  InputDims dims() const { return {name_, dims_}; }
  DType dtype() const { return dtype_; }
  int device() const { return device_; }
  void* data() const { return data_; }
  std::size_t bytes() const;  // its extent in memory, once require_kernel_layout has passed (compact)
  // Throws InputError unless the tensor's memory is row-major (B, S, H, D) for its dims in `layout`
  // (for a 3-d LSE: row-major as it is), saying which strides it has and which it needs.
  void require_kernel_layout(Layout) const;
  // For a buffer the caller gives a result to be written into: throws InputError unless it has the
  // result's dims, dtype and device, and the kernels' layout.
  void require_fits_result(const std::vector<std::int64_t>& dims, DType, int device, Layout) const;

 private:
  struct ReturnToProducer {
    void operator()(DLManagedTensor* m) const {
      if (m->deleter) m->deleter(m);
    }
  };
  std::unique_ptr<DLManagedTensor, ReturnToProducer> managed_;  // set first: released even if a check throws
  std::string name_;
  std::vector<std::int64_t> dims_, strides_;  // strides in elements; empty: compact and row-major
  DType dtype_ = DType::F32;
  int device_ = 0;
  void* data_ = nullptr;
};

// Throws InputError unless every input has the dtype and device of the first.
void require_same_dtype_and_device(const std::vector<const DeviceInput*>& inputs);

// Memory on a CUDA device that this module allocated for a result, shown to Python as a DLPack producer
// (torch.from_dlpack, cupy.from_dlpack read it in place). The memory lives as long as this object or
// any tensor made from it.
class DeviceArray {
 public:
  // `dims` in the caller's layout; a 4-d array in bhsd is laid out in memory as (B, S, H, D).
  DeviceArray(std::vector<std::int64_t> dims, Layout, DType, int device);

  void* data() const { return memory_.get(); }
  const std::vector<std::int64_t>& shape() const { return dims_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }  // in elements
  DType dtype() const { return dtype_; }
  int device() const { return device_; }

  // The DLPack protocol. The results are complete when a call returns, so there is nothing for a
  // consumer's stream to wait for.
  py::capsule dlpack(const py::object& stream) const;
  py::tuple dlpack_device() const;

 private:
  std::shared_ptr<void> memory_;
  std::vector<std::int64_t> dims_, strides_;
  DType dtype_;
  int device_;
};

// Where a result goes: a buffer the caller gave (a DLPack capsule, checked to fit the result), or a new
// DeviceArray made here.
class ResultBuffer {
 public:
  ResultBuffer(const std::optional<py::capsule>& given, std::string name, std::vector<std::int64_t> dims, Layout,
               DType, int device);
  void* data() const;
  // Throws InputError when the caller's buffer overlaps one of `inputs` in memory: the kernels would
  // write it while they read them.
  void require_apart_from(const std::vector<const DeviceInput*>& inputs) const;
  // The new DeviceArray, or None when the result went into the caller's buffer.
  py::object release();

 private:
  std::optional<DeviceInput> given_;
  std::unique_ptr<DeviceArray> made_;
};

}  // namespace flashlab::python
