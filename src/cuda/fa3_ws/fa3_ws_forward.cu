// cuda-fa3-ws forward: FlashAttention-3's design (Shah et al., 2024) on Hopper (sm_90a), fp16/bf16 in,
// fp32 accumulation, O in the input dtype, LSE in fp32 (natural log).
//
// What changed from cuda-fa2 (mma.sync fed by ldmatrix, cp.async copies, 4 warps that each load,
// multiply and exponentiate), and why each change pays:
//  * TMA (cp.async.bulk.tensor): one elected thread moves a whole (rows, 64) panel per instruction,
//    with the 128-byte swizzle applied by the copy engine and zero-fill past the end of a sequence.
//    The registers and instructions cuda-fa2 spent on per-thread copy addresses (fa2_tile.cuh) are
//    gone, and the other threads never touch a load.
//  * wgmma: a warpgroup (4 warps) multiplies 64 x N x 16 per instruction, asynchronously, with the B
//    operand (and for S = Q K^T also A) read straight from shared memory through a descriptor: no
//    ldmatrix, no operand registers, and the tensor cores run while the issuing threads do other work.
//    O += P V takes P from the registers (the fp32 S accumulator re-packed to 16 bits, as in cuda-fa2)
//    and V as the transposed (MN-major) B operand.
//  * Producer / consumer warpgroups (ladder step 2): the producer only issues copies and keeps 24
//    registers (setmaxnreg.dec); the two consumers take 240 (setmaxnreg.inc), enough for O_i, S_ij and
//    P_ij of 64 rows each. mbarriers with full / empty phases replace __syncthreads.
//  * Ping-pong (step 3): the consumers take turns (named barriers) to issue their GEMMs, so one
//    warpgroup's softmax (exp2 on the multi-function units) runs while the other's GEMMs use the
//    tensor cores.
//  * Intra-warpgroup overlap (step 4): S_{i,j+1} = Q_i K_{j+1}^T and O_i += P_ij V_j are issued
//    together; the softmax of block j+1 runs while P_ij V_j is still on the tensor cores.
//  * Persistent grid (step 5): one block per SM takes tiles from a global counter (groups of heads that
//    share the L2, heaviest tiles first), and O_i has its own staging buffer, so the producer loads the
//    next tile's Q and K/V while the consumers finish the last tile's softmax, P V and epilogue.
//  * O_i is rescaled only when some row's running max rises by more than 2^8 (OnlineSoftmax::kMaxLag).
//  * Long keys (seq_k >= 2048) take wider K/V blocks at d = 64 and 128 (Bc = 192, 160: steps 2-5, not
//    with dropout), so the fixed cost of a trip around the K/V loop is spread over more keys
//    (HeadConfig).
// Parts, in file order: configuration, timeline hook, tile scheduler, producer (Loader), softmax
// (OnlineSoftmax: online_softmax / rescale / finalize), consumer (mainloop), epilogue, kernel,
// host launcher. Notation as the paper's: Q_i (Br, d), K_j and V_j (Bc, d), S_ij and P_ij (Br, Bc),
// running row max m_i and row sum l_i, O_i (Br, d), L_i = m_i + log l_i.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/host_checks.hpp"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "cuda/tilings.hpp"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3ws {
namespace {

constexpr float kLn2 = 0.6931471805599453f;
constexpr int kRowsPerConsumer = fa3_ws::kRowsPerConsumer;  // wgmma's M: each consumer warpgroup owns 64 query rows
constexpr int kProducerRegs = 24;     // TMA issue needs a handful of registers
constexpr int kConsumerRegs = 240;    // 128 * 24 + 256 * 240 = 64,512 <= 65,536 registers per SM
constexpr int kMaxSmemBytes = 227 * 1024;  // per-block opt-in shared memory on the H100
constexpr int kElemBytes = 2;              // fp16 / bf16
// Named hardware barriers (0 is __syncthreads): each consumer's own 128-thread barrier, and the
// ping-pong "my turn" barrier of each consumer (256 threads: 128 sync, 128 of the other arrive).
constexpr int kBarConsumerBase = 1;
constexpr int kBarTurnBase = 3;
constexpr int kBarOBufferBase = 5;  // the O buffer the consumers share at d = 256: "it is free for consumer c"

// ---- configuration -------------------------------------------------------------------------------------

// Candidate scheduling choices, one bit each of the kernel's kVar (the harness benches them side by side
// through launch_forward_variant; launch_forward runs kShippedVar):
//  * kVarTileOrderMFast: tiles numbered query block fastest within a (batch, head), so the blocks resident
//    at once share a few heads' K/V streams in L2 (the older order, heads fastest, spread the ~132
//    resident blocks over up to 132 heads: at N = 4k only ~2 blocks read each K/V stream).
//  * kVarKAhead: the producer issues K_{j+1} before V_j (the order the consumers use them: S_{i,j+1}
//    and P_ij V_j are issued together), instead of waiting V_j's empty slot before the next K.
//  * kVarStages3: three K/V stages at d = 128 (Q 32 KiB + 3 x 64 KiB = 224 KiB fits the 227 KiB), below
//    step 5, which spends that space on O_i's own buffer (HeadConfig).
//  * kVarWideBc: wider K/V blocks at d = 64 (192 keys) and d = 128 (160), fewer and longer trips around the
//    K/V loop. Not a candidate but a launch-time choice: the launcher takes it when seq_k >= kWideBcMinKeys.
constexpr int kVarTileOrderMFast = 1, kVarKAhead = 2, kVarStages3 = 4, kVarWideBc = 8;
constexpr int kShippedVar = kVarTileOrderMFast | kVarKAhead | kVarStages3;

// Per head dim: Bc, the number of K/V stages, and where O_i leaves. d = 256 takes Bc = 64 so that O_i (128
// fp32 registers per thread), S_ij (32) and P_ij (16, twice under intra-warpgroup overlap) fit in 240
// registers. d = 64 has shared memory for a third K/V stage; d = 128 too with kVarStages3 when O_i has no
// buffer of its own.
// Long keys (kVarWideBc) take wider K/V blocks at d = 64 and 128: Bc = 192 and 160. Every trip around the K/V
// loop pays fixed costs (barrier and mbarrier waits, the row max and sum shuffles, wgmma fences and
// waits) that a wider block spreads over more keys: on the H100, +5-8% at d = 128 and up to +12% at
// d = 64 from N = 4k on, but a loss below N = 2k, where the last block is mostly masked padding
// (bench/results/h100-fa3-ws-notes.md). 160 is the widest that leaves O_i's own buffer at d = 128 (Q 32 +
// 2 x (40 + 40) + O 32 = 224 KiB); 176 was no faster at step 4, and 256 spills at d = 64.
// Where O_i leaves: below step 5, through Q_i's space (Q_i is released after the epilogue). The persistent
// grid (step 5) gives O_i a buffer of its own, so that Q_i is released as soon as the tile's last S GEMM
// has read it and the producer loads the next tile's Q while the consumers finish this one: at d <= 128 a
// (Br, d) buffer (d = 128: Q 32 + O 32 + 2 x 64 KiB); at d = 256 one consumer's (64, d), which the two
// consumers take in turn (Q 64 + 2 x 64 + O 32 KiB = 224 KiB).
template <int D, int kVar, bool kPersistent>
struct HeadConfig {
  static constexpr int kBc = fa3_ws::block_cols(D, (kVar & kVarWideBc) != 0);  // cuda/tilings.hpp: what the traffic model reads
  // Rows of O_i's own buffer: 0 (through Q_i's space), Br (both consumers), or 64 (shared in turn).
  static constexpr int kORows = !kPersistent ? 0 : D <= 128 ? 2 * kRowsPerConsumer : kRowsPerConsumer;
  static constexpr bool kOBufferShared = kORows == kRowsPerConsumer;
  static constexpr int kStages = D == 64 || (D == 128 && kBc == 128 && (kVar & kVarStages3) != 0 && kORows == 0) ? 3 : 2;
};

// Per ladder step: which scheduling ideas are on, and the block shape that follows.
template <int kStep>
struct StepConfig {
  static constexpr bool kWarpSpecialized = kStep >= 2;
  static constexpr bool kPingPong = kStep >= 3;
  static constexpr bool kIntraOverlap = kStep >= 4;
  static constexpr bool kPersistent = kStep >= 5;
  static constexpr int kConsumers = kWarpSpecialized ? 2 : 1;
  static constexpr int kBr = kConsumers * kRowsPerConsumer;
  static constexpr int kThreads = (kConsumers + (kWarpSpecialized ? 1 : 0)) * kWarpgroupThreads;
};

// Shared memory: Q_i (Br, d), kStages x K_j (Bc, d), kStages x V_j (Bc, d), O_i's buffer (kORows, d) if any,
// each as 128B-swizzled 64-column panels; then the mbarriers and the tile slot (the persistent producer's
// word to the consumers: which tile Q_i belongs to).
template <int D, int kBr, int kBcIn, int kStagesIn, int kORowsIn>
struct SmemLayout {
  static constexpr int kBc = kBcIn, kStages = kStagesIn;
  static constexpr int kQBytes = kBr * D * kElemBytes;
  static constexpr int kKVBytes = kBc * D * kElemBytes;  // one K or V stage
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kOOffset = kORowsIn > 0 ? kVOffset + kStages * kKVBytes : kQOffset;
  static constexpr int kOPanelRows = kORowsIn > 0 ? kORowsIn : kBr;  // rows of a panel where O_i is staged
  static constexpr int kBarOffset = kVOffset + kStages * kKVBytes + kORowsIn * D * kElemBytes;
  // Barriers: Q full / empty, then K full, K empty, V full, V empty per stage.
  static constexpr int kQFull = 0, kQEmpty = 1, kKFull = 2, kKEmpty = kKFull + kStages, kVFull = kKEmpty + kStages,
                       kVEmpty = kVFull + kStages, kNumBarriers = kVEmpty + kStages;
  static constexpr int kTileSlotOffset = kBarOffset + kNumBarriers * 8;
  // The dynamic shared window is only 16-byte aligned: ask for one swizzle atom more and align up.
  static constexpr int kBytes = kTileSlotOffset + 8 + kSwizzleAtomBytes;
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kKVBytes % kSwizzleAtomBytes == 0, "tiles stay 1024-aligned");
  static_assert(kBytes <= kMaxSmemBytes, "Q, the K/V stages, O and the barriers must fit 227 KiB");
};

