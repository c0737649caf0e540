#pragma once
// cuda-fa3-ws forward, its configuration: what a kernel is built with (the ladder step's ideas, the head
// dim's block shape and stages, the schedule) and the shared-memory layout that follows. Everything here is
// a compile-time constant; the other parts (forward_kernel.cuh lists them) read it through KernelConfig.
#include <type_traits>

#include "core/fp8.hpp"  // e4m3_kernel_block_keys
#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/named_barriers.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa3_ws {

inline constexpr float kLn2 = 0.6931471805599453f;

// The scheduling choices a forward kernel is built with, as one type. What ships is ShippedSchedule: one
// schedule per head dim, with wide K/V blocks for long keys (below). tools/fa3_harness builds other
// schedules from the same parts, to race them against it.
template <bool kQueryBlocksFastestIn, bool kKAheadIn, bool kThreeStagesIn, bool kWideBlocksIn,
          int kExp2PolyEveryIn = 0, bool kFp8OwnOBuffersIn = false, bool kLazyRescaleIn = true>
struct Schedule {
  // One tile per block (steps 1-4): the query blocks of one (batch, head) are numbered in a row, so the
  // blocks resident at once share a few heads' K/V streams in L2; otherwise heads fastest, which spreads
  // the ~132 resident blocks over up to 132 heads (at N = 4k only ~2 blocks then read each K/V stream).
  static constexpr bool kQueryBlocksFastest = kQueryBlocksFastestIn;
  // The producer issues K_{j+1} before V_j, the order the consumers use them (S_{i,j+1} and P_ij V_j are
  // issued together), instead of waiting for V_j's empty slot before the next K.
  static constexpr bool kKAhead = kKAheadIn;
  // Three K/V stages at d = 128 where O_i has no buffer of its own (steps 1-4): Q 32 KiB + 3 x 64 KiB = 224
  // KiB fits the 227 KiB.
  static constexpr bool kThreeStages = kThreeStagesIn;
  // Wide K/V blocks at d = 64 and 128 (HeadConfig below).
  static constexpr bool kWideBlocks = kWideBlocksIn;
  // FlashAttention-4's two softmax ideas (OnlineSoftmax): one S column group of 8 in kExp2PolyEvery has its
  // exponentials computed by exp2_poly on the FMA pipes instead of the MUFU (0: none); and with kLazyRescale, O_i is
  // rescaled only when a row's max has risen by more than 2^8 (16-bit P; FP8's max never lags), else whenever it rises.
  static constexpr int kExp2PolyEvery = kExp2PolyEveryIn;
  static constexpr bool kLazyRescale = kLazyRescaleIn;
  // The FP8 forward only (E4m3HeadConfig): at d = 256 each consumer gets an O buffer of its own instead of taking
  // one in turn.
  static constexpr bool kFp8OwnOBuffers = kFp8OwnOBuffersIn;
  // The online softmax's row max and row sum as balanced trees instead of one dependent chain each (OnlineSoftmax's
  // kTreeReductions): -1 leaves it to the head config (where it was raced faster), 0 or 1 forces it
  // (WithSoftmaxTrees, for the race).
  static constexpr int kSoftmaxTrees = -1;
  // The FP8 forward only: V_j^T is made in shared memory by the producer warpgroup (fp8_transpose_v_smem.cuh) from
  // V_j as TMA lands it, instead of read from the V^T the pre-pass wrote (fp8_transpose_v.cu). Off here; a schedule
  // turns it on as WithFp8TransposeInKernel<Schedule<...>> (below), which keeps every other kernel's name and code.
  static constexpr bool kFp8TransposeInKernel = false;
  // The 16-bit forward only: keys per K/V block, 0 for the head config's (block_cols); a schedule sets another as
  // WithBlockKeys<Sched, N> (below), for the race.
  static constexpr int kBlockKeys = 0;
  // Where P V is waited before S_ij is issued (the head configs' kPvBeforeS): S_ij in two halves, the first issued
  // beside P V (WithSplitS, for the race).
  static constexpr bool kSplitS = false;
  // The 16-bit persistent forward only: consumer warpgroups of 64 query rows each, 0 for the head config's (two); a
  // schedule sets three as WithConsumers<Sched, 3> (below): Br = 192, 160 registers a consumer, and the ping-pong a
  // ring of three turns, so that two consumers' softmax can hide behind the third's GEMMs.
  static constexpr int kConsumerWarpgroups = 0;
};
// A schedule with the FP8 V transpose in the producer (Schedule::kFp8TransposeInKernel). At d = 256 it needs the O
// buffer taken in turn (kFp8OwnOBuffers off): its staging buffer takes the second O buffer's 32 KiB (E4m3HeadConfig).
template <class Sched>
struct WithFp8TransposeInKernel : Sched {
  static constexpr bool kFp8TransposeInKernel = true;
};
// A schedule whose 16-bit forward takes K/V blocks of kKeys keys, whatever block_cols says.
template <class Sched, int kKeys>
struct WithBlockKeys : Sched {
  static constexpr int kBlockKeys = kKeys;
};
// A schedule that splits S_ij in two where P V is waited before it (Schedule::kSplitS).
template <class Sched>
struct WithSplitS : Sched {
  static constexpr bool kSplitS = true;
};
// A schedule whose 16-bit persistent forward has kCount consumer warpgroups (Schedule::kConsumerWarpgroups).
template <class Sched, int kCount>
struct WithConsumers : Sched {
  static constexpr int kConsumerWarpgroups = kCount;
};
// A schedule with the softmax's reductions forced to trees (kOn) or chains, whatever the head config says.
template <class Sched, bool kOn>
struct WithSoftmaxTrees : Sched {
  static constexpr int kSoftmaxTrees = kOn ? 1 : 0;
};
// What ships: every idea above, and the wide blocks where the launcher takes them (fa3_ws::takes_wide_blocks,
// cuda/tilings.hpp: long keys, steps 2-5, no dropout); every exponential on the MUFU; the lazy rescale; for FP8 at
// d = 256 an O buffer per consumer, and V^T from the pre-pass. Raced (tools/fa3_harness/race.sh, bench/results/h200-fa3-ws-e4m3-notes.md):
// the own buffers were faster from N = 4k to 8k; for FP8 at d = 128 the exponential split gained little and lost
// once half the groups took it, so the MUFU is not what sets the FP8 softmax's pace on Hopper.
template <bool kWideBlocks>
using ShippedSchedule = Schedule<true, true, true, kWideBlocks, /*kExp2PolyEvery=*/0, /*kFp8OwnOBuffers=*/true,
                                 /*kLazyRescale=*/true>;
