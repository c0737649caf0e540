#pragma once
// The budget both passes of cuda-fa3-ws split between their warp roles: one producer warpgroup that only
// issues TMA copies, and two (or three) consumer warpgroups that multiply and exponentiate. setmaxnreg (hopper.cuh)
// moves registers from the producer to the consumers once the block runs; the sum must fit the SM's file.
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {

inline constexpr int kProducerRegs = 24;   // TMA issue needs a handful of registers
inline constexpr int kConsumerRegs = 240;  // 128 * 24 + 256 * 240 = 64,512 <= 65,536 registers per SM
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the producer's and consumers' registers fit one SM");
// Three consumer warpgroups (forward_config.cuh, Schedule::kConsumerWarpgroups): 512 threads, and 160 registers a
// consumer, as FlashAttention-3 gives its three at d = 64. setmaxnreg moves registers within what the block was
// launched with: 512 threads x 128.
inline constexpr int kThreeConsumerRegs = 160;
static_assert(128 * kProducerRegs + 384 * kThreeConsumerRegs <= 512 * 128,
              "the producer's and three consumers' registers fit what the block was launched with");
inline constexpr int kMaxSmemBytes = 227 * 1024;  // per-block opt-in shared memory on the H100 and H200
// Arrivals a stage's empty barrier counts per consumer warpgroup: one per warp (mbar_arrive_per_warp).
inline constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / 32;

// The FP8 forward with V transposed in the producer (forward_config.cuh, Schedule::kFp8TransposeInKernel): warps
// 1 .. kTransposeWarps of the producer warpgroup rewrite each V_j as V_j^T (fp8_transpose_v_smem.cuh) while warp 0
// issues the copies. Its split of the registers is its own constant, though today the same: the transpose fits 24
// registers (ptxas -v: no spills at d = 64, 128, 256, with its index arithmetic unsigned and its loop placed before
// the issuer's code), while 32 / 232 or 40 / 232 spilled 52 bytes in the consumers at d = 256. setmaxnreg moves
// registers within what the block was launched with: 384 threads x 168 (the most __launch_bounds__(384, 1) allows).
inline constexpr int kTransposeWarps = 3;
inline constexpr int kTransposingProducerRegs = 24;
inline constexpr int kTransposingConsumerRegs = 240;
static_assert(128 * kTransposingProducerRegs + 256 * kTransposingConsumerRegs <= 384 * 168,
              "the transposing producer's and the consumers' registers fit what the block was launched with");

// Each role takes its budget as its first instruction: the producer warpgroup gives registers back, the
// consumer warpgroups wait until they have theirs.
template <int kRegs = kProducerRegs>
__device__ __forceinline__ void enter_producer_role() { setmaxnreg_dec<kRegs>(); }
template <int kRegs = kConsumerRegs>
__device__ __forceinline__ void enter_consumer_role() { setmaxnreg_inc<kRegs>(); }

}  // namespace flashlab::cuda::fa3_ws
