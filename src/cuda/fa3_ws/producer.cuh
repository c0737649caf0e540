#pragma once
// cuda-fa3-ws forward, its producer: the TMA copies of Q_i and of each K_j and V_j into their stages, issued
// by one thread, each after its stage is released and announced on its full barrier. A (rows, d) tile goes in as
// panels of kPanelRowBytesOf<T, d> bytes a row (hopper.cuh: 128, or 64 for e4m3 at d = 64), one box per panel, the
// width the launcher's tensor maps were made with (make_bshd_tensor_map); the e4m3 V_j^T as 128-key panels.
// With the FP8 V transposed in the producer (Schedule::kFp8TransposeInKernel), V_j goes into a staging buffer
// instead, and the producer's other three warps make the V_j^T stage from it (transpose_v_blocks, below).
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/fp8_transpose_v_smem.cuh"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/tile_scheduler.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {

// Issues the TMA copies of a tile (one thread). Each copy first waits for its stage to be released
// (the empty barrier's previous phase), then announces its bytes on the full barrier.
template <class Cfg>
struct Loader {
  using Smem = typename Cfg::Smem;
  using Element = typename Cfg::Element;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kStages = Cfg::kStages;
  static constexpr int kD = Smem::kQBytes / (kBr * Smem::kElemBytes);
  static constexpr int kRowBytes = kPanelRowBytesOf<Element, kD>;  // a panel row of Q_i and K_j: 128 (e4m3, d = 64: 64)
  static constexpr int kCols = kRowBytes / Smem::kElemBytes;       // columns per panel: 64 (e4m3: 128; at d = 64, 64)
  static constexpr int kPanels = kD / kCols;  // panels of a (rows, d) tile: d / 64 (e4m3: d / 128, or 1 at d = 64)
  static_assert(kPanels * kCols == kD, "a (rows, d) tile is whole panels");
  const TmaMaps* maps;
  unsigned char* smem;
  std::uint64_t* bars;

  // Q_i (Br, d): once per tile, into Q_i's space once the consumers have released it. `tl` records the
  // wait for the empty slot and the issue.
  template <class Lane>
  __device__ void wait_q_empty(std::uint32_t tile_iter, Lane& tl, const Params& p) const {
    const std::uint64_t t0 = Lane::now();
    mbar_wait(&bars[Smem::kQEmpty], (tile_iter & 1) ^ 1);
    tl.waited(p, t0, Lane::now());
  }
  template <class Lane>
  __device__ void issue_q(const Tile& tile, Lane& tl, const Params& p) const {
    tl.instant(p, PipelineEvent::TmaIssue, Lane::now());
    mbar_arrive_expect_tx(&bars[Smem::kQFull], Smem::kQBytes);
#pragma unroll
    for (int pnl = 0; pnl < kPanels; ++pnl)
      tma_load_4d(smem + Smem::kQOffset + pnl * kBr * kRowBytes, &maps->q, pnl * kCols, tile.h, tile.row0,
                  tile.b, &bars[Smem::kQFull]);
  }
  template <class Lane>
  __device__ void load_q(const Tile& tile, std::uint32_t tile_iter, Lane& tl, const Params& p) const {
    wait_q_empty(tile_iter, tl, p);
    issue_q(tile, tl, p);
  }
  // K_j or V_j (Bc, d) into stage (iter % kStages); `iter` counts K/V blocks over the block's whole life.
  template <bool kIsK, class Lane>
  __device__ void load_kv(const Tile& tile, int j, std::uint32_t iter, Lane& tl, const Params& p) const {
    if constexpr (Cfg::kTransposesV && !kIsK) {
      stage_v(tile, j, iter, tl, p);
      return;
    }
    const int stage = static_cast<int>(iter % kStages);
    const std::uint32_t phase = (iter / kStages) & 1;
    const int empty = (kIsK ? Smem::kKEmpty : Smem::kVEmpty) + stage, full = (kIsK ? Smem::kKFull : Smem::kVFull) + stage;
    unsigned char* dst = smem + (kIsK ? Smem::kKOffset : Smem::kVOffset) + stage * Smem::kKVBytes;
    const CUtensorMap* map = kIsK ? &maps->k : &maps->v;
    const std::uint64_t t0 = Lane::now();
    mbar_wait(&bars[empty], phase ^ 1);
    const std::uint64_t t1 = Lane::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaIssue, t1);
    mbar_arrive_expect_tx(&bars[full], Smem::kKVBytes);
    if constexpr (Cfg::kE4m3 && !kIsK) {
      // V_j^T (d, Bc) from the pre-pass's V^T (B, H_kv, d, keys): panels of kVtPanelKeys keys (128, or 64), each all
      // d rows (one box).
      constexpr int kVtKeys = Cfg::kVtPanelKeys;
#pragma unroll
      for (int pnl = 0; pnl < kBc / kVtKeys; ++pnl)
        tma_load_4d(dst + pnl * kD * kVtKeys, map, j * kBc + pnl * kVtKeys, 0, tile.h_kv, tile.b, &bars[full]);
    } else {
#pragma unroll
      for (int pnl = 0; pnl < kPanels; ++pnl)
        tma_load_4d(dst + pnl * kBc * kRowBytes, map, pnl * kCols, tile.h_kv, j * kBc, tile.b, &bars[full]);
    }
  }

  // With V transposed in the producer (Cfg::kTransposesV): V_j (Bc, d) as it is stored (the plain tensor map, zeros
  // past S_k) into staging buffer (iter % kStagingStages), once the transposing warps have released it, with that
  // buffer's word set to 1 (published by the full barrier's arrival, as the tile slot is by Q_i's).
  template <class Lane>
  __device__ void stage_v(const Tile& tile, int j, std::uint32_t iter, Lane& tl, const Params& p) const {
    constexpr int kStaging = Smem::kStagingStages;
    const int buf = static_cast<int>(iter % kStaging);
    const std::uint32_t phase = (iter / kStaging) & 1;
    unsigned char* dst = smem + Smem::kStagingOffset + buf * Smem::kKVBytes;
    const std::uint64_t t0 = Lane::now();
    mbar_wait(&bars[Smem::kStagedEmpty + buf], phase ^ 1);
    const std::uint64_t t1 = Lane::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaIssue, t1);
    reinterpret_cast<volatile int*>(smem + Smem::kStagingWordsOffset)[buf] = 1;
    mbar_arrive_expect_tx(&bars[Smem::kStagedFull + buf], Smem::kKVBytes);