// The schedule of ladder step kStep from the shipped one: steps 6 and 7 flip one of FlashAttention-4's softmax ideas
// (LadderStep::EagerRescale: the lazy rescale off; Exp2Emulated: 1 column group in kExp2PolyGroups by exp2_poly).
template <int kStep, class Sched>
struct RungScheduleOf {
  using type = Sched;
};
template <bool kQ, bool kK, bool kThree, bool kWide, int kPoly, bool kOwn, bool kLazy>
struct RungScheduleOf<static_cast<int>(LadderStep::EagerRescale), Schedule<kQ, kK, kThree, kWide, kPoly, kOwn, kLazy>> {
  using type = Schedule<kQ, kK, kThree, kWide, kPoly, kOwn, /*kLazyRescale=*/false>;
};
template <bool kQ, bool kK, bool kThree, bool kWide, int kPoly, bool kOwn, bool kLazy>
struct RungScheduleOf<static_cast<int>(LadderStep::Exp2Emulated), Schedule<kQ, kK, kThree, kWide, kPoly, kOwn, kLazy>> {
  using type = Schedule<kQ, kK, kThree, kWide, kExp2PolyGroups, kOwn, kLazy>;
};
// A schedule with its own consumer count takes the rung's switch in the schedule it wraps.
template <int kStep, class Sched, int kCount>
struct RungScheduleOf<kStep, WithConsumers<Sched, kCount>> {
  using type = WithConsumers<typename RungScheduleOf<kStep, Sched>::type, kCount>;
};
template <int kStep, class Sched>
using RungSchedule = typename RungScheduleOf<kStep, Sched>::type;

