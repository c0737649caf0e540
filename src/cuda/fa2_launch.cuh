#pragma once
// What the host side of cuda-fa2 (fa2.cu) hands to the kernels (fa2_forward.cu, fa2_backward.cu):
// raw device pointers in layout (B, S, H, D), the problem's extents and the derived constants.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/problem.hpp"
#include "cuda/constraints.hpp"  // kHeadDims: one configuration each

namespace flashlab::cuda::fa2 {

struct Params {
  // Inputs and forward outputs; element type T (fp16 or bf16) unless marked float.
  const void* q = nullptr;  // (B, S_q, H_q, D)
  const void* k = nullptr;  // (B, S_k, H_kv, D)
  const void* v = nullptr;  // (B, S_k, H_kv, D)
  void* o = nullptr;        // (B, S_q, H_q, D)
  float* lse = nullptr;     // (B, H_q, S_q), natural log
  // Backward only.
  const void* d_o = nullptr;   // (B, S_q, H_q, D)
  float* D_i = nullptr;        // (B, H_q, S_q): D_i = rowsum(dO_i o O_i)
  float* dq_accum = nullptr;   // (B, S_q, H_q, D) fp32, zeroed, atomics
  void* dq = nullptr;          // (B, S_q, H_q, D)
  void* dk = nullptr;          // (B, S_k, H_kv, D)
  void* dv = nullptr;          // (B, S_k, H_kv, D)
  // Accumulate mode (a ring's block, cuda/ring_rank.cuh): with all three set, dq, dk and dv are not written;
  // the block's dQ, dK and dV are added, in fp32, into these (B, S, H, D) fp32 tensors of the same extents.
  // Without dropout.
  float* dq_sum = nullptr;
  float* dk_sum = nullptr;
  float* dv_sum = nullptr;

  int batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  CausalAlign align = CausalAlign::None;
  float scale = 0;       // softmax scale
  float scale_log2 = 0;  // scale * log2(e): exp(scale * s) = exp2(scale_log2 * s)
  bool dropout = false;
  std::uint32_t drop_threshold = 0;  // core/philox.hpp dropout_threshold(p)
  float drop_rescale = 1;            // 1 / (1 - p)
  std::uint64_t seed = 0;
  // Backward: use the compact tiles even where the full ones fit (FLASHLAB_FA2_COMPACT_BACKWARD=1; tests).
  bool compact_backward = false;
};

// Launch on `stream`; `dtype` is F16 or BF16. Check launches, do not synchronize.
void launch_forward(DType dtype, const Params&, cudaStream_t stream = nullptr);
// D_i = rowsum(dO_i o O_i), the K/V-outer main kernel (dK, dV; dQ into dq_accum), dQ conversion (or, in
// accumulate mode, its addition into dq_sum). dq_accum must be zeroed by the caller.
void launch_backward(DType dtype, const Params&, cudaStream_t stream = nullptr);

}  // namespace flashlab::cuda::fa2
