#pragma once
// cuda-fa3-ws forward, the epilogue: one consumer's 64 rows of a tile out. O_i = diag(l_i)^-1 O_i (for e4m3 also
// times V's descale), rounded to the output type (T; bf16 for e4m3), goes through this consumer's rows of O_i's
// (swizzled) staging space (its own buffer, the buffer the consumers share in turn at d = 256, or Q_i's space
// below step 5), then out in 16-byte coalesced stores with a row guard;
// L_i goes straight from the registers. Q_i's space is released last when O_i went out through it.
// `C` is the forward's Consumer (forward_consumer.cuh), whose thread coordinates, shared memory and timeline lane
// this reads.
#include <cstdint>

#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/forward_config.cuh"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/named_barriers.cuh"
#include "cuda/fa3_ws/online_softmax.cuh"
#include "cuda/fa3_ws/tile_scheduler.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {

// `v_descale`: V's descale of the tile for e4m3 (unused otherwise).
template <class C>
__device__ void forward_epilogue(const C& self, const Tile& tile, float (&o)[C::kNO], const typename C::Softmax& sm,
                                 float v_descale) {
  using T = typename C::Cfg::Output;
  using Cfg = typename C::Cfg;
  using Smem = typename C::Smem;
  using TL = typename C::TL;
  constexpr int D = C::kD, kNO = C::kNO;
  const Params& p = self.p;
  const int c = self.c, warp = self.warp, g = self.g, t = self.t;
  const std::uint64_t t0 = TL::now();
  float inv_l[2], lse[2];
  sm.finalize(inv_l, lse);
  if constexpr (C::kE4m3) {  // O_i was summed on V's quantized values
    inv_l[0] *= v_descale;
    inv_l[1] *= v_descale;
  }
  unsigned char* os = self.smem + Smem::kOOffset;
  // Staging row of this consumer's first row: its own 64 rows of a (Br, d) space, or the shared (64, d) one.
  const int stage_row0 = Cfg::kOBufferShared ? 0 : c * kRowsPerConsumer;
  if constexpr (Cfg::kOBufferShared) {  // wait until the other consumer has read its O out of the buffer
    const std::uint64_t tw = TL::now();
    named_barrier_sync(ForwardBarriers::kOBufferFree + c, 2 * kWarpgroupThreads);
    self.tl.waited(p, tw, TL::now());
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = stage_row0 + 16 * warp + g + 8 * hf;  // staging row
#pragma unroll
    for (int i = 0; i < kNO / 4; ++i)
      *reinterpret_cast<std::uint32_t*>(os + swizzle128_offset<T>(r, 8 * i + 2 * t, Smem::kOPanelRows)) =
          pack2<T>(o[4 * i + 2 * hf] * inv_l[hf], o[4 * i + 2 * hf + 1] * inv_l[hf]);
    const int row = self.row_of(tile, hf);
    if (t == 0 && row < p.seq_q)
      p.lse[(static_cast<std::int64_t>(tile.b) * p.heads_q + tile.h) * p.seq_q + row] = lse[hf];
  }
  named_barrier_sync(ForwardBarriers::kConsumer + c, kWarpgroupThreads);
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
  T* o_base = static_cast<T*>(p.o);
#pragma unroll
  for (int idx = self.tid; idx < kRowsPerConsumer * kChunksPerRow; idx += kWarpgroupThreads) {
    const int r = idx / kChunksPerRow, ch = idx % kChunksPerRow;
    const int row = tile.row0 + c * kRowsPerConsumer + r;
    if (row < p.seq_q) {
      const uint4 v = *reinterpret_cast<const uint4*>(os + swizzle128_offset<T>(stage_row0 + r, ch * 8, Smem::kOPanelRows));
      const std::int64_t off = ((static_cast<std::int64_t>(tile.b) * p.seq_q + row) * p.heads_q + tile.h) * D + ch * 8;
      *reinterpret_cast<uint4*>(o_base + off) = v;
    }
  }
  named_barrier_sync(ForwardBarriers::kConsumer + c, kWarpgroupThreads);  // every read of O_i's space is done
  if constexpr (Cfg::kORows == 0) self.release(Smem::kQEmpty);
  if constexpr (Cfg::kOBufferShared)
    named_barrier_arrive(ForwardBarriers::kOBufferFree + (1 - c), 2 * kWarpgroupThreads);
  self.tl.span(p, PipelineEvent::Epilogue, t0);
}

}  // namespace flashlab::cuda::fa3_ws
