#pragma once
// The named hardware barriers of cuda-fa3-ws, both passes: which threads meet at each id, and why. A block has 16
// (bar.sync / bar.arrive ids 0-15, hopper.cuh's named_barrier_sync and _arrive); 0 is __syncthreads. Unlike an
// mbarrier (the producer's stages), a named barrier waits for a count of threads, so it hands a turn or a buffer
// between warpgroups that are all running: some threads sync (wait), the others arrive (do not wait).
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {

// The forward (ids 1-8): up to kMaxConsumers consumer warpgroups (two, or three at d = 64: forward_config.cuh).
struct ForwardBarriers {
  static constexpr int kMaxConsumers = 3;
  // Consumer c's own 128 threads (kConsumer + c): its staging of O_i in the epilogue.
  static constexpr int kConsumer = 1;
  // Ping-pong, "consumer c's turn" (kTurn + c, 256 threads: c syncs, the consumer before it arrives when it hands the
  // turn on): the consumers take turns at their GEMMs, in a ring, while the others compute their softmax.
  static constexpr int kTurn = kConsumer + kMaxConsumers;
  // "The O buffer is free for consumer c" (kOBufferFree + c, 256 threads): at d = 256 the two consumers share one
  // O staging buffer and take it in turn.
  static constexpr int kOBufferFree = kTurn + kMaxConsumers;
  static constexpr int kEnd = kOBufferFree + 2;
};

// The backward (ids 1-15), for kConsumers consumer warpgroups that hand the dQ writer their pieces through kDqSlots
// places each (BwdConfig: its staging buffers, or at Br = 128 its two row pieces' places).
template <int kConsumers, int kDqSlots>
struct BackwardBarriers {
  // "Every consumer has written dS_ij^T" (all consumers' threads); also where they meet before the epilogue reuses
  // the Q_i, dO_i stages.
  static constexpr int kDsWritten = 1;
  // Consumer c's own 128 threads (kConsumer + c).
  static constexpr int kConsumer = 2;
  // Consumer c's dQ place b is full (dq_full(c, b)) / empty again (dq_empty(c, b)): a hand-over between the
  // consumer's 128 threads and the dQ writer warp (kDqHandoffThreads: 160).
  static constexpr int kDqFull = kConsumer + kConsumers;
  static constexpr int kDqEmpty = kDqFull + kConsumers * kDqSlots;
  static constexpr int kDqHandoffThreads = kWarpgroupThreads + 32;
  __device__ static constexpr int dq_full(int c, int b) { return kDqFull + kDqSlots * c + b; }
  __device__ static constexpr int dq_empty(int c, int b) { return kDqEmpty + kDqSlots * c + b; }
  // Deferred dQ (BwdConfig::kDeferDq, two consumers): consumer c is done with step n's shared tiles, i.e. has written
  // its half of dS^T of step n and its dQ GEMM has read both halves of step n - 1's; its dV_j and dK_j GEMMs may still
  // run (kStepDone + 2 c + n % 2, 256 threads: c arrives, the other consumer syncs; two ids, since c may finish step
  // n + 1 before the other has synced on step n). Consumer 1 also starts behind consumer 0 (kDsWritten, not
  // needed otherwise then).
  static constexpr int kStepDone = kDqEmpty + kConsumers * kDqSlots;
  static constexpr int kEnd = kStepDone + (kConsumers == 2 ? 2 * 2 : 0);
  static_assert(kEnd <= 16, "a block has 16 named barriers");
};

static_assert(ForwardBarriers::kEnd <= 16, "a block has 16 named barriers");

}  // namespace flashlab::cuda::fa3_ws
