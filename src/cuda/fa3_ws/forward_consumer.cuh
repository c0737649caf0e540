#pragma once
// cuda-fa3-ws forward, its consumers: the mainloop (S_ij = Q_i K_j^T, the mask, the online softmax,
// O_i += P_ij V_j, in the ladder step's order) for one warpgroup's 64 query rows of a tile, and the tile loop
// that hands each tile to the epilogue (forward_epilogue.cuh: O_i and L_i out).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/forward_config.cuh"
#include "cuda/fa3_ws/forward_epilogue.cuh"
#include "cuda/fa3_ws/fp8_layout.cuh"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/online_softmax.cuh"
#include "cuda/fa3_ws/producer.cuh"
#include "cuda/fa3_ws/tile_scheduler.cuh"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {

template <class T, int D, int kStep, bool kDropout, bool kTimeline, class Sched>
struct Consumer {
  using Cfg = KernelConfig<T, D, kStep, Sched>;
  using Smem = typename Cfg::Smem;
  using TL = TimelineLane<kTimeline>;
  using Element = T;
  static constexpr int kD = D;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kStages = Cfg::kStages;
  static constexpr int kNS = kBc / 2;   // S_ij accumulator floats per thread: (64, Bc)
  static constexpr int kNO = D / 2;     // O_i accumulator floats per thread: (64, d)
  static constexpr int kWgmmaK = ElementTraits<T>::kWgmmaK;  // the depth of one wgmma: 16 for 16-bit T, 32 for e4m3
  static constexpr int kKSteps = kBc / kWgmmaK;  // k-steps of P_ij V_j
  static constexpr bool kE4m3 = Cfg::kE4m3;  // the FP8 forward: e4m3 Q, K, V^T and P, per-head descales
  // A panel row of Q_i and K_j (hopper.cuh): 128 bytes, or 64 for e4m3 at d = 64 (the 64-byte swizzle).
  static constexpr int kQkRowBytes = kPanelRowBytesOf<T, D>;
  using Softmax = OnlineSoftmax<kBc, kE4m3, Cfg::kExp2PolyEvery, Sched::kLazyRescale, Cfg::kTreeReductions>;
  // Step 4's intra-warpgroup overlap, where the head's registers allow it (E4m3HeadConfig: not e4m3 at d = 256).
  static constexpr bool kIntraOverlap = Cfg::kIntraOverlap && Cfg::kOverlapFits;
  static_assert(Cfg::kConsumers <= ForwardBarriers::kMaxConsumers, "each consumer has its named barriers");
  static_assert(!Cfg::kOBufferShared || Cfg::kConsumers == 2, "two consumers take the shared O buffer in turn");

  const Params& p;
  const Loader<Cfg>* loader;  // used by ladder step 1 only (no producer warpgroup)
  unsigned char* smem;
  std::uint64_t* bars;
  int c;    // consumer index: rows 64 c .. 64 c + 63 of the tile
  int wg;   // warpgroup index in the block (for the timeline)
  int tid;  // thread index within the warpgroup
  int warp, g, t;  // warp in the warpgroup, lane / 4, lane % 4
  mutable TL tl{};  // this warpgroup's timeline lane (thread 0 records)

  __device__ std::uint32_t q_addr() const { return smem_u32(smem + Smem::kQOffset) + c * kRowsPerConsumer * kQkRowBytes; }
  __device__ std::uint32_t k_addr(int stage) const { return smem_u32(smem + Smem::kKOffset + stage * Smem::kKVBytes); }
  __device__ std::uint32_t v_addr(int stage) const { return smem_u32(smem + Smem::kVOffset + stage * Smem::kKVBytes); }
  __device__ bool issues_loads() const { return !Cfg::kWarpSpecialized && tid == 0; }