// The FP8 forward with V transposed in the producer at head dim D (launch_forward_e4m3_vt_in_smem): the shipped
// FP8 schedule (Fp8ShippedSchedule), but at d = 256 with one O buffer taken in turn (WithFp8TransposeInKernel says why).
template <int D>
using Fp8InKernelTransposeSchedule = WithFp8TransposeInKernel<std::conditional_t<
    D == 256, Schedule<true, true, true, false, 0, /*kFp8OwnOBuffers=*/false, true>, WithSplitS<ShippedSchedule<true>>>>;
// The FP8 forward that ships at head dim D (launch_forward_e4m3): wide blocks (Bc = 256) at d = 64 and 128, and S_ij in
// two halves where P V is waited before it (d = 128: E4m3HeadConfig::kSplitS; raced in
// bench/results/h200-fa3-ws-e4m3-race-split-s_2026-11-28.txt, its output bit-identical to S_ij whole).
template <int D>
using Fp8ShippedSchedule = WithSplitS<ShippedSchedule<D <= 128>>;

// Per head dim: Bc, the number of K/V stages, and where O_i leaves. d = 256 takes Bc = 64 so that O_i (128
// fp32 registers per thread), S_ij (32) and P_ij (16, twice under intra-warpgroup overlap) fit in 240
// registers. d = 64 has shared memory for a third K/V stage; d = 128 too when O_i has no buffer
// of its own (Schedule::kThreeStages).
// Long keys (Schedule::kWideBlocks) take wider K/V blocks at d = 64 and 128: Bc = 192 and 160. Every trip around the K/V
// loop pays fixed costs (barrier and mbarrier waits, the row max and sum shuffles, wgmma fences and
// waits) that a wider block spreads over more keys: on the H100 a gain at d = 128 and a larger one at
// d = 64 from N = 4k on, but a loss below N = 2k, where the last block is mostly masked padding
// (bench/results/h100-fa3-ws-notes.md). 160 is the widest that leaves O_i's own buffer at d = 128 (Q 32 +
// 2 x (40 + 40) + O 32 = 224 KiB); 176 was no faster at step 4, and 256 spills at d = 64.
// At d = 64 the persistent kernel (steps 5-7) takes three consumer warpgroups (Br = 192, as FlashAttention-3 does
// there), for short keys and long, wherever their taller tiles pad the queries little (cuda/tilings.hpp,
// forward_choice; where they would pad them more it keeps two, on the wide blocks for long keys): its GEMMs are the shortest of any head dim, so with two consumers the tensor cores
// wait whenever one consumer's softmax outlasts the other's GEMMs; with three, two softmaxes run under each GEMM. The
// price is 160 registers a consumer: K/V blocks of 128 keys and no intra-warpgroup overlap (kOverlapFits). Q 24 +
// 3 x (16 + 16) + O 24 = 144 KiB.
// Where O_i leaves: below step 5, through Q_i's space (Q_i is released after the epilogue). The persistent
// grid (step 5) gives O_i a buffer of its own, so that Q_i is released as soon as the tile's last S GEMM
// has read it and the producer loads the next tile's Q while the consumers finish this one: at d <= 128 a
// (Br, d) buffer (d = 128: Q 32 + O 32 + 2 x 64 KiB); at d = 256 one consumer's (64, d), which the two
// consumers take in turn (Q 64 + 2 x 64 + O 32 KiB = 224 KiB).
template <int D, class Sched, bool kPersistent>
struct HeadConfig {
  // cuda/tilings.hpp: what the traffic model reads (Sched::kBlockKeys overrides it, for the race).
  // Consumer warpgroups once the warps are specialized (step 1 has one, and no producer: KernelConfig): three at
  // d = 64 in the persistent kernel's wide schedule (cuda/tilings.hpp), else two; a schedule may set its own (the
  // launcher sets two where three would mostly pad: forward_kernel.cuh, with_shipped_schedule).
  static constexpr int kConsumers = Sched::kConsumerWarpgroups > 0 ? Sched::kConsumerWarpgroups
                                                                   : forward_consumers(D, Sched::kWideBlocks, kPersistent);
  static constexpr int kBc =
      Sched::kBlockKeys > 0 ? Sched::kBlockKeys : block_cols(D, Sched::kWideBlocks, kConsumers);
  static_assert(kConsumers == 2 || (kConsumers == 3 && kPersistent && D <= 128),
                "two consumer warpgroups, or three in the persistent kernel at d <= 128 (O_i in a buffer of its own)");
  // Rows of O_i's own buffer: 0 (through Q_i's space), Br (every consumer), or 64 (shared in turn).
  static constexpr int kORows = !kPersistent ? 0 : D <= 128 ? kConsumers * kRowsPerConsumer : kRowsPerConsumer;
  static constexpr bool kOBufferShared = kORows == kRowsPerConsumer;
  static constexpr int kStages = D == 64 || (D == 128 && kBc == 128 && Sched::kThreeStages && kORows == 0) ? 3 : 2;
  // S_ij and P_{i,j-1} V_{j-1} issued together, under step 4's intra-warpgroup overlap, except with blocks of 256
  // keys (d = 64 through WithBlockKeys; raced slower than 192, bench/results/h100-fa3-ws-race-bf16-d64-bc256_2026-11-28.txt):
  // there S_ij (128 fp32 registers), P's fragments (64) and O_i (32) do not fit at once, and P V is waited before S_ij
  // is issued (as E4m3HeadConfig does at d = 128).
  static constexpr bool kPvBeforeS = kBc >= 256;
  static constexpr bool kSplitS = Sched::kSplitS && kPvBeforeS;
  // With three consumers (160 registers each) the overlap spilled 16 bytes at d = 64 and Bc = 128 (ptxas -v): S_ij (64),
  // P's fragments (32) and O_i (32) live through the softmax leave too little for its temporaries. Without it, P is
  // dead by then, and the two other consumers' softmax is what hides this one's GEMMs.
  static constexpr bool kOverlapFits = !kPvBeforeS && kConsumers == 2;
  static constexpr int kExp2PolyEvery = Sched::kExp2PolyEvery;
  static constexpr int kStagingStages = 0;  // V_j lands where the consumers read it (E4m3HeadConfig has the other case)
  // The softmax's reductions as trees where they were raced faster: the shipped (persistent) kernel at d = 64, on an
  // H100; at d = 128 and 256 they were even or slower
  // (bench/results/h100-fa3-ws-race-softmax-trees_2026-11-28.txt).
  static constexpr bool kTreeReductions = Sched::kSoftmaxTrees >= 0 ? Sched::kSoftmaxTrees == 1 : kPersistent && D == 64;
};

