#pragma once
// cuda-fa3-ws backward: FlashAttention's gradients (Algorithm 2 of FlashAttention-2) on Hopper (sm_90a),
// with the forward's tools: TMA into 128B-swizzled shared memory, wgmma, producer / consumer warpgroups.
// fp16/bf16 in, fp32 accumulation, dQ, dK, dV in the input dtype.
//
// What changed from cuda-fa2's backward (fa2_backward.cu: 8 warps on mma.sync, cp.async copies, P and dS
// through shared memory for their transposes, dQ added with fp32 atomics from the registers), and why:
//  * One thread block per K/V block j, as in cuda-fa2: K_j and V_j stay in shared memory, dK_j and dV_j in the
//    registers, while the block walks the query blocks i that see them (and, under GQA, the query heads
//    of its group, so dK and dV sum over the group without atomics).
//  * Except where that grid is too small for the GPU: GQA with few (batch, K/V head) rows and short keys, as a
//    Llama's training step at batch 1 has (16 query heads on 4 K/V heads, 2k keys: 64 thread blocks for 132 SMs,
//    and under a causal mask the first K/V block has 4 times the average's steps). There the group's query heads
//    are shared among group_splits thread blocks per K/V block (backward_split: the fewest that give every SM two),
//    each writes its partial dK_j, dV_j in fp32, and the last to finish adds them in a fixed order
//    (backward_epilogue.cuh, add_group_splits). Such a small grid under a causal mask is also launched K/V block by
//    K/V block, the longest blocks of every row first (Params::key_blocks_outer, backward_key_blocks_outer): row
//    by row, the last row's longest blocks started when the rest of the GPU was nearly done, and ran alone.
//  * The products are computed transposed. Each consumer warpgroup owns 64 keys (wgmma's M), so it
//    computes S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T (both operands K-major in shared memory, the
//    forward's S GEMM with Q and K swapped). Their accumulators then hold P_ij^T and dS_ij^T with keys
//    as rows, which is exactly the A operand dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i take from the
//    registers (as the forward's P V): P and dS need no trip through shared memory for these two.
//  * dQ_i += dS_ij K_j needs dS with queries as rows: each consumer writes its dS_ij^T to shared memory
//    (keys, queries), and wgmma reads it back as a transposed (MN-major) A operand, with K_j as a
//    transposed B. At d = 128 each consumer computes 64 of dQ_i's columns over all 128 keys (after a
//    barrier of both consumers); at d = 64 all 64 columns over its own 64 keys (DqSplit).
//  * At d = 128 both consumers' halves of dS_ij^T feed each one's piece of dQ_i, so they must wait for each other.
//    Step n's dQ GEMM runs at step n + 1, after the other consumer has finished step n, rather than after a
//    barrier in the middle of step n: the consumers then drift apart, and one's exponentials overlap the other's
//    GEMMs (BwdConfig::kDeferDq). A consumer tells the other it is through step n as soon as
//    its dQ GEMM has read the tiles, not after its dV_j and dK_j GEMMs.
//  * dQ leaves through the copy engine: each consumer stages its piece in shared memory (two buffers) and
//    hands it to a dQ writer warp, which adds it to dQ_accum in global memory with one bulk reduction
//    (cp.reduce.async.bulk .add.f32, 16 KiB) instead of 64 x 64 / 128 fp32 atomics per thread, and hands the
//    buffer back once the copy engine has read it. The consumers never wait on the copy engine (faster on the
//    H100 than a consumer thread issuing the reduction itself, side by side). The piece's GEMM is
//    issued before dV_j's and dK_j's, so that it is staged while they run (not timed apart from the writer). dQ_accum holds the pieces in the
//    consumers' register order (a 16-byte vector per thread per four registers, conflict-free to stage);
//    convert_dq_kernel reads that order back and writes dQ = scale dQ_accum in the input dtype. Each addition
//    is counted once complete, and the conversion, launched to start while the main kernel still runs, takes
//    each piece as soon as its count is full: it runs on the SMs the main kernel's last wave leaves idle
//    instead of after it.
//  * d = 256 (KvSplit::Columns): dK_j and dV_j of 64 keys would take 256 registers a thread, so a block holds 64
//    keys, both consumers see all of them, and they split dK_j, dV_j by columns (128 each) and S^T, dP^T by
//    queries (32 each). P^T and dS^T then go through shared memory for dV_j and dK_j (SS, as dS^T already does
//    for dQ_i). K_j, V_j and the Q_i, dO_i stages take 192 KiB, which leaves no room to stage dQ_i: there the
//    consumers add their pieces from the registers with red.global.add.v4.f32, in the same layout.
//  * At d = 64 a build may take Br = 128 (BwdConfig::kDqRowPieces; FLASHLAB_FA3_BACKWARD_D64_ROWS): half the steps,
//    each twice as long. S^T and dP^T of 128 queries take 128 registers, so P^T and dS^T are stored to this
//    consumer's rows of their tiles pair by pair as they are packed, and dV_j, dK_j read them from there (SS, as at
//    d = 256; kept as A fragments, they spilled). dQ_i leaves as two 64-row pieces per consumer: the shared memory
//    holds one staging buffer per consumer beside the P^T tile, so the second piece is staged in the consumer's rows
//    of P^T once dV_j has read them, and the writer hands those rows back before the next step's P^T is stored.
//  * At d = 64 a thread block may run three consumer warpgroups instead of two (BwdConfig's kC: Bc = 192, 160
//    registers each, dQ_i's piece issued after dV_j and dK_j, one dQ staging buffer each). A step is one chain of
//    waits per consumer, and a third chain fills more of the tensor cores' idle time. But blocks of 192 keys make
//    fewer and longer thread blocks, which a causal mask makes unequal, so the host's plan (backward_plan) estimates
//    both grids by replaying their launch on the GPU's SMs and takes three only where they come out ahead; with three
//    it shares a group among thread blocks and launches the longest blocks first where that evens the grid out.
//  * Deterministic mode (Params::deterministic): before adding a piece of dQ_i, the writer waits on a
//    per-piece counter until the K/V blocks before it (j' < j, all of which see Q_i when block j does)
//    have added theirs, adds, waits for its reduction to complete and counts itself. The sum is then
//    taken in one order, j = 0, 1, ... (causal: from the last K/V block down, with the blocks launched in that
//    order so that none waits for a block that cannot start), and two runs give bit-identical dQ.
//  * A producer warpgroup (24 registers) issues every copy. Its first warp loads K_j and V_j once, then per
//    step Q_i, dO_i (TMA tiles) and L_i, D_i (bulk copies from padded scratch) into one of two stages; its
//    second is the dQ writer. The stages are released by the
//    consumers (240 registers, or 160 with three: dK_j and dV_j of 64 keys, S^T, dP^T and the dQ piece) when the
//    step's GEMMs are done.
//  * The pre-pass (row_stats_kernel) clears dQ_accum and writes D_i = rowsum(dO_i o O_i) and L_i log2(e) into scratch padded
//    to whole query blocks, with +inf for padding rows and rows that saw no key, so exp2(S - L) = 0 there
//    and no mask is needed for them; keys past the end of the sequence are zero-filled by TMA, so their
//    dS_ij contributes K = 0 to dQ_i, and their dK, dV rows are never written.
//
// The parts, one file each under src/cuda/fa3_ws/ (shared with the forward: hopper.cuh and wgmma_ops.cuh, the PTX
// wrappers; element.cuh, the element types; warp_roles.cuh, the register budgets; named_barriers.cuh, the barrier
// ids; timeline_lane.cuh; head_dims.hpp):
//   backward_config.cuh     BwdConfig: the block shape per head dim, the shared-memory layout
//   backward_scheduler.cuh  KeyBlock: which K/V block a thread block takes, its share of the group, and its steps
//   backward_prepass.cuh    row_stats_kernel: D_i, L_i log2(e), dQ_accum and its counters cleared
//   backward_producer.cuh   the TMA copies of K_j, V_j and each step's Q_i, dO_i, L_i, D_i (produce)
//   backward_dq.cuh         dQ_accum's pieces, the order and count of their additions, the dQ writer warp
//   backward_consumer.cuh   per step the five products, then the dQ piece out (Consumer)
//   backward_epilogue.cuh   dK_j and dV_j out (or, group splits, the partial sums and their addition)
//   backward_kernel.cuh     this file: the kernel shell (warp roles, barriers)
//   convert_dq.cuh          convert_dq_kernel: dQ = scale dQ_accum in the input dtype
//   backward.cu             the host launchers (launch_backward, launch_backward_timeline) and the scratch sizes
// Notation as the paper's: Q_i, dO_i (Br, d), K_j, V_j (Bc, d), S_ij, P_ij, dP_ij, dS_ij (Br, Bc), L_i, D_i (Br).
#include <cstdint>