template <class T, int D, int kStep, int kVarIn>
struct KernelConfig : StepConfig<kStep>, HeadConfig<D, kVarIn, StepConfig<kStep>::kPersistent> {
  using Step = StepConfig<kStep>;
  using Head = HeadConfig<D, kVarIn, Step::kPersistent>;
  using Smem = SmemLayout<D, Step::kBr, Head::kBc, Head::kStages, Head::kORows>;
  // The shipped step is what cuda/tilings.hpp describes to the traffic model (fa3_ws::forward_tiling).
  static_assert(kStep != static_cast<int>(kShippedStep) ||
                    (Step::kBr == fa3_ws::forward_tiling(D, 0, false).Br &&
                     Step::kThreads == fa3_ws::forward_tiling(D, 0, false).warps * 32),
                "cuda/tilings.hpp describes the shipped step's block");
};

// ---- timeline hook (compiled in with FLASHLAB_FA3_TIMELINE) ---------------------------------------------

#ifdef FLASHLAB_FA3_TIMELINE
constexpr bool kTimelineCompiled = true;
#else
constexpr bool kTimelineCompiled = false;
#endif

// TimelineLane (fa3_ws/timeline_lane.cuh): what one recording thread writes, and where.
using flashlab::PipelineEvent;

// ---- tile scheduler ----------------------------------------------------------------------------------------

// A tile is Br query rows of one (batch, query head): (b, h) and the first row.
struct Tile {
  int b, h, h_kv, row0;
  int n_blocks;  // K/V blocks that hold a visible key for some row of the tile (never a fully masked one)
};

// Tile numbers, in the order the grid takes them. Within a (batch, head) the last query blocks come first:
// they see the most keys under a causal mask.
//  * One tile per block (steps 1-4): tile = blockIdx.x. With kVarTileOrderMFast the query blocks of one
//    (batch, head) are numbered in a row, so the blocks resident together share a few heads' K/V in L2;
//    else heads fastest.
//  * Persistent (step 5): tiles are handed out one at a time from a global counter (the producer fetches
//    the next number while it loads the current tile), so a block that drew light tiles under a causal mask
//    simply takes more of them. They are numbered in groups of p.heads_per_group heads, as many as have
//    their K and V fit in half the L2 (four times as many under a causal mask over long keys:
//    launch_config), and within a group heaviest query block first, heads fastest: the ~132 tiles in
//    flight read the K/V of a few heads, and the light tiles come last, where they fill the gaps of the
//    tail (longest processing time first). A static round-robin over a query-block-fastest order gave
//    some blocks only heavy tiles (step 5 causal fell from ~500 to ~360 TFLOP/s at N = 16k);
//    over a heads-fastest order it spread the blocks in flight over ~132 heads, whose K/V then came from
//    HBM each time (13-19% below step 4: bench/results/h100-fa3-ws-notes.md).
enum class TileOrder { HeadsFastest, MFast, L2Groups };

template <int kVar, bool kPersistent>
constexpr TileOrder tile_order() {
  if constexpr (kPersistent) return TileOrder::L2Groups;
  else return (kVar & kVarTileOrderMFast) != 0 ? TileOrder::MFast : TileOrder::HeadsFastest;
}

template <int kBr, int kBc, TileOrder kOrder>
__device__ __forceinline__ Tile make_tile(const Params& p, int t) {
  const int bh_total = p.batch * p.heads_q;
  const int num_m = (p.seq_q + kBr - 1) / kBr;
  int m_back = 0, bh = 0;  // query block counted from the last one; (batch, head)
  if constexpr (kOrder == TileOrder::MFast) {
    m_back = t % num_m;
    bh = t / num_m;
  } else if constexpr (kOrder == TileOrder::HeadsFastest) {
    m_back = t / bh_total;
    bh = t % bh_total;
  } else {
    const fa3_ws::TileAt at = fa3_ws::tile_at(t, num_m, bh_total, p.heads_per_group);  // cuda/tilings.hpp
    m_back = num_m - 1 - at.query_block;
    bh = at.bh;
  }
  Tile tile;
  tile.b = bh / p.heads_q;
  tile.h = bh % p.heads_q;
  tile.h_kv = tile.h / (p.heads_q / p.heads_kv);
  tile.row0 = (num_m - 1 - m_back) * kBr;
  const int last_row = min(tile.row0 + kBr, p.seq_q) - 1;
  const int last_key = last_visible_key(p.align, last_row, p.seq_q, p.seq_k);
  tile.n_blocks = last_key < 0 ? 0 : last_key / kBc + 1;
  return tile;
}

