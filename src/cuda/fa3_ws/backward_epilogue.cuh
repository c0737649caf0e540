#pragma once
// cuda-fa3-ws backward, the epilogue: after a block's last step, one consumer's dK_j = scale dK_j and dV_j out.
// In the input dtype they go through the Q_i, dO_i stages, which no step reads any more (dK_j, then dV_j, each
// (Bc, d) and swizzled like K_j), then out in 16-byte coalesced stores, rows past the end of the keys dropped.
// Stored straight from the registers (two columns a thread, eight rows a warp per store), they took 5.6 us of a
// 105-us block at d = 128, N = 2k on the H100. A ring's block (accumulate mode) adds them to fp32 sums instead,
// from the registers. Where thread blocks share a group's query heads (Params::group_splits > 1), each block's dK_j,
// dV_j are partial sums: add_group_splits writes them to the block's fp32 slice, and the last block to finish adds
// the slices. `C` is the backward's Consumer (backward_consumer.cuh), whose thread coordinates and shared memory this
// reads.
#include <cstdint>

#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/named_barriers.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {

// Params::group_splits > 1: this block's dK_j (scaled) and dV_j are its share of the group's sum. Each warp writes
// its rows, in fp32, to the block's slice of dk_partial and dv_partial and takes a ticket; the warp that takes the
// last one (every other slice is written by then) adds all slices in split order, so that the sum does not depend
// on which block finished last, and writes dK_j and dV_j in the input dtype. A warp's rows are its accumulator rows
// (key_of), so the warps need no barrier among themselves.
template <class C>
__device__ void add_group_splits(const C& self, const float (&dk)[C::kNKV], const float (&dv)[C::kNKV]) {
  using T = typename C::Element;
  constexpr int D = C::kD, kNKV = C::kNKV, kBc = C::kBc;
  const Params& p = self.p;
  const KeyBlock& kb = self.kb;
  const std::int64_t slice = std::int64_t(p.batch) * p.seq_k * p.heads_kv * D;
  const auto row_of = [&](int key) { return ((std::int64_t(kb.b) * p.seq_k + key) * p.heads_kv + kb.h_kv) * D; };
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = self.key_of(hf);
    if (key >= p.seq_k) continue;
    const std::int64_t row = kb.split * slice + row_of(key);
#pragma unroll
    for (int ii = 0; ii < kNKV / 4; ++ii) {
      const int col = self.kv_col0() + 8 * ii + 2 * self.t;
      *reinterpret_cast<float2*>(p.dk_partial + row + col) =
          make_float2(dk[4 * ii + 2 * hf] * p.scale, dk[4 * ii + 2 * hf + 1] * p.scale);
      *reinterpret_cast<float2*>(p.dv_partial + row + col) = make_float2(dv[4 * ii + 2 * hf], dv[4 * ii + 2 * hf + 1]);
    }
  }
  __threadfence();  // this thread's slice before the warp's ticket
  __syncwarp();
  const int lane = 4 * self.g + self.t;
  const int n_kv = (p.seq_k + kBc - 1) / kBc;
  int* const ticket = p.kv_tickets +
                      ((std::int64_t(kb.b * p.heads_kv + kb.h_kv) * n_kv + kb.j) * C::Cfg::kConsumers + self.c) * kWarpsPerWarpgroup +
                      self.warp;
  int taken = 0;
  if (lane == 0) taken = atomicAdd(ticket, 1);
  if (__shfl_sync(0xffffffffu, taken, 0) != p.group_splits - 1) return;
  __threadfence();  // the other blocks' slices, which they wrote before their tickets
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = self.key_of(hf);
    if (key >= p.seq_k) continue;
    const std::int64_t row = row_of(key);
#pragma unroll
    for (int ii = 0; ii < kNKV / 4; ++ii) {
      const int col = self.kv_col0() + 8 * ii + 2 * self.t;
      float2 sk = make_float2(0.f, 0.f), sv = sk;
      for (int s = 0; s < p.group_splits; ++s) {
        const float2 k2 = __ldcg(reinterpret_cast<const float2*>(p.dk_partial + s * slice + row + col));
        const float2 v2 = __ldcg(reinterpret_cast<const float2*>(p.dv_partial + s * slice + row + col));
        sk.x += k2.x, sk.y += k2.y, sv.x += v2.x, sv.y += v2.y;
      }
      *reinterpret_cast<std::uint32_t*>(static_cast<T*>(p.dk) + row + col) = pack2<T>(sk.x, sk.y);
      *reinterpret_cast<std::uint32_t*>(static_cast<T*>(p.dv) + row + col) = pack2<T>(sv.x, sv.y);
    }
  }
}

