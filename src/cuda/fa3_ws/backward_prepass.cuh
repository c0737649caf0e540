#pragma once
// cuda-fa3-ws backward, its pre-pass (row_stats_kernel): D_i = rowsum(dO_i o O_i) and L_i log2(e) into scratch
// padded to whole query blocks, and dQ_accum, dQ's counters and (group splits) dK, dV's tickets cleared, before the
// main kernel runs.
#include <cmath>
#include <cstdint>

#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// D / 8 threads per (batch, query head, padded row), one 16-byte vector of O and one of dO each: D_i = sum_d
// dO[i, d] O[i, d] and L_i log2(e), or 0 and +inf for a padding row or a row that saw no key (L = -inf). The same
// threads clear dQ's counters and dQ_accum, D floats each row's group (the chunk of the same index, not the row's own floats: the
// kernel only needs every float cleared once, and this keeps the stores coalesced), so that no separate memset
// pass writes it (measured on the H100: a warp per row with 2-byte loads ran at 1 TB/s, this one near the
// bandwidth).
template <class T, int D>
__global__ void row_stats_kernel(const Params p, int padded_rows) {
  constexpr int kGroup = D / 8;  // threads per row: 8, 16, 32
  static_assert(32 % kGroup == 0, "a row's group lies within one warp");
  const std::int64_t thread = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t row_index = thread / kGroup;  // over (B, H_q, padded S_q)
  const int part = static_cast<int>(thread % kGroup);
  const bool in_grid = row_index < std::int64_t(p.batch) * p.heads_q * padded_rows;
  using Cfg = BwdConfig<D>;
  if (p.group_splits > 1) {  // the tickets of the blocks that share a group's query heads (add_group_splits)
    const int bc = backward_block_keys(D, p.consumers);
    const std::int64_t tickets = std::int64_t(p.batch) * p.heads_kv * ((p.seq_k + bc - 1) / bc) * p.consumers *
                                 kWarpsPerWarpgroup;
    for (std::int64_t i = thread; i < tickets; i += std::int64_t(gridDim.x) * blockDim.x) p.kv_tickets[i] = 0;
  }
  const int row = static_cast<int>(row_index % padded_rows);
  const std::int64_t bh = row_index / padded_rows;
  float sum = 0.f, lse2 = INFINITY;
  if (in_grid && row < p.seq_q) {
    const int b = static_cast<int>(bh / p.heads_q), h = static_cast<int>(bh % p.heads_q);
    const std::int64_t at = ((std::int64_t(b) * p.seq_q + row) * p.heads_q + h) * D + part * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + at);
    const uint4 d_o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.d_o) + at);
    const T* o8 = reinterpret_cast<const T*>(&o);
    const T* d_o8 = reinterpret_cast<const T*>(&d_o);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += static_cast<float>(o8[e]) * static_cast<float>(d_o8[e]);
    const float lse = p.lse[bh * p.seq_q + row];
    if (lse != -INFINITY) lse2 = lse * kLog2e;
  }
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!in_grid) return;
  float4* clear = reinterpret_cast<float4*>(p.dq_accum + row_index * D + part * 8);
  clear[0] = clear[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  // The first row of each query block's group clears the block's dQ counters, and the grid's first the
  // conversion's ticket after them.
  if (row % Cfg::kBr == 0 && part < Cfg::kDqPieces) p.dq_semaphore[row_index / Cfg::kBr * Cfg::kDqPieces + part] = 0;
  if (row_index == 0 && part == 0)
    p.dq_semaphore[std::int64_t(p.batch) * p.heads_q * (padded_rows / Cfg::kBr) * Cfg::kDqPieces] = 0;
  if (part == 0) {
    p.D_i[row_index] = sum;
    p.lse_log2[row_index] = lse2;
  }
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
