#pragma once
// cuda-fa3-ws backward, dQ_accum's bookkeeping: where a piece of dQ_i lies, the order (deterministic mode) and the
// count of the additions it receives, and the dQ writer warp that adds the consumers' staged pieces with bulk
// reductions. Read by the consumers (d = 256 adds from the registers) and by the dQ conversion.
#include <cstdint>

#include "core/mask.hpp"
#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {

// Spins until *counter == value (acquire: the K/V blocks counted there have finished their additions), with
// kSleepNs of __nanosleep between polls where the poller has nothing else to do (dQ's conversion).
template <unsigned kSleepNs = 0>
__device__ __forceinline__ void wait_counter(const int* counter, int value) {
  int seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    if (seen == value) return;
    if constexpr (kSleepNs > 0) __nanosleep(kSleepNs);
  }
}
// Orders this thread's async-proxy (bulk copy) global accesses with its generic ones.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// How many additions to consumer c's dQ piece of Q_i come before its own in deterministic mode (DqSplit::Keys:
// both consumers of a block add to each piece, consumer 0 first). Without a causal mask K/V block 0 adds
// first, then 1, 2, ...: every block walks the query blocks from the first. Under a causal mask block j
// starts at query block i_first(j), later than block j - 1 does, so in that order it would reach every query
// block before its predecessor and wait there, and the blocks would run one after another: the order is
// reversed instead (the last K/V block that sees Q_i adds first), so that each block's predecessor in the
// order is ahead of it in its walk (and key_block launches the blocks in that order).
template <class Cfg>
__device__ int dq_turn(const Params& p, const KeyBlock& kb, int i, int c) {
  int turn = kb.j;
  if (p.align != CausalAlign::None) {
    const int last_row = min((i + 1) * Cfg::kBr, p.seq_q) - 1;
    turn = last_visible_key(p.align, last_row, p.seq_q, p.seq_k) / Cfg::kBc - kb.j;
  }
  return Cfg::kDqAddsPerBlock > 1 ? Cfg::kConsumers * turn + c : turn;
}

// How many additions a piece of dQ_i receives in all, and so the count its counter reaches once its sum is
// complete: one per K/V block that sees query block i (every block without a causal mask; with one, blocks
// 0 .. the one holding the block's last row's last visible key), and at d = 64 (both consumers add to each
// piece) one per consumer of each. dq_turn numbers them 0 .. this - 1 in deterministic mode.
template <class Cfg>
__device__ int dq_additions(const Params& p, int i) {
  int blocks = (p.seq_k + Cfg::kBc - 1) / Cfg::kBc;
  if (p.align != CausalAlign::None) {
    const int key = last_visible_key(p.align, min((i + 1) * Cfg::kBr, p.seq_q) - 1, p.seq_q, p.seq_k);
    blocks = key < 0 ? 0 : key / Cfg::kBc + 1;
  }
  return Cfg::kDqAddsPerBlock * blocks;
}

// Counts one completed addition to dQ_accum's piece `piece` (release: the conversion that reads the count
// sees the sum it counts).
__device__ __forceinline__ void count_dq_addition(const Params& p, std::int64_t piece) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p.dq_semaphore + piece) : "memory");
}

// Where consumer c's piece of dQ_i (head h) lies in dQ_accum (in pieces) and among the counters: over (B, H_q, query
// block i, piece), the one piece of a query block at d = 64 and Br = 64. (At Br = 128, c is the row piece.)
template <class Cfg>
__device__ std::int64_t dq_piece_index(const Params& p, const KeyBlock& kb, int h, int i, int c) {
  return ((std::int64_t(kb.b) * p.heads_q + h) * kb.n_q + i) * Cfg::kDqPieces + (Cfg::kDqPieces > 1 ? c : 0);
}