#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_consumer.cuh"
#include "cuda/fa3_ws/backward_dq.cuh"
#include "cuda/fa3_ws/backward_producer.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false, int kC = kConsumers>
__global__ void __launch_bounds__(BwdConfig<D, kDropout, kC>::kThreads, 1)
    fa3_ws_backward_kernel(const __grid_constant__ Params p, const __grid_constant__ BwdMaps maps) {
  using Cfg = BwdConfig<D, kDropout, kC>;
  static_assert(ElementTraits<T>::kBytes == kBackwardElemBytes, "the backward's tiles are laid out for 16-bit elements");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + swizzle_atom_pad(smem_raw);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + Cfg::kBarOffset);
  if (threadIdx.x == 0) {
    mbar_init(&bars[Cfg::kKVFull], 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bars[Cfg::kFull + s], 1);
      mbar_init(&bars[Cfg::kEmpty + s], Cfg::kConsumers * kWarpsPerWarpgroup);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // dQ's conversion may start (convert_dq_kernel)
  const KeyBlock kb = key_block<Cfg::kBr, Cfg::kBc>(p);
  const int wg = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int tid = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  if (wg == 0) {
    enter_producer_role();
    if (tid / 32 == 0 && elect_one()) {
      TimelineLane<kTimeline> tl;
      tl.start(p, blockIdx.y == 0);
      produce<Cfg>(p, maps, kb, smem, bars, tl);
    }
    if constexpr (Cfg::kDqWriter)
      if (tid / 32 == 1) {
        if constexpr (Cfg::kDqRowPieces) write_dq_row_pieces<Cfg>(p, kb, smem, tid % 32);
        else write_dq<Cfg>(p, kb, smem, tid % 32);
      }
  } else {
    enter_consumer_role<Cfg::kConsumerRegs>();
    const int lane = tid % 32;
    const Consumer<T, D, kDropout, kTimeline, kAccumulate, kC> consumer{p, kb, smem, bars, wg - 1, tid, tid / 32, lane / 4, lane % 4};
    consumer.tl.start(p, tid == 0 && blockIdx.y == 0);  // the first kTimelineBlocks thread blocks launched
    consumer.run();
  }
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
