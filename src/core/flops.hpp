#pragma once
// FLOP counts, in the convention of the FlashAttention papers (and of the PyTorch SDPA benchmark,
// sdpa_bench.py, that scripts/bench_vs_sdpa.sh runs beside ours), so that our TFLOP/s and the peers'
// are the same unit: forward = 4 * B * H_q * S_q * S_k * d (two matmuls of 2 * S_q * S_k * d each),
// halved when causal; backward = 2.5x forward (five matmuls instead of two).
#include "core/problem.hpp"

namespace flashlab {

// The forward pass's FLOPs per visible score S_ij, over every batch and query head: QK^T and PV each
// cost 2d per score. Code that counts the visible scores itself (the ring's schedule, model/ring.hpp)
// multiplies by this.
inline double forward_flops_per_score(const Shape& s) { return 4.0 * s.batch * s.heads_q * s.head_dim; }
constexpr double kBackwardFlopsPerForward = 2.5;

inline double forward_flops(const Shape& s, CausalAlign causal) {
  const double full = forward_flops_per_score(s) * double(s.seq_q) * double(s.seq_k);
  return causal == CausalAlign::None ? full : 0.5 * full;
}
inline double backward_flops(const Shape& s, CausalAlign causal) {
  return kBackwardFlopsPerForward * forward_flops(s, causal);
}

}  // namespace flashlab