// Adds staged piece `staging` (consumer c, query block i of head h) to dQ_accum with one bulk reduction. In
// deterministic mode after the pieces before it in dq_turn's order, then waits for it to complete and counts
// it; otherwise write_dq counts it a step later.
template <class Cfg>
__device__ void reduce_dq_piece(const Params& p, const KeyBlock& kb, const float* staging, int h, int i, int c) {
  const std::int64_t piece = dq_piece_index<Cfg>(p, kb, h, i, c);
  if (p.deterministic) {
    wait_counter(p.dq_semaphore + piece, dq_turn<Cfg>(p, kb, i, c));
    fence_proxy_async_global();
  }
  ptx::cp_reduce_async_bulk(ptx::space_global, ptx::space_shared, ptx::op_add, p.dq_accum + piece * Cfg::kDqPieceFloats,
                            staging, Cfg::kDqBytes);
  ptx::cp_async_bulk_commit_group();
  if (p.deterministic) {
    ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});  // the addition is done in global memory
    fence_proxy_async_global();
    count_dq_addition(p, piece);
  }
}

// Default mode: counts the additions of steps [from, to) once they are complete, that is once at most kPending
// bulk groups issued after them are pending: one fence, then a relaxed addition per piece (release by the fence).
// Lane 0.
constexpr int kDqCountSteps = 8;  // steps counted at a time
template <class Cfg, int kPending>
__device__ void count_dq_steps(const Params& p, const KeyBlock& kb, int from, int to) {
  ptx::cp_async_bulk_wait_group(ptx::n32_t<kPending>{});
  fence_proxy_async_global();
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#pragma unroll 1
  for (int m = from; m < to; ++m) {
    const std::int64_t first = dq_piece_index<Cfg>(p, kb, kb.head(m), kb.q_block(m), 0);
#pragma unroll
    for (int c = 0; c < Cfg::kDqPieces; ++c)  // d = 64: both consumers' additions to each piece
      asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p.dq_semaphore + first + c), "r"(Cfg::kDqAddsPerBlock)
                   : "memory");
  }
}

// Br = 128 at d = 64 (BwdConfig::kDqRowPieces): where consumer c stages its piece pc of a step, as two halves of
// kDqBytes / 2 (the piece's registers 4 q .. 4 q + 3 of every thread for q < 4, then the rest): piece 0 in its
// staging buffer, piece 1 in its 64 rows of P^T, whose two 64-query panels are 8 KiB apart from each other's rows.
template <class Cfg>
__device__ unsigned char* dq_row_piece_half(unsigned char* smem, int c, int pc, int half) {
  static_assert(Cfg::kDqRowPieces && kKeysPerConsumer * kPanelRowBytes == Cfg::kDqBytes / 2,
                "a consumer's rows of one P^T panel hold half a dQ piece");
  if (pc == 0) return smem + Cfg::kDqOffset + c * Cfg::kDqBytes + half * (Cfg::kDqBytes / 2);
  return smem + Cfg::kPtOffset + half * Cfg::kBc * kPanelRowBytes + c * kKeysPerConsumer * kPanelRowBytes;
}

// Adds consumer c's staged row piece pc of dQ_i (head h) to dQ_accum with two bulk reductions (one commit group);
// in deterministic mode after the additions before it in dq_turn's order, then waits for it and counts it.
template <class Cfg>
__device__ void reduce_dq_row_piece(const Params& p, const KeyBlock& kb, unsigned char* smem, int h, int i, int c, int pc) {
  const std::int64_t piece = dq_piece_index<Cfg>(p, kb, h, i, pc);
  if (p.deterministic) {
    wait_counter(p.dq_semaphore + piece, dq_turn<Cfg>(p, kb, i, c));
    fence_proxy_async_global();
  }
#pragma unroll
  for (int half = 0; half < 2; ++half)
    ptx::cp_reduce_async_bulk(ptx::space_global, ptx::space_shared, ptx::op_add,
                              p.dq_accum + piece * Cfg::kDqPieceFloats + half * (Cfg::kDqPieceFloats / 2),
                              reinterpret_cast<const float*>(dq_row_piece_half<Cfg>(smem, c, pc, half)), Cfg::kDqBytes / 2);
  ptx::cp_async_bulk_commit_group();
  if (p.deterministic) {
    ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});
    fence_proxy_async_global();
    count_dq_addition(p, piece);
  }
}