template <class C>
__device__ void backward_epilogue(const C& self, float (&dk)[C::kNKV], float (&dv)[C::kNKV]) {
  using T = typename C::Element;
  using Cfg = typename C::Cfg;
  constexpr int D = C::kD, kNKV = C::kNKV, kBc = C::kBc;
  const Params& p = self.p;
  const KeyBlock& kb = self.kb;
  const int c = self.c, warp = self.warp, g = self.g, t = self.t;
  if constexpr (C::kAccumulates) {  // add to the fp32 sums straight from the registers
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = self.key_of(hf);
      if (key >= p.seq_k) continue;
      const std::int64_t row = ((std::int64_t(kb.b) * p.seq_k + key) * p.heads_kv + kb.h_kv) * D;
#pragma unroll
      for (int ii = 0; ii < kNKV / 4; ++ii) {
        const int col = self.kv_col0() + 8 * ii + 2 * t;
        auto* at_k = reinterpret_cast<float2*>(p.dk_sum + row + col);
        auto* at_v = reinterpret_cast<float2*>(p.dv_sum + row + col);
        const float2 sk = *at_k, sv = *at_v;
        *at_k = make_float2(sk.x + dk[4 * ii + 2 * hf] * p.scale, sk.y + dk[4 * ii + 2 * hf + 1] * p.scale);
        *at_v = make_float2(sv.x + dv[4 * ii + 2 * hf], sv.y + dv[4 * ii + 2 * hf + 1]);
      }
    }
    return;
  }
  if (p.group_splits > 1) {
    add_group_splits(self, dk, dv);
    return;
  }
  // dK_j and dV_j are staged where the steps' tiles were: the Q_i, dO_i stages and, past them, the dS^T (and P^T)
  // buffers (with three consumers, Bc = 192, the stages alone are too small), never the P^T rows a dQ piece may use.
  static_assert(2 * Cfg::kKVBytes <= Cfg::kPtOffset - Cfg::kQOffset && Cfg::kDOOffset == Cfg::kQOffset + kStages * Cfg::kQBytes,
                "dK_j and dV_j fit the Q_i, dO_i stages and the dS^T buffers");
  // The other consumers' last GEMMs may still read those tiles: all meet first (the consumers' one shared barrier;
  // all have used it equally often by now, so this is a fresh round of it).
  named_barrier_sync(Cfg::Barriers::kDsWritten, Cfg::kConsumers * kWarpgroupThreads);
  unsigned char* const staged = self.smem + Cfg::kQOffset;  // dK_j, then dV_j kKVBytes further
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = self.key_row0() + 16 * warp + g + 8 * hf;
#pragma unroll
    for (int ii = 0; ii < kNKV / 4; ++ii) {
      const std::uint32_t at = swizzle128_offset<T>(r, self.kv_col0() + 8 * ii + 2 * t, kBc);
      *reinterpret_cast<std::uint32_t*>(staged + at) = pack2<T>(dk[4 * ii + 2 * hf] * p.scale, dk[4 * ii + 2 * hf + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(staged + Cfg::kKVBytes + at) = pack2<T>(dv[4 * ii + 2 * hf], dv[4 * ii + 2 * hf + 1]);
    }
  }
  named_barrier_sync(Cfg::Barriers::kConsumer + c, kWarpgroupThreads);
  constexpr int kChunks = Cfg::kKvCols / 8;  // 16-byte chunks of a row of this consumer's columns
#pragma unroll 4
  for (int idx = self.tid; idx < 2 * kKeysPerConsumer * kChunks; idx += kWarpgroupThreads) {
    const int which = idx / (kKeysPerConsumer * kChunks), r = self.key_row0() + (idx / kChunks) % kKeysPerConsumer;
    const int col = self.kv_col0() + 8 * (idx % kChunks), key = kb.key0 + r;
    if (key >= p.seq_k) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(staged + which * Cfg::kKVBytes + swizzle128_offset<T>(r, col, kBc));
    *reinterpret_cast<uint4*>(static_cast<T*>(which == 0 ? p.dk : p.dv) + ((std::int64_t(kb.b) * p.seq_k + key) * p.heads_kv + kb.h_kv) * D + col) = v;
  }
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