// The persistent grid's tile counter (p.tile_counter: the next tile to hand out beyond the first
// gridDim.x, and the blocks that have finished). The last block to finish sets both back to 0, so the
// next launch on the same counter starts from zero without a memset.
__device__ __forceinline__ int fetch_next_tile(const Params& p) {
  return atomicAdd(&p.tile_counter[0], 1) + static_cast<int>(gridDim.x);
}
__device__ __forceinline__ void finish_tiles(const Params& p) {
  if (atomicAdd(&p.tile_counter[1], 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(&p.tile_counter[0], 0);
    atomicExch(&p.tile_counter[1], 0);
  }
}

// ---- producer -------------------------------------------------------------------------------------------------

// Issues the TMA copies of a tile (one thread). Each copy first waits for its stage to be released
// (the empty barrier's previous phase), then announces its bytes on the full barrier.
template <class Cfg>
struct Loader {
  using Smem = typename Cfg::Smem;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kStages = Cfg::kStages;
  static constexpr int kPanels = Smem::kQBytes / (kBr * kPanelRowBytes);  // d / 64
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
      tma_load_4d(smem + Smem::kQOffset + pnl * kBr * kPanelRowBytes, &maps->q, pnl * kPanelCols, tile.h, tile.row0,
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
#pragma unroll
    for (int pnl = 0; pnl < kPanels; ++pnl)
      tma_load_4d(dst + pnl * kBc * kPanelRowBytes, map, pnl * kPanelCols, tile.h_kv, j * kBc, tile.b, &bars[full]);
  }
};

// ---- softmax ----------------------------------------------------------------------------------------------------

// The online softmax of one consumer thread's two rows (r = 16 warp + lane / 4 and r + 8 of its
// warpgroup's 64). A wgmma accumulator of 64 x N holds, per thread, d[4i + {0,1}] at row r, columns
// 8i + 2 (lane % 4) + {0,1}, and d[4i + {2,3}] at row r + 8: the four lanes of a quad share a row.
template <int kCols>
struct OnlineSoftmax {
  static constexpr int kN = kCols / 2;  // accumulator floats per thread
  float m[2];  // m_i: running max of scale * S_ij, in log2 units
  float l[2];  // l_i: this thread's part of the running row sum (quad-summed in finalize)

  __device__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  // The max a row exponentiates against may lag its true running max by up to this much (log2 units: P
  // entries up to 2^8 = 256, far inside fp32 sums and fp16 / bf16 P): O_i and l_i need rescaling only when
  // some row's max rises by more, which on most rows happens only in the first block or two.
  static constexpr float kMaxLag = 8.f;

  // S_ij (raw, masked entries = mask_val) -> unnormalized P_ij = exp2(scale_log2 S - m_i) in place; m_i,
  // l_i updated; corr = exp2(m_old - m_new), the factor O_i must be rescaled by (1 for a row whose m_i did
  // not move). m_i moves only when the block's scaled max exceeds it by more than kMaxLag (or it was -inf).
  // Returns whether O_i needs the rescale: some row of this warp has corr != 1 (the same answer in every
  // lane, so the branch on it does not diverge). The scale is folded into one FFMA per element. For a
  // negative scale the row's largest scaled score is its smallest raw one (mask_val is +inf then).
  __device__ bool online_softmax(float (&s)[kN], float scale_log2, float (&corr)[2]) {
    const bool positive = scale_log2 >= 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float raw = s[2 * hf];
      if (positive) {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) raw = fmaxf(raw, fmaxf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      } else {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) raw = fminf(raw, fminf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        raw = fminf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raw = fminf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      }
      const bool all_masked = positive ? raw == -INFINITY : raw == INFINITY;
      const float block_max = all_masked ? -INFINITY : raw * scale_log2;
      const bool moves = block_max > m[hf] + kMaxLag;  // -inf + kMaxLag = -inf: the first visible key moves it
      const float m_new = moves ? block_max : m[hf];
      // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so exp2 gives 0, not NaN.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[hf] = moves ? fast_exp2(m[hf] - m_use) : 1.f;
      m[hf] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kN / 4; ++i) {
        s[4 * i + 2 * hf] = fast_exp2(fmaf(s[4 * i + 2 * hf], scale_log2, -m_use));
        s[4 * i + 2 * hf + 1] = fast_exp2(fmaf(s[4 * i + 2 * hf + 1], scale_log2, -m_use));
        sum += s[4 * i + 2 * hf] + s[4 * i + 2 * hf + 1];
      }
      l[hf] = l[hf] * corr[hf] + sum;
    }
    return __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f);
  }

  // O_i = diag(corr) O_i (D/2 FMULs per thread), when online_softmax says some row of the warp needs it.
  // Done unconditionally it was the largest non-GEMM cost per K/V block at d = 256 (128 FMULs against 32
  // exponentials), and the branch sits after the P V wait, not between the softmax and a GEMM issue.
  template <int kOut>
  __device__ static void rescale(float (&o)[kOut], const float (&corr)[2]) {
#pragma unroll
    for (int i = 0; i < kOut / 4; ++i) {
      o[4 * i] *= corr[0];
      o[4 * i + 1] *= corr[0];
      o[4 * i + 2] *= corr[1];
      o[4 * i + 3] *= corr[1];
    }
  }

  // 1 / l_i (0 for a row that saw no key: O = 0) and L_i = (m_i + log2 l_i) ln 2 (-inf for such a row).
  __device__ void finalize(float (&inv_l)[2], float (&lse)[2]) const {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv_l[hf] = sum > 0.f ? 1.f / sum : 0.f;
      lse[hf] = sum > 0.f ? (m[hf] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
};

// ---- consumer ---------------------------------------------------------------------------------------------------

template <class T, int D, int kStep, bool kDropout, bool kTimeline, int kVar>
struct Consumer {
  using Cfg = KernelConfig<T, D, kStep, kVar>;
  using Smem = typename Cfg::Smem;
  using TL = TimelineLane<kTimeline>;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kStages = Cfg::kStages;
  static constexpr int kNS = kBc / 2;   // S_ij accumulator floats per thread: (64, Bc)
  static constexpr int kNO = D / 2;     // O_i accumulator floats per thread: (64, d)
  static constexpr int kKSteps = kBc / 16;  // k-steps of P_ij V_j

  const Params& p;
  const Loader<Cfg>* loader;  // used by ladder step 1 only (no producer warpgroup)
  unsigned char* smem;
  std::uint64_t* bars;
  int c;    // consumer index: rows 64 c .. 64 c + 63 of the tile
  int wg;   // warpgroup index in the block (for the timeline)
  int tid;  // thread index within the warpgroup
  int warp, g, t;  // warp in the warpgroup, lane / 4, lane % 4
  mutable TL tl{};  // this warpgroup's timeline lane (thread 0 records)

  __device__ std::uint32_t q_addr() const { return smem_u32(smem + Smem::kQOffset) + c * kRowsPerConsumer * kPanelRowBytes; }
  __device__ std::uint32_t k_addr(int stage) const { return smem_u32(smem + Smem::kKOffset + stage * Smem::kKVBytes); }
  __device__ std::uint32_t v_addr(int stage) const { return smem_u32(smem + Smem::kVOffset + stage * Smem::kKVBytes); }
  __device__ bool issues_loads() const { return !Cfg::kWarpSpecialized && tid == 0; }

  // Ping-pong: wait for this consumer's turn / hand the turn to the other one.
  __device__ void turn_wait() const {
    if constexpr (Cfg::kPingPong) {
      const std::uint64_t t0 = TL::now();
      named_barrier_sync(kBarTurnBase + c, 2 * kWarpgroupThreads);
      tl.waited(p, t0, TL::now());
    }
  }
  __device__ void turn_pass() const {
    if constexpr (Cfg::kPingPong) named_barrier_arrive(kBarTurnBase + (1 - c), 2 * kWarpgroupThreads);
  }
  __device__ void wait_full(int bar, std::uint32_t phase) const {
    const std::uint64_t t0 = TL::now();
    mbar_wait(&bars[bar], phase);
    const std::uint64_t t1 = TL::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaLanded, t1);
  }
  // One arrival per consumer warp (the empty barriers count 4 per consumer), after its wgmma's waited.
  __device__ void release(int bar) const {
    __syncwarp();
    if (tid % 32 == 0) mbar_arrive(&bars[bar]);
  }
  // Q_i's space is free once the tile's last S GEMM has read it, when O_i has a buffer of its own (else
  // the epilogue releases it, after O_i has gone out through it).
  __device__ void release_q_after_last_s() const {
    if constexpr (Cfg::kORows > 0) release(Smem::kQEmpty);
  }

  // S_ij = Q_i K_j^T  // (64, Bc) per consumer; both operands K-major in shared memory.
  __device__ void issue_s(float (&s)[kNS], int stage) const {
    // Opaque bases: the 2 D / 16 descriptors are recomputed at each issue instead of being hoisted out of
    // the K/V loop and held live (d = 256 step 5: 232 -> 136 bytes spilled; with tid opaque too: 0).
    const std::uint32_t qa = opaque(q_addr()), ka = opaque(k_addr(stage));
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<T, kBc>(s, desc_k_major(qa, kBr, kk), desc_k_major(ka, kBc, kk), kk > 0 ? 1 : 0);
  }
  // O_i += P_ij V_j  // (64, d) += (64, Bc) (Bc, d); P_ij from registers, V_j MN-major in shared memory.
  __device__ void issue_pv(float (&o)[kNO], const std::uint32_t (&pf)[kKSteps][4], int stage) const {
    const std::uint32_t va = opaque(v_addr(stage));
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) wgmma_rs<T, D>(o, pf[ks], desc_mn_major(va, kBc, ks), 1);
  }

  // Rows of this thread (half hf): tile row0 + 64 c + 16 warp + g + 8 hf.
  __device__ int row_of(const Tile& tile, int hf) const { return tile.row0 + c * kRowsPerConsumer + 16 * warp + g + 8 * hf; }

  // Mask (only tiles crossing the diagonal or the end of the keys), online softmax, dropout, and P_ij
  // packed as the A fragments of the next GEMM: k-step ks is S columns 16 ks .. 16 ks + 15, i.e.
  // accumulator n-tiles 2 ks and 2 ks + 1, which is exactly m16n8k16's A layout per warp.
  // Returns whether O_i needs rescaling (OnlineSoftmax::online_softmax).
  __device__ bool softmax_block(float (&s)[kNS], const Tile& tile, int j, OnlineSoftmax<kBc>& sm, float (&corr)[2]) const {
    const std::uint64_t t0 = TL::now();
    const int col0 = j * kBc;
    const float mask_val = p.scale_log2 >= 0.f ? -INFINITY : INFINITY;
    const int row_lo = tile.row0 + c * kRowsPerConsumer;
    if (tile_needs_mask(p.align, row_lo, col0 + kBc, p.seq_q, p.seq_k)) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        // Columns of this thread are col0 + 8 i + 2 t + e: compare with the tile-relative limit.
        const int last = last_visible_key(p.align, row_of(tile, hf), p.seq_q, p.seq_k) - col0 - 2 * t;
#pragma unroll
        for (int i = 0; i < kNS / 4; ++i) {
          if (8 * i > last) s[4 * i + 2 * hf] = mask_val;
          if (8 * i + 1 > last) s[4 * i + 2 * hf + 1] = mask_val;
        }
      }
    }
    const bool needs_rescale = sm.online_softmax(s, p.scale_log2, corr);
    // Dropout acts on P_ij after its row sum (l_i normalizes the undropped softmax): keep / (1 - p).
    // The keep bits are drawn first, one Philox call at a time in a rolled loop (bit 2 i + e of
    // keep[hf] is column col0 + 8 i + 2 t + e), then applied with constant shifts: unrolled, the
    // calls' temporaries were live at once and spilled beside S_ij, O_i and P_ij (ptxas -v).
    if constexpr (kDropout) {
      std::uint32_t keep[2] = {0u, 0u};
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = row_of(tile, hf);
#pragma unroll 1
        for (int i = 0; i < kNS / 4; ++i) {
          // Columns col0 + 8 i + 2 t + {0, 1} are draws 2 (t % 2) + {0, 1} of group (col0 + 8 i + 2 t) / 4.
          const Philox4 r = dropout_draws4(p.seed, tile.b, tile.h, row, (col0 + 8 * i + 2 * t) >> 2);
          const std::uint32_t u0 = (t & 1) ? r.x[2] : r.x[0], u1 = (t & 1) ? r.x[3] : r.x[1];
          keep[hf] |= (static_cast<std::uint32_t>(u0 >= p.drop_threshold) | (static_cast<std::uint32_t>(u1 >= p.drop_threshold) << 1))
                      << (2 * i);
        }
      }
      static_assert(kNS / 2 <= 32, "two keep bits per n-tile fit one word per row");
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
#pragma unroll
        for (int i = 0; i < kNS / 4; ++i) {
          s[4 * i + 2 * hf] *= (keep[hf] >> (2 * i)) & 1u ? p.drop_rescale : 0.f;
          s[4 * i + 2 * hf + 1] *= (keep[hf] >> (2 * i + 1)) & 1u ? p.drop_rescale : 0.f;
        }
    }
    tl.span(p, PipelineEvent::Softmax, t0);
    return needs_rescale;
  }
  // P_ij (fp32, in S_ij's registers) -> the A fragments of P_ij V_j. Under intra-warpgroup overlap this
  // runs only after the previous P V has been waited: packed while that GEMM was in flight (into a second
  // array copied over at the loop's end), ptxas coalesced the copy away, so the packing defined the
  // running wgmma's A registers and ptxas serialized every wgmma of the kernel (C7513). An empty asm
  // "use" after the wait does not prevent that: it emits no PTX, so ptxas never sees it.
  __device__ static void pack_p(const float (&s)[kNS], std::uint32_t (&pf)[kKSteps][4]) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      pf[ks][0] = pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
      pf[ks][1] = pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
      pf[ks][2] = pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
      pf[ks][3] = pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
    }
  }

  // The K/V loop of one tile: block 0's S first, then per block j >= 1 S_ij and P_{i,j-1} V_{j-1}
  // issued together, then the last P V. `kv_iter` numbers the tile's first K/V block in the pipeline.
  __device__ void mainloop(const Tile& tile, std::uint32_t kv_iter, float (&o)[kNO], OnlineSoftmax<kBc>& sm) const {
    const int n = tile.n_blocks;
    auto stage_of = [&](int j) { return static_cast<int>((kv_iter + j) % kStages); };
    auto phase_of = [&](int j) { return ((kv_iter + j) / kStages) & 1u; };
    // S_ij is declared afresh per block (never carried around the loop): carried, NVVM gave the masked /
    // exponentiated values the S accumulator's own PTX registers, written while P V was still in flight,
    // and ptxas serialized every wgmma of the kernel (C7513). Its first k-step overwrites (scale_d = 0).
    std::uint32_t pf[kKSteps][4];   // P_ij as A fragments  // (64, Bc) in T
    float corr[2];

    // Block 0: S_i0 = Q_i K_0^T.
    wait_full(Smem::kKFull + stage_of(0), phase_of(0));
    turn_wait();
    std::uint64_t t0 = TL::now();
    float s[kNS];  // S_i0  // (64, Bc)
    wgmma_fence();
    issue_s(s, stage_of(0));
    wgmma_commit_group();
    tl.instant(p, PipelineEvent::WgmmaIssue, t0);
    turn_pass();
    t0 = TL::now();
    wgmma_wait_group<0>();
    reg_fence(s);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    release(Smem::kKEmpty + stage_of(0));
    if (n == 1) release_q_after_last_s();
    (void)softmax_block(s, tile, 0, sm, corr);  // O_i is still 0: no rescale
    pack_p(s, pf);

    for (int j = 1; j < n; ++j) {
      if (issues_loads() && j + kStages - 1 < n) loader->template load_kv<true>(tile, j + kStages - 1, kv_iter + j + kStages - 1, tl, p);
      wait_full(Smem::kKFull + stage_of(j), phase_of(j));
      wait_full(Smem::kVFull + stage_of(j - 1), phase_of(j - 1));
      turn_wait();
      t0 = TL::now();
      float s[kNS];  // S_ij  // (64, Bc)
      reg_fence(o);
      reg_fence(pf);
      wgmma_fence();
      issue_s(s, stage_of(j));
      wgmma_commit_group();
      issue_pv(o, pf, stage_of(j - 1));
      wgmma_commit_group();
      tl.instant(p, PipelineEvent::WgmmaIssue, t0);
      turn_pass();
      if constexpr (Cfg::kIntraOverlap) {
        // S_ij has landed; P_{i,j-1} V_{j-1} may still run while the softmax of block j does (in place,
        // fp32); P_ij is packed only once that GEMM is done (pack_p says why).
        t0 = TL::now();
        wgmma_wait_group<1>();
        reg_fence(s);
        tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
        release(Smem::kKEmpty + stage_of(j));
        if (j == n - 1) release_q_after_last_s();
        const bool needs_rescale = softmax_block(s, tile, j, sm, corr);
        t0 = TL::now();
        wgmma_wait_group<0>();
        reg_fence(o);
        tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
        release(Smem::kVEmpty + stage_of(j - 1));
        if (issues_loads() && j + kStages - 1 < n) loader->template load_kv<false>(tile, j + kStages - 1, kv_iter + j + kStages - 1, tl, p);
        pack_p(s, pf);
        // The dropout kernels rescale every block: the predicate kept live beside the keep bits spilled
        // 4 bytes at d = 128 (ptxas -v), and dropout is checked for correctness, not raced.
        if (kDropout || needs_rescale) OnlineSoftmax<kBc>::rescale(o, corr);
      } else {
        t0 = TL::now();
        wgmma_wait_group<0>();
        reg_fence(s);
        reg_fence(o);
        reg_fence(pf);
        tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
        release(Smem::kKEmpty + stage_of(j));
        release(Smem::kVEmpty + stage_of(j - 1));
        if (j == n - 1) release_q_after_last_s();
        if (issues_loads() && j + kStages - 1 < n) loader->template load_kv<false>(tile, j + kStages - 1, kv_iter + j + kStages - 1, tl, p);
        const bool needs_rescale = softmax_block(s, tile, j, sm, corr);
        pack_p(s, pf);
        if (needs_rescale) OnlineSoftmax<kBc>::rescale(o, corr);
      }
    }

    // The last P_{i,n-1} V_{n-1}.
    wait_full(Smem::kVFull + stage_of(n - 1), phase_of(n - 1));
    turn_wait();
    reg_fence(o);
    reg_fence(pf);
    wgmma_fence();
    issue_pv(o, pf, stage_of(n - 1));
    wgmma_commit_group();
    turn_pass();
    t0 = TL::now();
    wgmma_wait_group<0>();
    reg_fence(o);
    reg_fence(pf);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    release(Smem::kVEmpty + stage_of(n - 1));
  }

  // ---- epilogue ----
  // O_i = diag(l_i)^-1 O_i -> T, through this consumer's rows of O_i's (swizzled) staging space (its own
  // buffer, the buffer the consumers share in turn, or Q_i's), then 16-byte coalesced stores with a row
  // guard; L_i straight from the registers. Releases Q_i's space last when O_i went out through it.
  __device__ void epilogue(const Tile& tile, float (&o)[kNO], const OnlineSoftmax<kBc>& sm) const {
    const std::uint64_t t0 = TL::now();
    float inv_l[2], lse[2];
    sm.finalize(inv_l, lse);
    unsigned char* os = smem + Smem::kOOffset;
    // Staging row of this consumer's first row: its own 64 rows of a (Br, d) space, or the shared (64, d) one.
    const int stage_row0 = Cfg::kOBufferShared ? 0 : c * kRowsPerConsumer;
    if constexpr (Cfg::kOBufferShared) {  // wait until the other consumer has read its O out of the buffer
      const std::uint64_t tw = TL::now();
      named_barrier_sync(kBarOBufferBase + c, 2 * kWarpgroupThreads);
      tl.waited(p, tw, TL::now());
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = stage_row0 + 16 * warp + g + 8 * hf;  // staging row
#pragma unroll
      for (int i = 0; i < kNO / 4; ++i)
        *reinterpret_cast<std::uint32_t*>(os + swizzle128_offset(r, 8 * i + 2 * t, Smem::kOPanelRows)) =
            pack2<T>(o[4 * i + 2 * hf] * inv_l[hf], o[4 * i + 2 * hf + 1] * inv_l[hf]);
      const int row = row_of(tile, hf);
      if (t == 0 && row < p.seq_q)
        p.lse[(static_cast<std::int64_t>(tile.b) * p.heads_q + tile.h) * p.seq_q + row] = lse[hf];
    }
    named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);
    constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
    T* o_base = static_cast<T*>(p.o);
