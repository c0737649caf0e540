#pragma once
// cuda-fa3-ws backward, its consumers (Consumer): per step the five products (S^T, dP^T, dV_j, dK_j, dQ_i's pieces)
// and the pointwise part between them, dQ_i's pieces out (to the writer warp or straight to dQ_accum), for one
// warpgroup's keys or columns of the block; after the last step, the epilogue (backward_epilogue.cuh: dK_j, dV_j out).
#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_dq.cuh"
#include "cuda/fa3_ws/backward_epilogue.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false, int kC = kConsumers>
struct Consumer {
  using Cfg = BwdConfig<D, kDropout, kC>;
  using Bars = typename Cfg::Barriers;
  static constexpr bool kDefer = Cfg::kDeferDq;
  using TL = TimelineLane<kTimeline>;
  using Element = T;
  static constexpr int kD = D;
  static constexpr bool kAccumulates = kAccumulate;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kNS = Cfg::kNS, kNKV = Cfg::kNKV, kNQ = Cfg::kNQ,
                       kKSteps = Cfg::kKSteps, kPackSteps = Cfg::kPackSteps, kPieces = Cfg::kDqPiecesPerConsumer;
  static constexpr bool kKvByKeys = Cfg::kKvByKeys;
  static constexpr int kKeepWords = (kNS / 2 + 31) / 32;
  const Params& p;
  const KeyBlock& kb;
  unsigned char* smem;
  std::uint64_t* bars;
  int c;           // consumer index: keys 64 c .. 64 c + 63 of the block (KvSplit::Keys), or its half (Columns)
  int tid;         // thread index within the warpgroup
  int warp, g, t;  // warp in the warpgroup, lane / 4, lane % 4
  mutable TL tl{};  // this warpgroup's timeline lane (thread 0 records)

  __device__ std::uint32_t k_addr() const { return smem_u32(smem + Cfg::kKOffset); }
  __device__ std::uint32_t q_addr(int stage) const { return smem_u32(smem + Cfg::kQOffset + stage * Cfg::kQBytes); }
  __device__ std::uint32_t do_addr(int stage) const { return smem_u32(smem + Cfg::kDOOffset + stage * Cfg::kQBytes); }
  __device__ unsigned char* ds_tile(int buffer) const { return smem + Cfg::kDsOffset + buffer * Cfg::kDsBytes; }
  __device__ unsigned char* pt_tile(int buffer) const { return smem + Cfg::kPtOffset + buffer * Cfg::kDsBytes; }
  // This consumer's keys of the block: its 64 rows (Keys), or all 64 (Columns).
  __device__ int key_row0() const { return kKvByKeys ? c * kKeysPerConsumer : 0; }
  __device__ std::uint32_t my_rows(std::uint32_t tile) const { return tile + key_row0() * kPanelRowBytes; }
  // This consumer's first query of the step's S^T, dP^T (within the block of Br), and first column of dK_j, dV_j.
  __device__ int query0() const { return kKvByKeys ? 0 : c * Cfg::kSQueries; }
  __device__ int kv_col0() const { return kKvByKeys ? 0 : c * Cfg::kKvCols; }
  // Key of this thread's accumulator rows (half hf): 16 warp + g + 8 hf of the consumer's 64.
  __device__ int key_of(int hf) const { return kb.key0 + key_row0() + 16 * warp + g + 8 * hf; }

  // One arrival per consumer warp (the empty barriers count 4 per consumer).
  __device__ void release(int bar) const { mbar_arrive_per_warp(&bars[bar], tid % 32); }

