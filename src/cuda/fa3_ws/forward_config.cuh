#pragma once
// cuda-fa3-ws forward, its configuration: what a kernel is built with (the ladder step's ideas, the head
// dim's block shape and stages, the schedule) and the shared-memory layout that follows. Everything here is
// a compile-time constant; the other parts (forward_kernel.cuh lists them) read it through KernelConfig.
#include <type_traits>

#include "core/fp8.hpp"  // kE4m3KernelBlockKeys
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
};
// What ships: every idea above, and the wide blocks where the launcher takes them (fa3_ws::takes_wide_blocks,
// cuda/tilings.hpp: long keys, steps 2-5, no dropout); every exponential on the MUFU; the lazy rescale; for FP8 at
// d = 256 an O buffer per consumer. Raced (tools/fa3_harness/race.sh, bench/results/h200-fa3-ws-e4m3-notes.md):
// the own buffers were 1-3% faster from N = 4k to 8k; for FP8 at d = 128 the exponential split gained at most 1%
// and lost 4-7% once half the groups took it, so the MUFU is not what sets the FP8 softmax's pace on Hopper.
template <bool kWideBlocks>
using ShippedSchedule = Schedule<true, true, true, kWideBlocks, /*kExp2PolyEvery=*/0, /*kFp8OwnOBuffers=*/true,
                                 /*kLazyRescale=*/true>;

// Per head dim: Bc, the number of K/V stages, and where O_i leaves. d = 256 takes Bc = 64 so that O_i (128
// fp32 registers per thread), S_ij (32) and P_ij (16, twice under intra-warpgroup overlap) fit in 240
// registers. d = 64 has shared memory for a third K/V stage; d = 128 too when O_i has no buffer
// of its own (Schedule::kThreeStages).
// Long keys (Schedule::kWideBlocks) take wider K/V blocks at d = 64 and 128: Bc = 192 and 160. Every trip around the K/V
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
template <int D, class Sched, bool kPersistent>
struct HeadConfig {
  static constexpr int kBc = block_cols(D, Sched::kWideBlocks);  // cuda/tilings.hpp: what the traffic model reads
  // Rows of O_i's own buffer: 0 (through Q_i's space), Br (both consumers), or 64 (shared in turn).
  static constexpr int kORows = !kPersistent ? 0 : D <= 128 ? 2 * kRowsPerConsumer : kRowsPerConsumer;
  static constexpr bool kOBufferShared = kORows == kRowsPerConsumer;
  static constexpr int kStages = D == 64 || (D == 128 && kBc == 128 && Sched::kThreeStages && kORows == 0) ? 3 : 2;
  static constexpr bool kOverlapFits = true;  // step 4's intra-warpgroup overlap fits the registers
  static constexpr int kExp2PolyEvery = Sched::kExp2PolyEvery;
};

// The FP8 forward (e4m3 Q, K, V; the persistent step only). K_j is (Bc, d) and V_j is stored as V^T (d, Bc), both
// K-major in 128-byte panel rows (128 keys of V^T per panel), so Bc is a whole number of panels: 128. At d = 64 a
// row of Q_i or K_j is 64 bytes, one panel under the 64-byte swizzle (hopper.cuh, kPanelRowBytesOf); V^T's rows stay
// 128 keys. An e4m3 tile is half a bf16 one, and O_i (bf16) has a buffer of its own: at d = 128 Q 16 + 3 x (16 + 16)
// + O 32 = 144 KiB; at d = 256 (O_i 128 fp32 registers per thread, as in bf16) Q 32 + 2 x (32 + 32) + O 32 or 64 =
// 192 or 224 KiB: one consumer's O buffer taken in turn, or one each (Schedule::kFp8OwnOBuffers, which ships). At
// d = 64 a stage is half of d = 128's (K 8 + V^T 8 KiB) and a block's two GEMMs
// take half as long, so the producer runs further ahead: four stages, Q 8 + 4 x (8 + 8) + O 16 = 88 KiB (chosen from
// the copies' sizes, not raced yet).
// At d = 256 the intra-warpgroup overlap does not fit the registers: O_i (128), S_ij (64, twice bf16's with its
// Bc = 64) and P_ij (16) live at once spilled 8 bytes (ptxas -v); without it the consumers' ping-pong still hides
// each one's softmax behind the other's GEMMs, which at d = 256 are the longest of any head dim. At d = 64 (O_i 32
// registers) and 128 (64) it fits.
template <int D, class Sched>
struct E4m3HeadConfig {
  static constexpr int kBc = kE4m3KernelBlockKeys;  // core/fp8.hpp: the CPU emulation follows the same blocks
  static_assert(kBc == 128, "V^T's panel is 128 keys (one 128-byte row of e4m3)");
  static constexpr int kORows = D <= 128 || Sched::kFp8OwnOBuffers ? 2 * kRowsPerConsumer : kRowsPerConsumer;
  static constexpr bool kOBufferShared = kORows == kRowsPerConsumer;
  static constexpr int kStages = D == 64 ? 4 : D == 128 ? 3 : 2;
  static constexpr bool kOverlapFits = D <= 128;
  static constexpr int kExp2PolyEvery = Sched::kExp2PolyEvery;
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
  static constexpr int kConsumers = kWarpSpecialized ? 2 : 1;
  static constexpr int kBr = kConsumers * kRowsPerConsumer;
  static constexpr int kThreads = (kConsumers + (kWarpSpecialized ? 1 : 0)) * kWarpgroupThreads;
};

// Shared memory: Q_i (Br, d), kStages x K_j (Bc, d), kStages x V_j (Bc, d; e4m3: V_j^T (d, Bc)), O_i's buffer
// (kORows, d, in T's output type) if any, each as swizzled panels 128 bytes wide (64 for e4m3 Q_i and K_j at d = 64:
// hopper.cuh); then the mbarriers and the
// tile slot (the persistent producer's word to the consumers: which tile Q_i belongs to).
template <class T, int D, int kBr, int kBcIn, int kStagesIn, int kORowsIn>
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
  static constexpr int kBarOffset = kVOffset + kStages * kKVBytes + kORowsIn * D * kOutBytes;
  // Barriers: Q full / empty, then K full, K empty, V full, V empty per stage.
  static constexpr int kQFull = 0, kQEmpty = 1, kKFull = 2, kKEmpty = kKFull + kStages, kVFull = kKEmpty + kStages,
                       kVEmpty = kVFull + kStages, kNumBarriers = kVEmpty + kStages;
  static constexpr int kTileSlotOffset = kBarOffset + kNumBarriers * 8;
  // + what aligning the dynamic shared window up to a swizzle atom may skip (swizzle_atom_pad).
  static constexpr int kBytes = kTileSlotOffset + 8 + kSmemAlignSlack;
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
  // e4m3's O_i (bf16) is wider than Q_i and cannot leave through Q_i's space: only the persistent step has it.
  static_assert(!kE4m3 || Step::kPersistent, "the FP8 forward is built at the persistent step only");
  using Smem = SmemLayout<T, D, Step::kBr, Head::kBc, Head::kStages, Head::kORows>;
  // The shipped step is what cuda/tilings.hpp describes to the traffic model (fa3_ws::forward_tiling).
  static_assert(kStep != static_cast<int>(kShippedStep) ||
                    (Step::kBr == forward_tiling(D, 0, false).Br &&
                     Step::kThreads == forward_tiling(D, 0, false).warps * 32),
                "cuda/tilings.hpp describes the shipped step's block");
};

}  // namespace flashlab::cuda::fa3_ws