// The FP8 forward (e4m3 Q, K, V; the persistent step only). K_j is (Bc, d) and V_j is stored as V^T (d, Bc), both
// K-major in 128-byte panel rows (128 keys of V^T per panel), so Bc is a whole number of panels. At d = 64 a row of
// Q_i or K_j is 64 bytes, one panel under the 64-byte swizzle (hopper.cuh, kPanelRowBytesOf); V^T's rows stay 128
// keys. An e4m3 tile is half a bf16 one, and O_i (bf16) has a buffer of its own.
// Wide blocks (Schedule::kWideBlocks, shipped at d = 64 and 128): Bc = 256, two panels. FP8's GEMMs are half as long
// as bf16's, so the fixed costs of a trip around the K/V loop weigh twice as much, and a wider block spreads them
// (raced against Bc = 128: tools/fa3_harness/race.sh, bench/results/h100-fa3-ws-e4m3-race-wide-blocks_2026-11-28.txt).
// Shared memory: at d = 128 Q 16 + 2 x (32 + 32) +
// O 32 = 176 KiB (three stages would need 240); at d = 64 Q 8 + 4 x (16 + 16) + O 16 = 152 KiB. With Bc = 128: d = 128
// Q 16 + 3 x (16 + 16) + O 32 = 144 KiB, d = 64 four stages of 8 + 8 KiB.
// At d = 256 (O_i 128 fp32 registers per thread, as in bf16) Bc = 128: Q 32 + 2 x (32 + 32) + O 32 or 64 = 192 or
// 224 KiB: one consumer's O buffer taken in turn, or one each (Schedule::kFp8OwnOBuffers, which ships).
// With V transposed in the producer (Schedule::kFp8TransposeInKernel), V_j first lands in a staging buffer of its own
// (Bc, d): two of them with Bc = 128 at d = 64 and 128, so that TMA fills one while the producer's warps transpose the
// other; one with Bc = 256 (d = 128: 176 + 32 = 208 KiB) and at d = 256 (Q 32 + 2 x (32 + 32) + O 32 (taken in turn)
// + 32 = 224 KiB: an O buffer per consumer would leave no room for it).
// Registers: at d = 256 the intra-warpgroup overlap does not fit: O_i (128), S_ij (64, twice bf16's with its Bc = 64)
// and P_ij (16) live at once spilled 8 bytes (ptxas -v); without it the consumers' ping-pong still hides each one's
// softmax behind the other's GEMMs, which at d = 256 are the longest of any head dim. At d = 128 with Bc = 256, S_ij
// (128), O_i (64) and P's fragments (32) do not fit at once even without the overlap (kPvBeforeS). At d = 64 (O_i 32
// registers) the overlap fits with either Bc.
template <int D, class Sched>
struct E4m3HeadConfig {
  // Wide blocks (Schedule::kWideBlocks) at d = 64 and 128: two panels of V^T, 256 keys. core/fp8.hpp's
  // e4m3_kernel_block_keys says what the shipped kernel takes, for the CPU emulation (launch_forward_e4m3 checks).
  static constexpr int kBc = Sched::kBlockKeys > 0 ? Sched::kBlockKeys
                                                  : (Sched::kWideBlocks && D <= 128 ? 2 : 1) * kPanelCols<__nv_fp8_e4m3>;
  // V_j^T's panels: 128 keys under the 128-byte swizzle, or 64 under the 64-byte one where Bc is not a whole number of
  // 128-key panels (a schedule's WithBlockKeys<Sched, 192>: three panels).
  static constexpr int kVtPanelKeys = kBc % 128 == 0 ? 128 : 64;
  static_assert(kBc % 64 == 0 && kBc <= 256, "an FP8 K/V block is whole V^T panels of 64 or 128 keys, 256 at most");
  static constexpr int kConsumers = Sched::kConsumerWarpgroups > 0 ? Sched::kConsumerWarpgroups : 2;
  static_assert(kConsumers == 2 || (kConsumers == 3 && D <= 128 && !Sched::kFp8TransposeInKernel),
                "the FP8 forward has two consumer warpgroups, or three at d <= 128 with V^T from the pre-pass");
  static constexpr int kORows =
      D <= 128 || Sched::kFp8OwnOBuffers ? kConsumers * kRowsPerConsumer : kRowsPerConsumer;
  static constexpr bool kOBufferShared = kORows == kRowsPerConsumer;
  static constexpr int kStages = D == 64 ? 4 : D == 128 && kBc <= 192 ? 3 : 2;
  static constexpr bool kOverlapFits = kConsumers == 2 && (D == 64 || (D == 128 && kBc <= 192));
  static constexpr int kExp2PolyEvery = Sched::kExp2PolyEvery;
  // The softmax's reductions as trees at d = 256 only: faster there, slower at d = 64 and 128 (H100,
  // bench/results/h100-fa3-ws-race-softmax-trees_2026-11-28.txt).
  static constexpr bool kTreeReductions = Sched::kSoftmaxTrees >= 0 ? Sched::kSoftmaxTrees == 1 : D == 256;
  static constexpr int kStagingStages = !Sched::kFp8TransposeInKernel ? 0 : D <= 128 && kBc == 128 ? 2 : 1;
  // With Bc = 256 at d = 128, S_ij (128 fp32 registers), O_i (64) and P's fragments (32) live at once leave 16 of the
  // 240 registers for everything else, and spilled 160 bytes: so P_{i,j-1} V_{j-1} is waited before S_ij is issued.
  static constexpr bool kPvBeforeS = D == 128 && kBc > 192;
  static constexpr bool kSplitS = Sched::kSplitS && kPvBeforeS;
  static_assert(!Sched::kFp8TransposeInKernel || kVtPanelKeys == 128,
                "the FP8 V transpose in the producer writes 128-key panels of V^T");
  static_assert(!Sched::kFp8TransposeInKernel || D <= 128 || !Sched::kFp8OwnOBuffers,
                "at d = 256 the FP8 V transpose in the producer takes the O buffer in turn (kFp8OwnOBuffers off)");
};
// The head configuration of element type T: HeadConfig for 16-bit types, E4m3HeadConfig for e4m3.
template <class T, int D, class Sched, bool kPersistent>
using HeadConfigOf =
    std::conditional_t<ElementTraits<T>::kBytes == 1, E4m3HeadConfig<D, Sched>, HeadConfig<D, Sched, kPersistent>>;