#pragma unroll
    for (int idx = tid; idx < kRowsPerConsumer * kChunksPerRow; idx += kWarpgroupThreads) {
      const int r = idx / kChunksPerRow, ch = idx % kChunksPerRow;
      const int row = tile.row0 + c * kRowsPerConsumer + r;
      if (row < p.seq_q) {
        const uint4 v = *reinterpret_cast<const uint4*>(os + swizzle128_offset(stage_row0 + r, ch * 8, Smem::kOPanelRows));
        const std::int64_t off = ((static_cast<std::int64_t>(tile.b) * p.seq_q + row) * p.heads_q + tile.h) * D + ch * 8;
        *reinterpret_cast<uint4*>(o_base + off) = v;
      }
    }
    named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);  // every read of O_i's space is done
    if constexpr (Cfg::kORows == 0) release(Smem::kQEmpty);
    if constexpr (Cfg::kOBufferShared) named_barrier_arrive(kBarOBufferBase + (1 - c), 2 * kWarpgroupThreads);
    tl.span(p, PipelineEvent::Epilogue, t0);
  }

  // One tile: its K/V loop, then the epilogue. Q_i has landed; `kv_iter` numbers its first K/V block.
  __device__ void run_tile(const Tile& tile, std::uint32_t kv_iter) const {
    float o[kNO];  // O_i  // (64, d) per consumer, unnormalized
#pragma unroll
    for (int i = 0; i < kNO; ++i) o[i] = 0.f;
    OnlineSoftmax<kBc> sm;
    sm.init();
    if (tile.n_blocks > 0) mainloop(tile, kv_iter, o, sm);
    else release_q_after_last_s();  // no S GEMM reads Q_i
    epilogue(tile, o, sm);
  }

  // Every tile of this block: one (blockIdx.x) below step 5; at step 5, each tile the producer announces
  // in the tile slot with Q_i, until it announces total_tiles (no more).
  __device__ void run(int total_tiles) const {
    if constexpr (Cfg::kPingPong) {
      if (c == 1) turn_pass();  // consumer 0 goes first
    }
    if constexpr (Cfg::kOBufferShared) {
      if (c == 1) named_barrier_arrive(kBarOBufferBase, 2 * kWarpgroupThreads);  // and takes the O buffer first
    }
    if constexpr (Cfg::kPersistent) {
      std::uint32_t kv_iter = 0;
      for (std::uint32_t tile_iter = 0;; ++tile_iter) {
        const std::uint64_t t0 = TL::now();
        mbar_wait(&bars[Smem::kQFull], tile_iter & 1);
        const std::uint64_t t1 = TL::now();
        const int ti = *reinterpret_cast<volatile const int*>(smem + Smem::kTileSlotOffset);
        if (ti >= total_tiles) break;  // the producer's "no more tiles": no Q landed, nothing to record
        tl.waited(p, t0, t1);
        tl.instant(p, PipelineEvent::TmaLanded, t1);
        const Tile tile = make_tile<kBr, kBc, tile_order<kVar, true>()>(p, ti);
        // The per-thread shared-memory addresses and fragment coordinates are the same for every tile, and
        // hoisted out of this loop they stayed live across it (64 epilogue offsets, the descriptors) and
        // spilled 68 bytes at d = 128. Passing them through an opaque move per tile keeps them where they
        // are used (d = 128: no spill; d = 256: tid too, with the opaque descriptor bases: no spill).
        Consumer self = *this;
        self.smem = opaque(smem);
        self.bars = opaque(bars);
        self.warp = opaque(warp);
        self.g = opaque(g);
        self.t = opaque(t);
        self.c = opaque(c);
        self.tid = opaque(tid);
        self.run_tile(tile, kv_iter);
        kv_iter += tile.n_blocks;
        tl = self.tl;  // the timeline lane's slot state goes on to the next tile
      }
    } else {
      const Tile tile = make_tile<kBr, kBc, tile_order<kVar, false>()>(p, static_cast<int>(blockIdx.x));
      if (issues_loads()) {  // ladder step 1: this warpgroup is its own producer
        loader->load_q(tile, 0, tl, p);
        for (int j = 0; j < kStages && j < tile.n_blocks; ++j) {
          loader->template load_kv<true>(tile, j, j, tl, p);
          loader->template load_kv<false>(tile, j, j, tl, p);
        }
      }
      wait_full(Smem::kQFull, 0);  // also when n = 0: O_i may go out through Q_i's space
      run_tile(tile, 0);
    }
  }
};