  // A^T-form products of this consumer's 64 keys: acc = X_c Y^T with X_c its rows of K_j or V_j and Y its queries
  // of Q_i or dO_i (both K-major): S_ij^T or dP_ij^T, (64, kSQueries).
  __device__ void issue_transposed(float (&acc)[kNS], std::uint32_t x_tile, std::uint32_t y_tile) const {
    const std::uint32_t xa = opaque(my_rows(x_tile)), ya = opaque(y_tile + query0() * kPanelRowBytes);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<T, Cfg::kSQueries>(acc, desc_k_major(xa, kBc, kk), desc_k_major(ya, kBr, kk), kk > 0 ? 1 : 0);
  }
  // acc (64, kKvCols) += A (64, Br) Y (Br, kKvCols), Y = this consumer's columns of dO_i or Q_i, MN-major. Keys: A
  // (P^T or dS^T) from the registers; Columns: from its (Bc, Br) tile in shared memory, K-major.
  __device__ void issue_accumulate(float (&acc)[kNKV], const std::uint32_t (&a)[kPackSteps][4], std::uint32_t a_tile,
                                   std::uint32_t y_tile) const {
    if constexpr (kKvByKeys) {
      (void)a_tile;
      const std::uint32_t ya = opaque(y_tile + kv_col0() / kPanelCols<T> * kBr * kPanelRowBytes);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) wgmma_rs<T, Cfg::kKvCols>(acc, a[ks], desc_mn_major<T>(ya, kBr, ks), 1);
    } else {
      (void)a;
      issue_accumulate_from_tile(acc, a_tile, y_tile);
    }
  }
  // The same with A from a (Bc, Br) tile in shared memory, K-major, from a_tile (this consumer's first row of it).
  __device__ void issue_accumulate_from_tile(float (&acc)[kNKV], std::uint32_t a_tile, std::uint32_t y_tile) const {
    const std::uint32_t ya = opaque(y_tile + kv_col0() / kPanelCols<T> * kBr * kPanelRowBytes);
    const std::uint32_t aa = opaque(a_tile);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      wgmma_ss_nt<T, Cfg::kKvCols>(acc, desc_k_major(aa, kBc, ks), desc_mn_major<T>(ya, kBr, ks), 1);
  }
  // This consumer's 64 x 64 piece pc of dQ_i = dS_ij K_j (DqSplit): dS from the dS^T tile (keys, queries), K_j
  // from its (keys, d) tile, both MN-major. Columns: K_j's panel c kPieces + pc, summed over all Bc keys; Keys:
  // this consumer's 64 rows of both tiles (row pieces: the dS^T tile's query panel pc).
  __device__ void issue_dq(float (&dq)[kNQ], int buffer, int pc) const {
    constexpr bool kByKeys = Cfg::kDqSplit == DqSplit::Keys;
    constexpr int kKeys = kByKeys ? kKeysPerConsumer : kBc;
    const std::uint32_t ds = smem_u32(ds_tile(buffer)) + (kByKeys ? c * kKeysPerConsumer * kPanelRowBytes : 0) +
                             (Cfg::kDqRowPieces ? pc * kBc * kPanelRowBytes : 0);
    const std::uint32_t k =
        k_addr() + (kByKeys ? c * kKeysPerConsumer * kPanelRowBytes : (c * kPieces + pc) * kBc * kPanelRowBytes);
    const std::uint32_t dsa = opaque(ds), ka = opaque(k);
#pragma unroll
    for (int s = 0; s < kKeys / 16; ++s) wgmma_ss_tt<T, 64>(dq, desc_mn_major<T>(dsa, kBc, s), desc_mn_major<T>(ka, kBc, s), s > 0 ? 1 : 0);
  }
  // Where the tiles are complete enough for this consumer's GEMMs: both consumers' halves (P^T and dS^T under
  // KvSplit::Columns; dS^T under DqSplit::Columns), or its own.
  __device__ void sync_tiles_written() const {
    if constexpr (Cfg::kDqSplit == DqSplit::Columns || !kKvByKeys)
      named_barrier_sync(Bars::kDsWritten, Cfg::kConsumers * kWarpgroupThreads);
    else named_barrier_sync(Bars::kConsumer + c, kWarpgroupThreads);
  }

  // Keep bits of this thread's elements of P_ij^T (bit 2 i + e of word hf: query column query0 + 8 i + 2 t + e, key
  // key_of(hf)): one Philox draw per element, as the forward's mask (core/philox.hpp) has it. Transposed, a
  // thread's keys are not four in a row, so each draw serves one element (slower, and exact).
  __device__ void keep_bits(int h, int row0, std::uint32_t (&keep)[2][kKeepWords]) const {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = key_of(hf);
#pragma unroll
      for (int w = 0; w < kKeepWords; ++w) keep[hf][w] = 0u;
#pragma unroll 1
      for (int i = 0; i < kNS / 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = 2 * i + e;
          if (dropout_keep(p.seed, p.drop_threshold, kb.b, h, row0 + query0() + 8 * i + 2 * t + e, key))
            keep[hf][bit / 32] |= 1u << (bit % 32);
        }
    }
  }

  // Writes one packed pair of P^T or dS^T into a (Bc, Br) tile: register pair (ks, q) is key row
  // key_row0 + 16 warp + g + 8 (q % 2), query columns query0 + 16 ks + 8 (q / 2) + 2 t, + 1.
  __device__ void store_pair(std::uint32_t tile, int ks, int q, std::uint32_t x) const {
    const int row = key_row0() + 16 * warp + g + 8 * (q % 2), col = query0() + 16 * ks + 8 * (q / 2) + 2 * t;
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + swizzle128_offset<T>(row, col, kBc)), "r"(x) : "memory");
  }
  // Writes this consumer's packed (64 keys, kSQueries) part of P^T or dS^T into a (Bc, Br) tile.
  __device__ void store_tile(std::uint32_t tile, const std::uint32_t (&x)[kPackSteps][4]) const {
#pragma unroll
    for (int ks = 0; ks < kPackSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) store_pair(tile, ks, q, x[ks][q]);
  }

  // Stages this consumer's dQ piece in shared memory in register order (thread tid's registers 4 q .. 4 q + 3 at
  // float4 q * 128 + tid), its first half (q < kNQ / 8) at `first`, the second at `second` (contiguous, or apart:
  // BwdConfig::kDqRowPieces stages a piece in P^T's rows), and makes it visible to the copy engine.
  __device__ void stage_dq_halves(std::uint32_t first, std::uint32_t second, const float (&dq)[kNQ]) const {
    constexpr int kHalf = kNQ / 8, kStep = kWarpgroupThreads * 16;
    const std::uint32_t at = first + tid * 16, gap = second - first - kHalf * kStep;  // gap 0: contiguous
#pragma unroll
    for (int q = 0; q < kNQ / 4; ++q)
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at + q * kStep + (q < kHalf ? 0u : gap)),
                   "f"(dq[4 * q]), "f"(dq[4 * q + 1]), "f"(dq[4 * q + 2]), "f"(dq[4 * q + 3])
                   : "memory");
    fence_proxy_async_smem();
  }
  __device__ void stage_dq(float* staging, const float (&dq)[kNQ]) const {
    stage_dq_halves(smem_u32(staging), smem_u32(staging) + Cfg::kDqBytes / 2, dq);
  }
  // Stages the piece of step n in buffer n % kDqStagingBuffers (once the writer has handed it back) and hands it to
  // the writer warp.
  __device__ void hand_dq_piece(const float (&dq)[kNQ], int n) const {
    const int b = n % Cfg::kDqStagingBuffers;
    if (n >= Cfg::kDqStagingBuffers) {
      const std::uint64_t t0 = TL::now();
      named_barrier_sync(Bars::dq_empty(c, b), Bars::kDqHandoffThreads);
      tl.waited(p, t0, TL::now());
    }
    stage_dq(reinterpret_cast<float*>(smem + Cfg::kDqOffset + (c * Cfg::kDqStagingBuffers + b) * Cfg::kDqBytes), dq);
    named_barrier_arrive(Bars::dq_full(c, b), Bars::kDqHandoffThreads);
  }
  // Without a writer warp (DqSplit::Columns at d = 256): adds this consumer's pieces of dQ_i (head h, query block i)
  // to dQ_accum from the registers, in the staged layout (float4 q * 128 + tid of each piece). Deterministic: after
  // the pieces' earlier additions (dq_turn), and counted once every thread's are issued (the barrier orders them
  // before thread 0's release). Without a writer the conversion waits for the whole main kernel instead: counted
  // in default mode too, the barrier and fence each step made the d = 256 backward much slower on the H100.
  __device__ void add_dq_pieces(const float (&dq)[kPieces][kNQ], int h, int i) const {
    const std::int64_t first = dq_piece_index<Cfg>(p, kb, h, i, 0) + c * kPieces;
    if (p.deterministic) {
      if (tid == 0) {
        const int turn = dq_turn<Cfg>(p, kb, i, c);
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) wait_counter(p.dq_semaphore + first + pc, turn);
      }
      named_barrier_sync(Bars::kConsumer + c, kWarpgroupThreads);
    }
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      float* at = p.dq_accum + (first + pc) * Cfg::kDqPieceFloats + tid * 4;
#pragma unroll
      for (int q = 0; q < kNQ / 4; ++q)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at + q * kWarpgroupThreads * 4),
                     "f"(dq[pc][4 * q]), "f"(dq[pc][4 * q + 1]), "f"(dq[pc][4 * q + 2]), "f"(dq[pc][4 * q + 3])
                     : "memory");
    }
    if (p.deterministic) {
      named_barrier_sync(Bars::kConsumer + c, kWarpgroupThreads);
      if (tid == 0) {
        __threadfence();
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) count_dq_addition(p, first + pc);
      }
    }
  }
  // Sends step n's pieces of dQ_i out: to the writer warp, or straight to dQ_accum.
  __device__ void send_dq(const float (&dq)[kPieces][kNQ], int n, int h, int i) const {
    if constexpr (Cfg::kDqWriter) {
      static_assert(kPieces == 1, "the writer warp takes one piece per consumer and step");
      (void)h, (void)i;
      hand_dq_piece(dq[0], n);
    } else {
      (void)n;
      add_dq_pieces(dq, h, i);
    }
  }

  // Waits until step n's Q_i, dO_i, L_i and D_i have landed in their stage.
  __device__ void wait_stage(int n, int stage) const {
    const std::uint64_t t0 = TL::now();
    mbar_wait(&bars[Cfg::kFull + stage], (n / kStages) & 1);
    const std::uint64_t landed = TL::now();
    tl.waited(p, t0, landed);
    tl.instant(p, PipelineEvent::TmaLanded, landed);
  }
  // S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T (this consumer's keys and queries), one group each; returns once S^T
  // is complete (dP^T's group may still run), at the time the pointwise part starts.
  __device__ std::uint64_t issue_scores(float (&st)[kNS], float (&dpt)[kNS], int stage) const {
    tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
    wgmma_fence();
    issue_transposed(st, smem_u32(smem + Cfg::kKOffset), q_addr(stage));
    wgmma_commit_group();
    issue_transposed(dpt, smem_u32(smem + Cfg::kVOffset), do_addr(stage));
    wgmma_commit_group();
    wgmma_wait_group<1>();
    reg_fence(st);
    const std::uint64_t pointwise = TL::now();
    tl.instant(p, PipelineEvent::WgmmaWait, pointwise);
    return pointwise;
  }
  // Two floats of L_i or D_i: a plain load, or (kAtUse) one read where it is used, which the compiler cannot hoist
  // (at Br = 128 it hoisted a step's 64 of them beside S^T and dP^T).
  template <bool kAtUse>
  __device__ static float2 row_stats(const float* at) {
    if constexpr (kAtUse) {
      float2 v;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_u32(at)));
      return v;
    } else {
      return *reinterpret_cast<const float2*>(at);
    }
  }
  // P_ij^T = exp2(scale log2(e) S^T - L_i log2(e)) in place of S^T, L_i per column; the causal mask only on blocks
  // that cross the diagonal. Columns of this thread: query0 + 8 i + 2 t + e of query block row0.
  template <bool kStatsAtUse>
  __device__ void probabilities(float (&st)[kNS], int stage, int row0) const {
    const float* L = reinterpret_cast<const float*>(smem + Cfg::kLOffset + stage * Cfg::kRowStatBytes) + query0();
#pragma unroll
    for (int ii = 0; ii < kNS / 4; ++ii) {
      const float2 l = row_stats<kStatsAtUse>(L + 8 * ii + 2 * t);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        st[4 * ii + 2 * hf] = fast_exp2(fmaf(st[4 * ii + 2 * hf], p.scale_log2, -l.x));
        st[4 * ii + 2 * hf + 1] = fast_exp2(fmaf(st[4 * ii + 2 * hf + 1], p.scale_log2, -l.y));
      }
    }
    const int q_row0 = row0 + query0();
    if (p.align != CausalAlign::None &&
        tile_needs_mask(p.align, q_row0, kb.key0 + key_row0() + kKeysPerConsumer, p.seq_q, p.seq_k)) {
#pragma unroll
      for (int ii = 0; ii < kNS / 4; ++ii)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int last = last_visible_key(p.align, q_row0 + 8 * ii + 2 * t + e, p.seq_q, p.seq_k);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            if (key_of(hf) > last) st[4 * ii + 2 * hf + e] = 0.f;
        }
    }
  }
  // Register pair (ks, q) of (P_ij o Z)^T and of dS_ij^T = P_ij^T o (dP_ij^T o Z - D_i), D_i per column, packed:
  // {x: P, y: dS}. (Group ks is query columns 16 ks .. 16 ks + 15: registers 8 ks .. 8 ks + 7.)
  template <bool kStatsAtUse>
  __device__ uint2 packed_pair(const float (&st)[kNS], const float (&dpt)[kNS], const std::uint32_t (&keep)[2][kKeepWords],
                               const float* Di, int ks, int q) const {
    const int r = 8 * ks + 2 * q, ii = r / 4, hf = (r / 2) % 2;
    const float2 d = row_stats<kStatsAtUse>(Di + 8 * ii + 2 * t);
    const float z0 = drop_scale(keep, hf, ii, 0), z1 = drop_scale(keep, hf, ii, 1);
    const std::uint32_t ds = pack2<T>(st[r] * (dpt[r] * z0 - d.x), st[r + 1] * (dpt[r + 1] * z1 - d.y));
    return make_uint2(pack2<T>(st[r] * z0, st[r + 1] * z1), ds);
  }
  // Z of this thread's element (hf, 2 ii + e) of P_ij^T: the dropout mask scaled by 1 / (1 - p), from the step's keep
  // bits (keep_bits), or 1 without dropout.
  __device__ float drop_scale(const std::uint32_t (&keep)[2][kKeepWords], int hf, int ii, int e) const {
    if constexpr (kDropout) {
      const int bit = 2 * ii + e;
      return (keep[hf][bit / 32] >> (bit % 32)) & 1u ? p.drop_rescale : 0.f;
    } else {
      (void)keep, (void)hf, (void)ii, (void)e;
      return 1.f;
    }
  }

  // One step: query block i of query head h, stage `stage` of the pipeline.
  __device__ void step(int n, float (&dk)[kNKV], float (&dv)[kNKV]) const {
    const int stage = n % kStages;
    const int h = kb.head(n), i = kb.q_block(n), row0 = i * kBr;
    wait_stage(n, stage);
    std::uint64_t t0;

    if constexpr (kDefer)  // consumer 1 starts once consumer 0 is through its first pointwise part
      if (n == 0 && c == 1) named_barrier_sync(Bars::kDsWritten, Cfg::kConsumers * kWarpgroupThreads);
    float st[kNS], dpt[kNS];
    const std::uint64_t pointwise = issue_scores(st, dpt, stage);
    probabilities<false>(st, stage, row0);

    // dS_ij^T = P_ij^T o (dP_ij^T o Z - D_i), D_i per column, Z the dropout mask scaled by 1 / (1 - p). P^T o Z and
    // dS^T are packed (group ks is query columns 16 ks .. 16 ks + 15: registers 8 ks .. 8 ks + 7; under KvSplit::Keys
    // the A fragments of dV_j += (P_ij o Z)^T dO_i and dK_j += dS_ij^T Q_i), both before either GEMM is issued, so
    // that S^T and dP^T (fp32) are dead when the packed pairs and the GEMMs' accumulators are live: dK_j and dV_j
    // alone take 128 registers.
    std::uint32_t keep[2][kKeepWords] = {};
    if constexpr (kDropout) keep_bits(h, row0, keep);
    wgmma_wait_group<0>();
    reg_fence(dpt);
    const float* Di = reinterpret_cast<const float*>(smem + Cfg::kDiOffset + stage * Cfg::kRowStatBytes) + query0();
    std::uint32_t pf[kPackSteps][4], dsf[kPackSteps][4];
#pragma unroll
    for (int ks = 0; ks < kPackSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint2 pair = packed_pair<false>(st, dpt, keep, Di, ks, q);
        pf[ks][q] = pair.x;
        dsf[ks][q] = pair.y;
      }
    tl.span(p, PipelineEvent::Softmax, pointwise);  // the pointwise part: P^T, dS^T (with dP^T's wait)
    const std::uint32_t ds = smem_u32(ds_tile(n % 2)), pt = smem_u32(pt_tile(n % 2));
    if constexpr (kDefer) {
      if (n == 0 && c == 0)  // consumer 1 may start
        named_barrier_arrive(Bars::kDsWritten, Cfg::kConsumers * kWarpgroupThreads);
      if (n > 0) {  // the other consumer finished step n - 1: its half of dS^T(n - 1) is there, buffer n % 2 is free
        t0 = TL::now();
        named_barrier_sync(Bars::kStepDone + 2 * (1 - c) + (n - 1) % 2, Cfg::kConsumers * kWarpgroupThreads);
        tl.waited(p, t0, TL::now());
      }
      store_tile(ds, dsf);
      fence_proxy_async_smem();
      float dq[kNQ];
      tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
      wgmma_fence();
      // dQ of step n - 1 (at n = 0 the product of a buffer not yet written, issued so that every step runs the
      // same wgmma sequence, and dropped).
      issue_dq(dq, (n + 1) % 2, 0);
      wgmma_commit_group();
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
      wgmma_wait_group<1>();
      reg_fence(dq);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      // Step n is done as far as the other consumer is concerned (dS^T(n) written, buffer (n + 1) % 2 read): say so
      // now rather than after dV_j and dK_j, which it does not need (side by side at d = 128, N = 4k-16k on the H100:
      // faster on average, bench/results/h100-fa3-ws-backward-notes.md).
      named_barrier_arrive(Bars::kStepDone + 2 * c + n % 2, Cfg::kConsumers * kWarpgroupThreads);
      if (n > 0) hand_dq_piece(dq, n - 1);
      wgmma_wait_group<0>();
      reg_fence(dk);
      reg_fence(dv);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      release(Cfg::kEmpty + stage);
      return;
    }
    if constexpr (!Cfg::kDqFirst) {  // dV_j += (P_ij o Z)^T dO_i and dK_j += dS_ij^T Q_i now (KvSplit::Keys)
      static_assert(kKvByKeys, "dV and dK read P^T and dS^T from shared memory under KvSplit::Columns: they wait for the barrier");
      wgmma_fence();
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
    }

    // dS_ij^T (and, Columns, P_ij^T) into shared memory, buffer n % 2: two buffers, one barrier per step. A
    // consumer writes buffer n % 2 only after both passed step n - 1's barrier, i.e. after the other's GEMMs of
    // step n - 2 were done.
    store_tile(ds, dsf);
    if constexpr (!kKvByKeys) store_tile(pt, pf);
    fence_proxy_async_smem();
    t0 = TL::now();
    sync_tiles_written();
    tl.waited(p, t0, TL::now());

    // dQ_i's pieces (dS_ij K_j), then (kDqFirst) dV_j and dK_j behind them: the pieces are waited for and sent out
    // while those two run.
    float dq[kPieces][kNQ];
    tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
    wgmma_fence();
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) issue_dq(dq[pc], n % 2, pc);
    wgmma_commit_group();
    if constexpr (Cfg::kDqFirst) {
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
      wgmma_wait_group<1>();
      reg_fence(dq);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      send_dq(dq, n, h, i);
    }
    wgmma_wait_group<0>();
    reg_fence(dq);
    reg_fence(dk);
    reg_fence(dv);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    release(Cfg::kEmpty + stage);  // Q_i, dO_i, L_i, D_i are read
    if constexpr (!Cfg::kDqFirst) send_dq(dq, n, h, i);
  }

  // Stages piece pc of this step's dQ_i for the writer warp (dq_row_piece_half: the staging buffer, or P^T's rows),
  // in stage_dq's register order, and hands it over.
  __device__ void hand_dq_row_piece(const float (&dq)[kNQ], int pc) const {
    stage_dq_halves(smem_u32(dq_row_piece_half<Cfg>(smem, c, pc, 0)), smem_u32(dq_row_piece_half<Cfg>(smem, c, pc, 1)),
                    dq);
    named_barrier_arrive(Bars::dq_full(c, pc), Bars::kDqHandoffThreads);
  }

  // One step at Br = 128, d = 64 (BwdConfig::kDqRowPieces): as step, with P^T and dS^T stored to this consumer's
  // rows of their tiles pair by pair as they are packed (S^T and dP^T take 128 registers), dV_j and dK_j read from
  // there (SS), and dQ_i's two row pieces handed to the writer, the second once dV_j has read P^T's rows.
  __device__ void step_in_row_pieces(int n, float (&dk)[kNKV], float (&dv)[kNKV]) const {
    static_assert(Cfg::kDqRowPieces && kKvByKeys && kPieces == 2 && Cfg::kDqFirst && !kDefer,
                  "the row-piece step is d = 64's at Br = 128");
    const int stage = n % kStages;
    const int h = kb.head(n), i = kb.q_block(n), row0 = i * kBr;
    wait_stage(n, stage);
    std::uint64_t t0;
    float st[kNS], dpt[kNS];  // this consumer's 64 keys, all Br queries
    const std::uint64_t pointwise = issue_scores(st, dpt, stage);
    probabilities<true>(st, stage, row0);
    std::uint32_t keep[2][kKeepWords] = {};
    if constexpr (kDropout) keep_bits(h, row0, keep);
    wgmma_wait_group<0>();
    reg_fence(dpt);

    // (P_ij o Z)^T and dS_ij^T = P_ij^T o (dP_ij^T o Z - D_i) into this consumer's rows of the two tiles (one
    // buffer each: this consumer's GEMMs of the step before have read them). P^T's rows held the writer's second
    // dQ piece of the step before: wait until it has been read.
    if (n > 0) {
      t0 = TL::now();
      named_barrier_sync(Bars::dq_empty(c, 1), Bars::kDqHandoffThreads);
      tl.waited(p, t0, TL::now());
    }
    const float* Di = reinterpret_cast<const float*>(smem + Cfg::kDiOffset + stage * Cfg::kRowStatBytes);
    const std::uint32_t ds = smem_u32(ds_tile(0)), pt = smem_u32(pt_tile(0));
#pragma unroll
    for (int ks = 0; ks < kPackSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint2 pair = packed_pair<true>(st, dpt, keep, Di, ks, q);
        store_pair(ds, ks, q, pair.y);
        store_pair(pt, ks, q, pair.x);
      }
    fence_proxy_async_smem();
    tl.span(p, PipelineEvent::Softmax, pointwise);
    t0 = TL::now();
    named_barrier_sync(Bars::kConsumer + c, kWarpgroupThreads);  // this consumer's rows are written
    tl.waited(p, t0, TL::now());

    // dQ_i's two row pieces (dS_ij K_j over this consumer's keys), then dV_j += (P_ij o Z)^T dO_i and
    // dK_j += dS_ij^T Q_i behind them; the pieces go out while those two run.
    float dq[kPieces][kNQ];
    tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
    wgmma_fence();
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) issue_dq(dq[pc], 0, pc);
    wgmma_commit_group();
    issue_accumulate_from_tile(dv, my_rows(pt), do_addr(stage));
    issue_accumulate_from_tile(dk, my_rows(ds), q_addr(stage));
    wgmma_commit_group();
    wgmma_wait_group<1>();
    reg_fence(dq);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    if (n > 0) {  // the staging buffer: read by the writer since step n - 1
      t0 = TL::now();
      named_barrier_sync(Bars::dq_empty(c, 0), Bars::kDqHandoffThreads);
      tl.waited(p, t0, TL::now());
    }
    hand_dq_row_piece(dq[0], 0);
    wgmma_wait_group<0>();
    reg_fence(dk);
    reg_fence(dv);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    release(Cfg::kEmpty + stage);  // Q_i, dO_i, L_i, D_i are read
    hand_dq_row_piece(dq[1], 1);   // into P^T's rows, which dV_j has read
  }

  // The epilogue: dK_j and dV_j out (backward_epilogue.cuh).
  __device__ void epilogue(float (&dk)[kNKV], float (&dv)[kNKV]) const { backward_epilogue(*this, dk, dv); }

  __device__ void run() const {
    float dk[kNKV], dv[kNKV];  // dK_j, dV_j  // (64 keys, d) per consumer
#pragma unroll
    for (int r = 0; r < kNKV; ++r) dk[r] = dv[r] = 0.f;
    if (kb.n_steps > 0) {
      mbar_wait(&bars[Cfg::kKVFull], 0);
#pragma unroll 1
      for (int n = 0; n < kb.n_steps; ++n) {
        // Opaque copies of the thread's indices and bases: what is derived from them (swizzled offsets,
        // descriptors) is recomputed in the step rather than held live across the loop beside dK_j and dV_j
        // (d = 128: 16 bytes spilled without).
        Consumer self = *this;
        pin(self.smem, self.bars, self.c, self.tid, self.warp, self.g, self.t);
        if constexpr (Cfg::kDqRowPieces) self.step_in_row_pieces(n, dk, dv);
        else self.step(n, dk, dv);
        tl = self.tl;  // the timeline lane's slot state goes on to the next step
      }
      if constexpr (kDefer) {  // the last step's dQ_i
        const int n = kb.n_steps;
        named_barrier_sync(Bars::kStepDone + 2 * (1 - c) + (n - 1) % 2, Cfg::kConsumers * kWarpgroupThreads);
        float dq[kNQ];
        wgmma_fence();
        issue_dq(dq, (n - 1) % 2, 0);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        reg_fence(dq);
        hand_dq_piece(dq, n - 1);
      }
    }
    const std::uint64_t t0 = TL::now();
    epilogue(dk, dv);
    tl.span(p, PipelineEvent::Epilogue, t0);
  }
};

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