// Per ladder step: which scheduling ideas are on, and the block shape that follows.
template <int kStep>
struct StepConfig {
  static constexpr bool kWarpSpecialized = kStep >= 2;
  static constexpr bool kPingPong = kStep >= 3;
  static constexpr bool kIntraOverlap = kStep >= 4;
  static constexpr bool kPersistent = kStep >= 5;
};

// Shared memory: Q_i (Br, d), kStages x K_j (Bc, d), kStages x V_j (Bc, d; e4m3: V_j^T (d, Bc)), O_i's buffer
// (kORows, d, in T's output type) if any, kStagingStages x V_j (Bc, d) as TMA lands it (e4m3 with V transposed in the
// producer, else none), each as swizzled panels 128 bytes wide (64 for e4m3 Q_i, K_j and staged V_j at d = 64:
// hopper.cuh); then the mbarriers, the
// tile slot (the persistent producer's word to the consumers: which tile Q_i belongs to) and, with staging, one word
// per staging buffer (1: a V_j is in it; 0: no more, the transposing warps stop).
template <class T, int D, int kBr, int kBcIn, int kStagesIn, int kORowsIn, int kStagingStagesIn = 0>
struct SmemLayout {
  static constexpr int kElemBytes = ElementTraits<T>::kBytes;
  static constexpr int kOutBytes = sizeof(typename ElementTraits<T>::Output);
  static constexpr int kBc = kBcIn, kStages = kStagesIn;
  static constexpr int kQBytes = kBr * D * kElemBytes;
  static constexpr int kKVBytes = kBc * D * kElemBytes;  // one K or V stage
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr int kOOffset = kORowsIn > 0 ? kVOffset + kStages * kKVBytes : kQOffset;
  static constexpr int kOPanelRows = kORowsIn > 0 ? kORowsIn : kBr;  // rows of a panel where O_i is staged
  static constexpr int kStagingStages = kStagingStagesIn;
  static constexpr int kStagingOffset = kVOffset + kStages * kKVBytes + kORowsIn * D * kOutBytes;
  static constexpr int kBarOffset = kStagingOffset + kStagingStages * kKVBytes;
  // Barriers: Q full / empty, then K full, K empty, V full, V empty per stage; then staged V full / empty per
  // staging buffer.
  static constexpr int kQFull = 0, kQEmpty = 1, kKFull = 2, kKEmpty = kKFull + kStages, kVFull = kKEmpty + kStages,
                       kVEmpty = kVFull + kStages, kStagedFull = kVEmpty + kStages,
                       kStagedEmpty = kStagedFull + kStagingStages, kNumBarriers = kStagedEmpty + kStagingStages;
  static constexpr int kTileSlotOffset = kBarOffset + kNumBarriers * 8;
  static constexpr int kStagingWordsOffset = kTileSlotOffset + 8;
  // + what aligning the dynamic shared window up to a swizzle atom may skip (swizzle_atom_pad).
  static constexpr int kBytes = kStagingWordsOffset + (kStagingStages > 0 ? 8 : 0) + kSmemAlignSlack;
  static_assert(kStagingStages <= 2, "the staging words take 8 bytes: two buffers at most");
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kKVBytes % kSwizzleAtomBytes == 0, "tiles stay 1024-aligned");
  static_assert(kBytes <= kMaxSmemBytes, "Q, the K/V stages, O and the barriers must fit 227 KiB");
};