// ---- kernel ------------------------------------------------------------------------------------------------------

template <class T, int D, int kStep, bool kDropout, bool kTimeline, int kVar = kShippedVar>
__global__ void __launch_bounds__(StepConfig<kStep>::kThreads, 1)
    fa3_ws_kernel(const __grid_constant__ Params p, const __grid_constant__ TmaMaps maps, int total_tiles) {
  using Cfg = KernelConfig<T, D, kStep, kVar>;
  using Smem = typename Cfg::Smem;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - smem_u32(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + Smem::kBarOffset);
  if (threadIdx.x == 0) {
    mbar_init(&bars[Smem::kQFull], 1);
    mbar_init(&bars[Smem::kQEmpty], Cfg::kConsumers * 4);  // one arrival per consumer warp
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&bars[Smem::kKFull + s], 1);
      mbar_init(&bars[Smem::kVFull + s], 1);
      mbar_init(&bars[Smem::kKEmpty + s], Cfg::kConsumers * 4);  // one arrival per consumer warp
      mbar_init(&bars[Smem::kVEmpty + s], Cfg::kConsumers * 4);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const Loader<Cfg> loader{&maps, smem, bars};
  const int wg = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int tid = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int lane = tid % 32;
  if constexpr (Cfg::kWarpSpecialized) {
    if (wg == 0) {
      // ---- producer: one elected thread of warp 0 issues every copy; warps 1-3 only give back registers.
      setmaxnreg_dec<kProducerRegs>();
      if (tid / 32 == 0 && elect_one()) {
        TimelineLane<kTimeline> tl;
        tl.start(p, true);
        // The K/V blocks of one tile, in the order the consumers take them.
        auto load_tile_kv = [&](const Tile& tile, std::uint32_t kv_iter, bool k0_issued) {
          const int n = tile.n_blocks;
          if constexpr ((kVar & kVarKAhead) != 0) {
            // K one block ahead of V: K_0, K_1, V_0, K_2, V_1, ... (the consumers take K_{j+1} with V_j).
            if (n > 0 && !k0_issued) loader.template load_kv<true>(tile, 0, kv_iter, tl, p);
            for (int j = 0; j < n; ++j) {
              if (j + 1 < n) loader.template load_kv<true>(tile, j + 1, kv_iter + j + 1, tl, p);
              loader.template load_kv<false>(tile, j, kv_iter + j, tl, p);
            }
          } else {
            for (int j = 0; j < n; ++j) {
              if (j > 0 || !k0_issued) loader.template load_kv<true>(tile, j, kv_iter + j, tl, p);
              loader.template load_kv<false>(tile, j, kv_iter + j, tl, p);
            }
          }
        };
        if constexpr (Cfg::kPersistent) {
          volatile int* tile_slot = reinterpret_cast<volatile int*>(smem + Smem::kTileSlotOffset);
          std::uint32_t kv_iter = 0;
          int ti = static_cast<int>(blockIdx.x);  // the first tiles go one per block; the rest from the counter
          for (std::uint32_t tile_iter = 0;; ++tile_iter) {
            if (ti >= total_tiles) {  // no more tiles: tell the consumers through the slot, with no Q
              loader.wait_q_empty(tile_iter, tl, p);
              *tile_slot = total_tiles;
              mbar_arrive(&bars[Smem::kQFull]);
              break;
            }
            const Tile tile = make_tile<Cfg::kBr, Cfg::kBc, tile_order<kVar, true>()>(p, ti);
            const int next = fetch_next_tile(p);  // in flight while this tile's copies are issued
            // When O_i leaves through Q_i's space, Q_i waits for the last tile's epilogue: K_0 goes first.
            const bool k0_first = Cfg::kORows == 0 && tile_iter > 0 && tile.n_blocks > 0;
            if (k0_first) loader.template load_kv<true>(tile, 0, kv_iter, tl, p);
            loader.wait_q_empty(tile_iter, tl, p);
            *tile_slot = ti;  // published by Q_i's full barrier (its arrive releases, the consumers' wait acquires)
            loader.issue_q(tile, tl, p);
            load_tile_kv(tile, kv_iter, k0_first);
            kv_iter += tile.n_blocks;
            ti = next;
          }
          finish_tiles(p);
        } else {
          const Tile tile = make_tile<Cfg::kBr, Cfg::kBc, tile_order<kVar, false>()>(p, static_cast<int>(blockIdx.x));
          loader.load_q(tile, 0, tl, p);
          load_tile_kv(tile, 0, false);
        }
      }
    } else {
      // ---- consumers
      setmaxnreg_inc<kConsumerRegs>();
      const Consumer<T, D, kStep, kDropout, kTimeline, kVar> consumer{p, &loader, smem, bars, wg - 1, wg, tid, tid / 32, lane / 4, lane % 4};
      consumer.tl.start(p, tid == 0);
      consumer.run(total_tiles);
    }
  } else {
    const Consumer<T, D, kStep, kDropout, kTimeline, kVar> consumer{p, &loader, smem, bars, 0, wg, tid, tid / 32, lane / 4, lane % 4};
    consumer.tl.start(p, tid == 0);
    consumer.run(total_tiles);
  }
}