#pragma unroll
    for (int pnl = 0; pnl < kPanels; ++pnl)
      tma_load_4d(dst + pnl * kBc * kRowBytes, &maps->v, pnl * kCols, tile.h_kv, j * kBc, tile.b,
                  &bars[Smem::kStagedFull + buf]);
  }
  // After the last V_j: the next staging buffer's word set to 0 and its full barrier's phase completed without a
  // copy, which tells the transposing warps to stop. `iter` counts the V blocks staged before.
  __device__ void end_v_staging(std::uint32_t iter) const {
    constexpr int kStaging = Smem::kStagingStages;
    const int buf = static_cast<int>(iter % kStaging);
    mbar_wait(&bars[Smem::kStagedEmpty + buf], ((iter / kStaging) & 1) ^ 1);
    reinterpret_cast<volatile int*>(smem + Smem::kStagingWordsOffset)[buf] = 0;
    mbar_arrive(&bars[Smem::kStagedFull + buf]);
  }
};

// Producer warp `warp` (0 .. kTransposeWarps - 1 among the transposing ones) of the FP8 forward with V transposed in
// the producer: for every V_j the issuer stages, in order, waits for it to land and for its V_j^T stage to be free,
// writes its share of V_j^T there (transpose_v_block_e4m3), and then counts one arrival, once every lane is done, on
// the staging buffer's empty barrier and on the stage's full one (the consumers wait there as they do for a TMA copy).
// The generic-proxy stores are fenced before the arrival that hands them to the consumers' wgmma (the async proxy).
template <class Cfg>
__device__ void transpose_v_blocks(unsigned char* smem, unsigned warp, unsigned lane) {
  using Smem = typename Cfg::Smem;
  constexpr int kStaging = Smem::kStagingStages, kStages = Cfg::kStages;
  constexpr int kD = Smem::kQBytes / Cfg::kBr;  // e4m3: one byte an element
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + Smem::kBarOffset);
  for (std::uint32_t iter = 0;; ++iter) {
    const int buf = static_cast<int>(iter % kStaging), stage = static_cast<int>(iter % kStages);
    mbar_wait(&bars[Smem::kStagedFull + buf], (iter / kStaging) & 1);
    // the issuer's "no more V blocks"
    if (reinterpret_cast<const volatile int*>(smem + Smem::kStagingWordsOffset)[buf] == 0) break;
    mbar_wait(&bars[Smem::kVEmpty + stage], ((iter / kStages) & 1) ^ 1);
    transpose_v_block_e4m3<kD, Cfg::kBc, kPanelRowBytesOf<__nv_fp8_e4m3, kD>>(
        smem_u32(smem + Smem::kStagingOffset + buf * Smem::kKVBytes),
        smem_u32(smem + Smem::kVOffset + stage * Smem::kKVBytes), warp, kTransposeWarps, lane);
    fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(&bars[Smem::kStagedEmpty + buf]);
      mbar_arrive(&bars[Smem::kVFull + stage]);
    }
  }
}

// ---- softmax ----------------------------------------------------------------------------------------------------

}  // namespace flashlab::cuda::fa3_ws
