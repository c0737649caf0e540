#pragma once
// A call's tensors in the memory of one CUDA device, owned by the caller, so that the CUDA variants run
// on them in place (the Python module's DLPack path: no host copy). q, k, v, o, dO, dq, dk, dv are
// contiguous row-major (B, S, H, D) arrays (q_dims, kv_dims of core/tensor.hpp) of the call's dtype;
// lse is (B, H_q, S_q) fp32, natural log. Plain pointers: this header needs no CUDA.
namespace flashlab {

// A forward reads q, k, v and writes o, lse.
struct DeviceForwardIo {
  int device = 0;  // the CUDA device ordinal that holds every tensor
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
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
};

}  // namespace flashlab