#ifndef FLASHLAB_FA3_NO_LAUNCHER  // tools/fa3_harness/one_kernel.sh compiles one kernel without it
// ---- host launcher -----------------------------------------------------------------------------------------------
// This file is compiled as up to three objects, each with its own entry point and only the kernels that
// entry launches:
//  * as shipped (src/cuda/CMakeLists.txt, flashlab_cuda_fa3_ws): launch_forward, make_bshd_tensor_map,
//    block_rows; 76 kernels (2 dtypes x (5 ladder steps x 3 head dims, with and without dropout, and
//    steps 2-5 with the wide K/V blocks of d = 64 and 128));
//  * with FLASHLAB_FA3_TIMELINE_ENTRY (flashlab_cuda_fa3_ws_timeline): launch_forward_timeline only, the
//    recording build behind `flashlab bench --timeline`; 46 kernels (the same without dropout);
//  * with FLASHLAB_FA3_VARIANT_ENTRY (tools/fa3_harness only): launch_forward_variant, the candidate builds.
// The two extra objects link beside the shipped one and use its make_bshd_tensor_map.
#if defined(FLASHLAB_FA3_TIMELINE_ENTRY) && defined(FLASHLAB_FA3_VARIANT_ENTRY)
#error "FLASHLAB_FA3_TIMELINE_ENTRY and FLASHLAB_FA3_VARIANT_ENTRY build two different objects: define one of them"
#endif