template <class T, int D, int kStep, class Sched>
struct KernelConfig : StepConfig<kStep>, HeadConfigOf<T, D, Sched, StepConfig<kStep>::kPersistent> {
  using Step = StepConfig<kStep>;
  using Head = HeadConfigOf<T, D, Sched, Step::kPersistent>;
  using Element = T;
  using Output = typename ElementTraits<T>::Output;  // O's type
  static constexpr bool kE4m3 = ElementTraits<T>::kBytes == 1;
  // The block: one consumer warpgroup without a producer (step 1), else the head config's consumers and a producer;
  // each consumer takes 64 query rows of Q_i.
  static constexpr int kConsumers = Step::kWarpSpecialized ? Head::kConsumers : 1;
  static constexpr int kBr = kConsumers * kRowsPerConsumer;
  static constexpr int kThreads = (kConsumers + (Step::kWarpSpecialized ? 1 : 0)) * kWarpgroupThreads;
  // e4m3's O_i (bf16) is wider than Q_i and cannot leave through Q_i's space: only the persistent step has it.
  static_assert(!kE4m3 || Step::kPersistent, "the FP8 forward is built at the persistent step only");
  static_assert(kE4m3 || !Sched::kFp8TransposeInKernel, "V is transposed in the producer for the FP8 forward only");
  using Smem = SmemLayout<T, D, kBr, Head::kBc, Head::kStages, Head::kORows, Head::kStagingStages>;
  // V_j^T made in shared memory by producer warps 1 .. kTransposeWarps (fp8_transpose_v_smem.cuh): V_j's full barrier
  // then counts one arrival per transposing warp instead of the TMA issuer's one, and the registers are split
  // differently (warp_roles.cuh).
  static constexpr bool kTransposesV = Head::kStagingStages > 0;
  static constexpr int kVFullArrivals = kTransposesV ? kTransposeWarps : 1;
  static constexpr int kProducerRegisters = kTransposesV ? kTransposingProducerRegs : kProducerRegs;
  static constexpr int kConsumerRegisters =
      kTransposesV ? kTransposingConsumerRegs : kConsumers == 3 ? kThreeConsumerRegs : kConsumerRegs;
  // The shipped step's 16-bit blocks are what cuda/tilings.hpp describes to the traffic model (fa3_ws::forward_tiling),
  // each for a problem that takes it (forward_choice): the wide schedule for long keys and queries without a mask, or,
  // with two consumers set (d = 64's long keys where three would mostly pad), for 256 queries on those keys; the narrow
  // one for 256 causal queries on 256 keys. Other knobs make a candidate, not what ships.
  static constexpr bool kTwoSet = Sched::kConsumerWarpgroups == 2;
  static constexpr KernelTiling kDescribed =
      forward_tiling(Shape{.seq_q = Sched::kWideBlocks && !kTwoSet ? kWideBcMinKeys : 256,
                           .seq_k = Sched::kWideBlocks ? kWideBcMinKeys : 256, .head_dim = D},
                     /*causal=*/!Sched::kWideBlocks, /*dropout=*/false);
  static_assert(kStep != static_cast<int>(kShippedStep) || kE4m3 || (Sched::kConsumerWarpgroups != 0 && !kTwoSet) ||
                    Sched::kBlockKeys != 0 ||
                    (kBr == kDescribed.Br && Head::kBc == kDescribed.Bc && kThreads == kDescribed.warps * 32),
                "cuda/tilings.hpp describes the shipped step's block");
};

}  // namespace flashlab::cuda::fa3_ws
