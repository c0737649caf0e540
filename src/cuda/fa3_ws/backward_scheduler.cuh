#pragma once
// cuda-fa3-ws backward, its schedule: which K/V block j a thread block takes (and in what order the blocks are
// launched), and its steps, the (query head, query block i) pairs that see the block.
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

// What a block works on: K/V block j of (batch b, K/V head h_kv), and its steps: every (query head of its share of
// the group, query block i >= i_first), heads outer. The group's query heads h_kv * group .. are shared among
// Params::group_splits blocks (backward_split), `heads` each; this block's share is number `split`, from head0.
struct KeyBlock {
  int b, h_kv, split, j, key0, head0, heads, n_q, i_first, n_i, n_steps;
  __device__ int head(int step) const { return head0 + step / n_i; }
  __device__ int q_block(int step) const { return i_first + step % n_i; }
};

template <int kBr, int kBc>
__device__ KeyBlock key_block(const Params& p) {
  KeyBlock kb;
  // Deterministic and causal, the K/V blocks add to dQ_i from the last to the first (dq_turn), and they are
  // launched in that order too: a block then waits only for blocks launched before it, which run or are done.
  // Launched the other way round, once a head has more K/V blocks than the GPU holds at once, every resident block
  // would wait for one that has no SM to run on.
  // The grid is (K/V blocks, rows); blocks are launched in the order of their linear index, x fastest. Keys outer
  // (Params::key_blocks_outer) reads that index the other way round, so the rows vary fastest.
  const int n_kv = (p.seq_k + kBc - 1) / kBc;
  int launched = static_cast<int>(blockIdx.x), row = static_cast<int>(blockIdx.y);  // row: (b, h_kv, split)
  if (p.key_blocks_outer) {
    const std::int64_t linear = std::int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
    launched = static_cast<int>(linear / gridDim.y);
    row = static_cast<int>(linear % gridDim.y);
  }
  kb.j = p.deterministic && p.align != CausalAlign::None ? n_kv - 1 - launched : launched;
  kb.split = row % p.group_splits;
  kb.b = row / p.group_splits / p.heads_kv;
  kb.h_kv = row / p.group_splits % p.heads_kv;
  kb.key0 = kb.j * kBc;
  const int group = p.heads_q / p.heads_kv;
  kb.heads = group / p.group_splits;
  kb.head0 = kb.h_kv * group + kb.split * kb.heads;
  kb.n_q = (p.seq_q + kBr - 1) / kBr;
  const int first_row = first_row_seeing_key(p.align, kb.key0, p.seq_q, p.seq_k);
  kb.i_first = first_row < p.seq_q ? first_row / kBr : kb.n_q;
  kb.n_i = kb.n_q - kb.i_first;
  kb.n_steps = kb.heads * kb.n_i;
  return kb;
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