#if !defined(FLASHLAB_FA3_VARIANT_ENTRY) && !defined(FLASHLAB_FA3_TIMELINE_ENTRY)
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, fetched once through the runtime (no link against libcuda).
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    constexpr unsigned kDriverApiVersion = 12000;  // the cuTensorMapEncodeTiled ABI since CUDA 12.0
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, kDriverApiVersion, cudaEnableDefault, &status),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw std::runtime_error("cuda-fa3-ws: the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}
#endif

template <class F, std::size_t... I>
bool dispatch_head_dim_impl(int head_dim, F&& f, std::index_sequence<I...>) {
  return ((head_dim == kHeadDims[I] ? (f.template operator()<kHeadDims[I]>(), true) : false) || ...);
}
// Calls f.template operator()<D>() for the D in kHeadDims equal to head_dim; throws for any other.
template <class F>
void dispatch_head_dim(int head_dim, F&& f) {
  if (!dispatch_head_dim_impl(head_dim, f, std::make_index_sequence<std::size(kHeadDims)>{})) {
    std::string dims;
    for (std::size_t i = 0; i < std::size(kHeadDims); ++i)
      dims += (i == 0 ? "" : i + 1 == std::size(kHeadDims) ? " and " : ", ") + std::to_string(kHeadDims[i]);
    throw std::invalid_argument("cuda-fa3-ws supports head dims " + dims + ", not " + std::to_string(head_dim) + ".");
  }
}
template <class F, std::size_t... I>
bool dispatch_step_impl(int step, F&& f, std::index_sequence<I...>) {
  return ((step == static_cast<int>(I) + 1 ? (f.template operator()<static_cast<int>(I) + 1>(), true) : false) || ...);
}
// Calls f.template operator()<kStep>() for the ladder step (1..5).
template <class F>
void dispatch_step(LadderStep step, F&& f) {
  if (!dispatch_step_impl(static_cast<int>(step), f, std::make_index_sequence<kLadderSteps>{}))
    throw std::invalid_argument("cuda-fa3-ws ladder steps are 1 to 5, not " + std::to_string(static_cast<int>(step)) + ".");
}


template <class T, int D, int kStep, bool kDropout, bool kTimeline = kTimelineCompiled, int kVar = kShippedVar>
void launch_config(DType dtype, const Params& p, cudaStream_t stream) {
  using Cfg = KernelConfig<T, D, kStep, kVar>;
  TmaMaps maps;
  maps.q = make_bshd_tensor_map(p.q, dtype, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.k = make_bshd_tensor_map(p.k, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  maps.v = make_bshd_tensor_map(p.v, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  auto kernel = fa3_ws_kernel<T, D, kStep, kDropout, kTimeline, kVar>;
  constexpr int kSmem = Cfg::Smem::kBytes;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const long long total = static_cast<long long>((p.seq_q + Cfg::kBr - 1) / Cfg::kBr) * p.batch * p.heads_q;
  if (total > 0x7fffffffLL) throw std::invalid_argument("cuda-fa3-ws: more than 2^31 - 1 tiles");
  int grid = static_cast<int>(total);
  Params params = p;
  if constexpr (Cfg::kPersistent) {
    if (p.tile_counter == nullptr) throw std::invalid_argument("cuda-fa3-ws step 5 needs Params::tile_counter (two zeroed ints on the device)");
    int dev = 0, sms = 0, l2_bytes = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
    check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute(L2 size)");
    grid = grid < sms ? grid : sms;
    // Heads per group of the tile order (cuda/tilings.hpp): as many KV heads as have K and V fit in half
    // the L2 (the H100's L2 is two partitions), times the query heads that share each. Under a causal mask
    // over 4096 keys or more, four times as many: measured on the H100 (fa3_harness --hpg,
    // bench/results/h100-fa3-ws-notes.md), larger groups ran 7-23% faster there at d = 128 and 256, but
    // 15-20% slower below 4096 keys, and even or slower without a mask. Why is not pinned down yet (no
    // counters taken on it). A positive Params::heads_per_group is taken as given (the harness sweeps it).
    const Shape shape{.batch = p.batch, .heads_q = p.heads_q, .heads_kv = p.heads_kv, .seq_q = p.seq_q,
                      .seq_k = p.seq_k, .head_dim = D};
    if (p.heads_per_group <= 0)
      params.heads_per_group = fa3_ws::heads_per_group(l2_bytes, shape, kElemBytes, p.align != CausalAlign::None);
  }
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(params, maps, static_cast<int>(total));
  check_cuda(cudaGetLastError(), "the kernel launch");
}

// The choices that ship without dropout, for this problem: kShippedVar, with wider K/V blocks for long keys
// at d = 64 and 128 (HeadConfig says why) from step 2 on. Step 1's block is one warpgroup: with the narrow
// blocks two fit an SM at d = 64 (104 KiB each), with the wide ones only one (152 KiB), and step 1 lost a
// third of its speed there (H100, N >= 2k).
template <int D, int kStep, class F>
void with_shipped_var(const Params& p, F&& launch) {
  if (fa3_ws::takes_wide_blocks(D, p.seq_k, false, kStep)) launch.template operator()<kShippedVar | kVarWideBc>();
  else launch.template operator()<kShippedVar>();
}

// What every entry checks before it touches the GPU: the dtype and the head dim; then the GPU.
void check_launch(DType dtype, const Params& p) {
  if (dtype != DType::F16 && dtype != DType::BF16) throw std::invalid_argument("cuda-fa3-ws takes f16 or bf16 inputs.");
  int checked_dim = 0;
  dispatch_head_dim(p.head_dim, [&]<int D>() { checked_dim = D; });  // rejects an unsupported head dim
  (void)checked_dim;
  require_hopper();
}

#endif  // FLASHLAB_FA3_NO_LAUNCHER
}  // namespace
#if !defined(FLASHLAB_FA3_NO_LAUNCHER) && defined(FLASHLAB_FA3_VARIANT_ENTRY)
// Harness-only entry (tools/fa3_harness builds this file a second time with FLASHLAB_FA3_VARIANT_ENTRY, so
// the shipped object does not carry these kernels): ladder step `step` with the candidate bits `var`
// (kVar* above). Variants are built for steps 2-5 without dropout: var 0 (the previous pass's kernel),
// kVarTileOrderMFast, and at d = 128 kVarTileOrderMFast | kVarKAhead. Returns false for a combination that
// is not built. (The timeline build is launch_forward_timeline, an object of the library.)
bool launch_forward_variant(DType dtype, const Params& p, cudaStream_t stream, LadderStep step, int var) {
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return true;
  bool built = false;
  dispatch_head_dim(p.head_dim, [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      if constexpr (kStep >= 2) {
        if (p.dropout) return;
        auto go = [&]<int kV>() {
          if (dtype == DType::BF16) launch_config<__nv_bfloat16, D, kStep, false, false, kV>(dtype, p, stream);
          else launch_config<__half, D, kStep, false, false, kV>(dtype, p, stream);
          built = true;
        };
        if (var == 0) go.template operator()<0>();
        else if (var == kVarTileOrderMFast) go.template operator()<kVarTileOrderMFast>();
        else if constexpr (D == 128) {
          if (var == (kVarTileOrderMFast | kVarKAhead)) go.template operator()<kVarTileOrderMFast | kVarKAhead>();
        }
      }
    });
  });
  return built;
}
#elif !defined(FLASHLAB_FA3_NO_LAUNCHER) && defined(FLASHLAB_FA3_TIMELINE_ENTRY)
// The timeline build (flashlab_cuda_fa3_ws_timeline): the shipped choices (kShippedVar) with the timeline
// hook compiled in, f16 and bf16, no dropout (fa3_ws_params.hpp says what the caller provides).
void launch_forward_timeline(DType dtype, const Params& p, cudaStream_t stream, LadderStep step) {
  if (p.dropout)
    throw std::invalid_argument("cuda-fa3-ws's timeline build has no dropout: record a run without dropout.");
  if (p.timeline != nullptr && (p.timeline_count == nullptr || p.timeline_capacity <= 0))
    throw std::invalid_argument("cuda-fa3-ws's timeline build needs a record counter and a capacity above 0 beside "
                                "its record buffer.");
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  dispatch_head_dim(p.head_dim, [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      with_shipped_var<D, kStep>(p, [&]<int kV>() {
        if (dtype == DType::BF16) launch_config<__nv_bfloat16, D, kStep, false, true, kV>(dtype, p, stream);
        else launch_config<__half, D, kStep, false, true, kV>(dtype, p, stream);
      });
    });
  });
}
#elif !defined(FLASHLAB_FA3_NO_LAUNCHER)

