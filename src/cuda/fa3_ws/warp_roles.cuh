#pragma once
// The budget both passes of cuda-fa3-ws split between their warp roles: one producer warpgroup that only
// issues TMA copies, and two consumer warpgroups that multiply and exponentiate. setmaxnreg (hopper.cuh)
// moves registers from the producer to the consumers once the block runs; the sum must fit the SM's file.
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {

inline constexpr int kProducerRegs = 24;   // TMA issue needs a handful of registers
inline constexpr int kConsumerRegs = 240;  // 128 * 24 + 256 * 240 = 64,512 <= 65,536 registers per SM
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the producer's and consumers' registers fit one SM");
inline constexpr int kMaxSmemBytes = 227 * 1024;  // per-block opt-in shared memory on the H100 and H200
// Arrivals a stage's empty barrier counts per consumer warpgroup: one per warp (mbar_arrive_per_warp).
inline constexpr int kWarpsPerWarpgroup = kWarpgroupThreads / 32;

// Each role takes its budget as its first instruction: the producer warpgroup gives registers back, the
// consumer warpgroups wait until they have theirs.
__device__ __forceinline__ void enter_producer_role() { setmaxnreg_dec<kProducerRegs>(); }
__device__ __forceinline__ void enter_consumer_role() { setmaxnreg_inc<kConsumerRegs>(); }

}  // namespace flashlab::cuda::fa3_ws
