#pragma once
// cuda-fa3-ws backward, its producer: the TMA copies of K_j and V_j (once) and of each step's Q_i, dO_i (tiles) and
// L_i, D_i (bulk copies) into one of two stages, issued by one elected thread once the consumers release the stage.
#include <cstdint>

#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

struct BwdMaps {
  CUtensorMap q, k, v, d_o;
};

// One elected thread: K_j and V_j once, then each step's Q_i, dO_i, L_i and D_i into stage step % kStages,
// once the consumers have released it.
template <class Cfg, bool kTimeline>
__device__ void produce(const Params& p, const BwdMaps& maps, const KeyBlock& kb, unsigned char* smem, std::uint64_t* bars,
                        TimelineLane<kTimeline>& tl) {
  constexpr int D = Cfg::kD;
  using TL = TimelineLane<kTimeline>;
  constexpr int kPanels = D / kBackwardPanelCols;
  if (kb.n_steps == 0) return;  // no query sees the block: dK_j = dV_j = 0, nothing to load
  tl.instant(p, PipelineEvent::TmaIssue, TL::now());
  mbar_arrive_expect_tx(&bars[Cfg::kKVFull], 2 * Cfg::kKVBytes);
#pragma unroll
  for (int pnl = 0; pnl < kPanels; ++pnl) {
    tma_load_4d(smem + Cfg::kKOffset + pnl * Cfg::kBc * kPanelRowBytes, &maps.k, pnl * kBackwardPanelCols, kb.h_kv, kb.key0, kb.b,
                &bars[Cfg::kKVFull]);
    tma_load_4d(smem + Cfg::kVOffset + pnl * Cfg::kBc * kPanelRowBytes, &maps.v, pnl * kBackwardPanelCols, kb.h_kv, kb.key0, kb.b,
                &bars[Cfg::kKVFull]);
  }
  const int padded_rows = kb.n_q * Cfg::kBr;
  for (int step = 0; step < kb.n_steps; ++step) {
    const int stage = step % kStages;
    const std::uint64_t t0 = TL::now();
    mbar_wait(&bars[Cfg::kEmpty + stage], ((step / kStages) & 1) ^ 1);
    const std::uint64_t t1 = TL::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaIssue, t1);
    const int h = kb.head(step), row0 = kb.q_block(step) * Cfg::kBr;
    std::uint64_t* full = &bars[Cfg::kFull + stage];
    mbar_arrive_expect_tx(full, Cfg::kStepTxBytes);
#pragma unroll
    for (int pnl = 0; pnl < kPanels; ++pnl) {
      tma_load_4d(smem + Cfg::kQOffset + stage * Cfg::kQBytes + pnl * Cfg::kBr * kPanelRowBytes, &maps.q, pnl * kBackwardPanelCols, h,
                  row0, kb.b, full);
      tma_load_4d(smem + Cfg::kDOOffset + stage * Cfg::kQBytes + pnl * Cfg::kBr * kPanelRowBytes, &maps.d_o, pnl * kBackwardPanelCols,
                  h, row0, kb.b, full);
    }
    const std::int64_t stats = (std::int64_t(kb.b) * p.heads_q + h) * padded_rows + row0;
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + Cfg::kLOffset + stage * Cfg::kRowStatBytes,
                       p.lse_log2 + stats, Cfg::kRowStatBytes, full);
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + Cfg::kDiOffset + stage * Cfg::kRowStatBytes,
                       p.D_i + stats, Cfg::kRowStatBytes, full);
  }
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