// The dQ writer at Br = 128 (d = 64): per step and consumer, takes its two pieces as they are handed over (staging
// buffer, then P^T's rows; Barriers::dq_full(c, pc)), adds them, and hands both places back once the
// copy engine has read them. Counted as write_dq counts.
template <class Cfg>
__device__ void write_dq_row_pieces(const Params& p, const KeyBlock& kb, unsigned char* smem, int lane) {
  using Bars = typename Cfg::Barriers;
  constexpr int kPieces = Cfg::kDqPiecesPerConsumer;
#pragma unroll 1
  for (int n = 0; n < kb.n_steps; ++n) {
    if (lane == 0 && !p.deterministic && n > kDqCountSteps && (n - 1) % kDqCountSteps == 0)  // step n - 1's may pend
      count_dq_steps<Cfg, Cfg::kConsumers * kPieces>(p, kb, n - 1 - kDqCountSteps, n - 1);
    const int h = kb.head(n), i = kb.q_block(n);
#pragma unroll
    for (int c = 0; c < Cfg::kConsumers; ++c) {
#pragma unroll
      for (int pc = 0; pc < kPieces; ++pc) {
        named_barrier_sync(Bars::dq_full(c, pc), Bars::kDqHandoffThreads);
        if (lane == 0) reduce_dq_row_piece<Cfg>(p, kb, smem, h, i, c, pc);
        __syncwarp();
      }
      if (n + 1 < kb.n_steps) {  // the consumer takes both places again at step n + 1
        if (lane == 0) ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
        __syncwarp();
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc)
          named_barrier_arrive(Bars::dq_empty(c, pc), Bars::kDqHandoffThreads);
      }
    }
  }
  if (lane == 0) {
    if (!p.deterministic) count_dq_steps<Cfg, 0>(p, kb, (kb.n_steps - 2) / kDqCountSteps * kDqCountSteps, kb.n_steps);
    ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});  // staging read before the block exits
  }
}

// The dQ writer (the producer warpgroup's second warp): per step, takes each consumer's staged piece
// as it is handed over, adds it, and hands the buffer back once the copy engine has read it: with two buffers a
// consumer, all of a step's at once (the consumers use them two steps later); with one, each as soon as it is read,
// so that no consumer waits for another's piece. Every addition is counted once complete, and convert_dq_kernel
// converts a piece once its count is full. Deterministic mode counts at once; otherwise kDqCountSteps steps at a
// time, with one fence, once the last of them is a step old.
template <class Cfg>
__device__ void write_dq(const Params& p, const KeyBlock& kb, unsigned char* smem, int lane) {
  using Bars = typename Cfg::Barriers;
  constexpr int kBuffers = Cfg::kDqStagingBuffers;
#pragma unroll 1
  for (int n = 0; n < kb.n_steps; ++n) {
    if (lane == 0 && !p.deterministic && n > kDqCountSteps && (n - 1) % kDqCountSteps == 0)  // step n - 1's may pend
      count_dq_steps<Cfg, Cfg::kConsumers * Cfg::kDqPiecesPerConsumer>(p, kb, n - 1 - kDqCountSteps, n - 1);
    const int b = n % kBuffers, h = kb.head(n), i = kb.q_block(n);
#pragma unroll
    for (int c = 0; c < Cfg::kConsumers; ++c) {
      named_barrier_sync(Bars::dq_full(c, b), Bars::kDqHandoffThreads);
      if (lane == 0)
        reduce_dq_piece<Cfg>(p, kb, reinterpret_cast<const float*>(smem + Cfg::kDqOffset + (c * kBuffers + b) * Cfg::kDqBytes), h, i, c);
      __syncwarp();
      if constexpr (kBuffers == 1)
        if (n + 1 < kb.n_steps) {
          if (lane == 0) ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
          __syncwarp();
          named_barrier_arrive(Bars::dq_empty(c, 0), Bars::kDqHandoffThreads);
        }
    }
    if constexpr (kBuffers > 1)
      if (n + kBuffers < kb.n_steps) {
        if (lane == 0) ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
        __syncwarp();
#pragma unroll
        for (int c = 0; c < Cfg::kConsumers; ++c) named_barrier_arrive(Bars::dq_empty(c, b), Bars::kDqHandoffThreads);
      }
  }
  if (lane == 0) {
    if (!p.deterministic) count_dq_steps<Cfg, 0>(p, kb, (kb.n_steps - 2) / kDqCountSteps * kDqCountSteps, kb.n_steps);
    ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});  // staging read before the block exits
  }
}

// kAccumulate: dK_j, dV_j added to p.dk_sum, p.dv_sum in fp32 (a ring's block) rather than written to p.dk, p.dv. A

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