  // Ping-pong: wait for this consumer's turn / hand the turn to the next one (consumer 0 after the last: a ring).
  __device__ void turn_wait() const {
    if constexpr (Cfg::kPingPong) {
      const std::uint64_t t0 = TL::now();
      named_barrier_sync(ForwardBarriers::kTurn + c, 2 * kWarpgroupThreads);
      tl.waited(p, t0, TL::now());
    }
  }
  __device__ void turn_pass() const {
    if constexpr (Cfg::kPingPong) named_barrier_arrive(ForwardBarriers::kTurn + (c + 1) % Cfg::kConsumers, 2 * kWarpgroupThreads);
  }
  __device__ void wait_full(int bar, std::uint32_t phase) const {
    const std::uint64_t t0 = TL::now();
    mbar_wait(&bars[bar], phase);
    const std::uint64_t t1 = TL::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaLanded, t1);
  }
  // One arrival per consumer warp (the empty barriers count 4 per consumer), after its wgmma's waited.
  __device__ void release(int bar) const { mbar_arrive_per_warp(&bars[bar], tid % 32); }
  // Q_i's space is free once the tile's last S GEMM has read it, when O_i has a buffer of its own (else
  // the epilogue releases it, after O_i has gone out through it).
  __device__ void release_q_after_last_s() const {
    if constexpr (Cfg::kORows > 0) release(Smem::kQEmpty);
  }

  // S_ij = Q_i K_j^T  // (64, Bc) per consumer; both operands K-major in shared memory.
  __device__ void issue_s(float (&s)[kNS], int stage) const {
    // Opaque bases: the 2 D / kWgmmaK descriptors are recomputed at each issue instead of being hoisted out of
    // the K/V loop and held live (d = 256 step 5: 232 -> 136 bytes spilled; with tid opaque too: 0).
    const std::uint32_t qa = opaque(q_addr()), ka = opaque(k_addr(stage));
#pragma unroll
    for (int kk = 0; kk < D / kWgmmaK; ++kk)
      wgmma_ss<T, kBc>(s, desc_k_major<kQkRowBytes>(qa, kBr, kk), desc_k_major<kQkRowBytes>(ka, kBc, kk), kk > 0 ? 1 : 0);
  }
  // S_ij's columns kHalf * Bc / 2 .. + Bc / 2 - 1 (Cfg::kSplitS): Q_i against that half of K_j's rows, into that half
  // of the accumulator (n-tiles are the accumulator's outer index, so half h of S is s[h * kNS / 2 ..]).
  template <int kHalf>
  __device__ void issue_s_half(float (&s)[kNS], int stage) const {
    static_assert(kBc % 2 == 0 && kHalf >= 0 && kHalf < 2, "S_ij in two halves of Bc / 2 keys");
    constexpr int kHalfKeys = kBc / 2;
    float(&half)[kNS / 2] = *reinterpret_cast<float(*)[kNS / 2]>(s + kHalf * (kNS / 2));
    const std::uint32_t qa = opaque(q_addr()), ka = opaque(k_addr(stage)) + kHalf * kHalfKeys * kQkRowBytes;
#pragma unroll
    for (int kk = 0; kk < D / kWgmmaK; ++kk)
      wgmma_ss<T, kHalfKeys>(half, desc_k_major<kQkRowBytes>(qa, kBr, kk), desc_k_major<kQkRowBytes>(ka, kBc, kk),
                             kk > 0 ? 1 : 0);
  }
  // O_i += P_ij V_j  // (64, d) += (64, Bc) (Bc, d); P_ij from registers, V_j MN-major in shared memory (e4m3:
  // V_j^T (d, Bc) K-major, its keys in fp8_v_key's order, which pack_p's e4m3 fragments follow).
  __device__ void issue_pv(float (&o)[kNO], const std::uint32_t (&pf)[kKSteps][4], int stage) const {
    const std::uint32_t va = opaque(v_addr(stage));
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if constexpr (kE4m3) wgmma_rs<T, D>(o, pf[ks], desc_k_major<Cfg::kVtPanelKeys>(va, D, ks), 1);
      else wgmma_rs<T, D>(o, pf[ks], desc_mn_major<T>(va, kBc, ks), 1);
    }
  }

  // The softmax scale of this tile's scores, log2 units: for e4m3 times Q's and K's descales, since S_ij is computed
  // on the quantized operands (read per K/V block: two cached loads beside the GEMM, no register held across it).
  __device__ float score_scale_log2(const Tile& tile) const {
    if constexpr (kE4m3)
      return p.scale_log2 * p.q_descale[tile.b * p.heads_q + tile.h] * p.k_descale[tile.b * p.heads_kv + tile.h_kv];
    else return p.scale_log2;
  }

  // Rows of this thread (half hf): tile row0 + 64 c + 16 warp + g + 8 hf.
  __device__ int row_of(const Tile& tile, int hf) const { return tile.row0 + c * kRowsPerConsumer + 16 * warp + g + 8 * hf; }

  // Mask (only tiles crossing the diagonal or the end of the keys), online softmax, dropout, and P_ij
  // packed as the A fragments of the next GEMM: k-step ks is S columns 16 ks .. 16 ks + 15, i.e.
  // accumulator n-tiles 2 ks and 2 ks + 1, which is exactly m16n8k16's A layout per warp.
  // Returns whether O_i needs rescaling (OnlineSoftmax::online_softmax).
  __device__ bool softmax_block(float (&s)[kNS], const Tile& tile, int j, Softmax& sm, float (&corr)[2]) const {
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
    const bool needs_rescale = sm.online_softmax(s, score_scale_log2(tile), corr);
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
    if constexpr (kE4m3) {  // 448 P_ij, already scaled by the softmax, to e4m3 (fp8_layout.cuh: no shuffles)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) pack_p_e4m3(s, ks, 1.f, pf[ks]);
    } else {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        pf[ks][0] = pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
        pf[ks][1] = pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
        pf[ks][2] = pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
        pf[ks][3] = pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
      }
    }
  }

  // S_ij issued alone (no P V beside it; `t0`: when this consumer's turn began), the turn handed on, and waited:
  // all of it (kHalf < 0), or only half kHalf (issue_s_half, the other half already issued).
  template <int kHalf = -1>
  __device__ void s_alone(float (&s)[kNS], int stage, std::uint64_t t0) const {
    wgmma_fence();
    if constexpr (kHalf < 0) issue_s(s, stage);
    else issue_s_half<kHalf>(s, stage);
    wgmma_commit_group();
    tl.instant(p, PipelineEvent::WgmmaIssue, t0);
    turn_pass();
    wgmma_wait_group<0>();
    reg_fence(s);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
  }

  // The K/V loop of one tile: block 0's S first, then per block j >= 1 S_ij and P_{i,j-1} V_{j-1}
  // issued together, then the last P V. `kv_iter` numbers the tile's first K/V block in the pipeline.
  __device__ void mainloop(const Tile& tile, std::uint32_t kv_iter, float (&o)[kNO], Softmax& sm) const {
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
    s_alone(s, stage_of(0), t0);
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
      if constexpr (Cfg::kPvBeforeS) {
        // P_{i,j-1} V_{j-1} first, waited, and only then S_ij: P's fragments are dead before S_ij's accumulator is
        // written, so the two are never live at once (E4m3HeadConfig::kPvBeforeS says where and why).
        // With Cfg::kSplitS, the first half of S_ij goes with P V (P's fragments and half of S live at once), and the
        // second half once P V is done: the wait then covers only P V's tail, not the whole GEMM.
        reg_fence(o);
        reg_fence(pf);
        wgmma_fence();
        issue_pv(o, pf, stage_of(j - 1));
        wgmma_commit_group();
        float s[kNS];  // S_ij  // (64, Bc)
        if constexpr (Cfg::kSplitS) {
          issue_s_half<0>(s, stage_of(j));
          wgmma_commit_group();
          wgmma_wait_group<1>();
        } else {
          wgmma_wait_group<0>();
        }
        reg_fence(o);
        reg_fence(pf);
        release(Smem::kVEmpty + stage_of(j - 1));
        s_alone<Cfg::kSplitS ? 1 : -1>(s, stage_of(j), t0);
        release(Smem::kKEmpty + stage_of(j));
        if (j == n - 1) release_q_after_last_s();
        if (issues_loads() && j + kStages - 1 < n) loader->template load_kv<false>(tile, j + kStages - 1, kv_iter + j + kStages - 1, tl, p);
        const bool needs_rescale = softmax_block(s, tile, j, sm, corr);
        pack_p(s, pf);
        if (needs_rescale) Softmax::rescale(o, corr);
        continue;
      }
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
      if constexpr (kIntraOverlap) {
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
        if (kDropout || needs_rescale) Softmax::rescale(o, corr);
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
        if (needs_rescale) Softmax::rescale(o, corr);
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

  // The epilogue: O_i and L_i out (forward_epilogue.cuh).
  __device__ void epilogue(const Tile& tile, float (&o)[kNO], const Softmax& sm, float v_descale) const {
    forward_epilogue(*this, tile, o, sm, v_descale);
  }

  // One tile: its K/V loop, then the epilogue. Q_i has landed; `kv_iter` numbers its first K/V block.
  __device__ void run_tile(const Tile& tile, std::uint32_t kv_iter) const {
    float o[kNO];  // O_i  // (64, d) per consumer, unnormalized
#pragma unroll
    for (int i = 0; i < kNO; ++i) o[i] = 0.f;
    Softmax sm;
    sm.init();
    // V's descale (e4m3) is read before the K/V loop: read in the epilogue, beside O_i and the staging addresses,
    // it spilled up to 116 bytes at d = 256 (ptxas -v).
    float v_descale = 1.f;
    if constexpr (kE4m3) v_descale = p.v_descale[tile.b * p.heads_kv + tile.h_kv];
    if (tile.n_blocks > 0) mainloop(tile, kv_iter, o, sm);
    else release_q_after_last_s();  // no S GEMM reads Q_i
    epilogue(tile, o, sm, v_descale);
  }

  // Every tile of this block: one (blockIdx.x) below step 5; at step 5, each tile the producer announces
  // in the tile slot with Q_i, until it announces total_tiles (no more).
  __device__ void run(int total_tiles) const {
    if constexpr (Cfg::kPingPong) {
      if (c == Cfg::kConsumers - 1) turn_pass();  // consumer 0 goes first
    }
    if constexpr (Cfg::kOBufferShared) {
      if (c == 1)  // and takes the O buffer first
        named_barrier_arrive(ForwardBarriers::kOBufferFree, 2 * kWarpgroupThreads);
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
        const Tile tile = make_tile<kBr, kBc, tile_order<Sched, true>()>(p, ti);
        // The per-thread shared-memory addresses and fragment coordinates are the same for every tile, and
        // hoisted out of this loop they stayed live across it (64 epilogue offsets, the descriptors) and
        // spilled 68 bytes at d = 128. Passing them through an opaque move per tile keeps them where they
        // are used (d = 128: no spill; d = 256: tid too, with the opaque descriptor bases: no spill).
        Consumer self = *this;
        pin(self.smem, self.bars, self.warp, self.g, self.t, self.c, self.tid);
        self.run_tile(tile, kv_iter);
        kv_iter += tile.n_blocks;
        tl = self.tl;  // the timeline lane's slot state goes on to the next tile
      }
    } else {
      const Tile tile = make_tile<kBr, kBc, tile_order<Sched, false>()>(p, static_cast<int>(blockIdx.x));
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

}  // namespace flashlab::cuda::fa3_ws