// TMA needs a 16-byte aligned base and 16-byte multiple strides: a row of one head is d * 2 bytes (128,
// 256 or 512 for d in {64, 128, 256}), so the S and B strides (H d 2, S H d 2) are multiples of 16 too.
CUtensorMap make_bshd_tensor_map(const void* base, DType dtype, int batch, int seq, int heads, int head_dim,
                                 int box_rows) {
  if (dtype != DType::F16 && dtype != DType::BF16) throw std::invalid_argument("cuda-fa3-ws: dtype must be f16 or bf16");
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(batch)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(head_dim) * kElemBytes;
  const cuuint64_t strides[3] = {row_bytes, row_bytes * heads, row_bytes * heads * seq};  // bytes, dims 1..3
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kPanelCols), 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled()(&map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                                    4, const_cast<void*>(base), dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuda-fa3-ws: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(r)) +
                             " (d=" + std::to_string(head_dim) + ", heads=" + std::to_string(heads) + ", seq=" +
                             std::to_string(seq) + ", batch=" + std::to_string(batch) + ", box rows=" + std::to_string(box_rows) + ")");
  return map;
}

int block_rows(LadderStep step) { return static_cast<int>(step) >= 2 ? 2 * kRowsPerConsumer : kRowsPerConsumer; }

void launch_forward(DType dtype, const Params& p, cudaStream_t stream, LadderStep step) {
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  dispatch_head_dim(p.head_dim, [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      auto go = [&]<class T>() {
        // Dropout keeps the narrow blocks: its keep bits beside a wider S_ij spill (100-160 bytes at steps
        // 4 and 5, ptxas -v), and dropout is checked for correctness, not raced.
        if (p.dropout) launch_config<T, D, kStep, true>(dtype, p, stream);
        else with_shipped_var<D, kStep>(p, [&]<int kV>() { launch_config<T, D, kStep, false, kTimelineCompiled, kV>(dtype, p, stream); });
      };
      if (dtype == DType::BF16) go.template operator()<__nv_bfloat16>();
      else go.template operator()<__half>();
    });
  });
}

#endif  // FLASHLAB_FA3_NO_LAUNCHER
}  // namespace flashlab::cuda::fa3ws
