#pragma once
// A call's tensors in the memory of one CUDA device, owned by the caller, so that the CUDA variants run
// on them in place (the Python module's DLPack path and the PyTorch operators: no host copy). q, k, v, o, dO, dq,
// dk, dv are contiguous row-major (B, S, H, D) arrays (q_dims, kv_dims of core/tensor.hpp) of the call's dtype;
// lse is (B, H_q, S_q) fp32, natural log. Plain pointers: this header needs no CUDA.
#include <cstddef>

namespace flashlab {

// Where a call's kernels run, and whether it waits for them. The default is the command line's way: the legacy
// default stream, and the call returns once the kernels have finished. A library caller (the PyTorch operators)
// names its own stream and asynchronous = true: the kernels are queued there behind the caller's earlier work and
// the call returns at once, as a CUDA library call does; nothing is allocated with cudaMalloc and nothing waits, so
// the call can be captured in a CUDA graph. Such a call brings its scratch (Variant::device_scratch_bytes says how
// much): bytes of device memory the variant may use as it likes until the kernels finish.
struct DeviceLaunch {
  void* stream = nullptr;  // a cudaStream_t; nullptr is the legacy default stream
  bool asynchronous = false;
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
};

// A forward reads q, k, v and writes o, lse.
struct DeviceForwardIo {
  int device = 0;  // the CUDA device ordinal that holds every tensor
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
  DeviceLaunch launch = {};
};

// A backward reads q, k, v, the forward's o and lse, and dO, and writes dq, dk, dv. (The unfused
// variants recompute P from lse alone and do not read o.)
struct DeviceBackwardIo {
  int device = 0;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const float* lse = nullptr;
  const void* d_o = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  DeviceLaunch launch = {};
};

}  // namespace flashlab
