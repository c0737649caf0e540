#pragma once
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
//    P_ij of 64 rows each (three consumers take 160: warp_roles.cuh). mbarriers with full / empty
//    phases replace __syncthreads.
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
//  * At d = 64 the persistent kernel has three consumer warpgroups (Br = 192, 160 registers each, Bc = 128)
//    wherever their taller tiles pad the queries little (cuda/tilings.hpp, forward_choice): the ping-pong
//    becomes a ring of three turns, and two consumers' softmax hides under the third's GEMMs, which at d = 64
//    are too short to hide one softmax alone (HeadConfig).
//
// The parts, one file each under src/cuda/fa3_ws/:
//   forward_config.cuh    what a kernel is built with: ladder step, head dim, Schedule; shared-memory layout
//   named_barriers.cuh    the named barriers' ids, who meets at each and why (both passes)
//   warp_roles.cuh        the producer's and consumers' registers, the shared-memory limit (both passes)
//   element.cuh           ElementTraits (width, wgmma K, TMA type, pack), with_element (both passes)
//   head_dims.hpp         the head-dim lists of cuda/constraints.hpp as the launchers assert them (both passes)
//   tile_scheduler.cuh    which tile a block takes, in what order; the persistent grid's counter
//   producer.cuh          the TMA copies of Q_i, K_j, V_j (Loader); the FP8 V transpose's loop (transpose_v_blocks)
//   fp8_transpose_v_smem.cuh  FP8: one warp's share of V_j -> V_j^T in shared memory (ldmatrix, stmatrix)
//   online_softmax.cuh    m_i, l_i, P_ij, the rescale of O_i, L_i (OnlineSoftmax)
//   forward_consumer.cuh  the mainloop (the GEMMs and their order) and the tile loop (Consumer)
//   forward_epilogue.cuh  O_i and L_i out
//   forward_kernel.cuh    this file: the kernel shell (warp roles, barriers, the tile loop) and its launch
//   forward.cu            the shipped entry points; forward_timeline.cu the same kernels with the timeline hook
// Notation as the paper's: Q_i (Br, d), K_j and V_j (Bc, d), S_ij and P_ij (Br, Bc), running row max m_i
// and row sum l_i, O_i (Br, d), L_i = m_i + log l_i.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda/dispatch.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/forward_config.cuh"
#include "cuda/fa3_ws/forward_consumer.cuh"
#include "cuda/fa3_ws/head_dims.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/host_checks.hpp"
#include "cuda/fa3_ws/producer.cuh"
#include "cuda/fa3_ws/tile_scheduler.cuh"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa3_ws {


template <class T, int D, int kStep, bool kDropout, bool kTimeline, class Sched>
__global__ void __launch_bounds__(KernelConfig<T, D, kStep, Sched>::kThreads, 1)
    fa3_ws_kernel(const __grid_constant__ Params p, const __grid_constant__ TmaMaps maps, int total_tiles) {
  using Cfg = KernelConfig<T, D, kStep, Sched>;
  using Smem = typename Cfg::Smem;
  // Q_i and K_j are panels kPanelRowBytesOf<T, D> bytes a row (128; 64 for e4m3 at d = 64): each consumer's 64 rows
  // of Q_i start on a swizzle atom of that width, as its descriptors (desc_k_major) assume.
  static_assert(kRowsPerConsumer * kPanelRowBytesOf<T, D> % Swizzle<kPanelRowBytesOf<T, D>>::kAtomBytes == 0,
                "each consumer's rows of Q_i start on a swizzle atom");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + swizzle_atom_pad(smem_raw);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + Smem::kBarOffset);
  if (threadIdx.x == 0) {
    constexpr int kReleases = Cfg::kConsumers * kWarpsPerWarpgroup;  // one arrival per consumer warp
    mbar_init(&bars[Smem::kQFull], 1);
    mbar_init(&bars[Smem::kQEmpty], kReleases);
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&bars[Smem::kKFull + s], 1);
      mbar_init(&bars[Smem::kVFull + s], Cfg::kVFullArrivals);
      mbar_init(&bars[Smem::kKEmpty + s], kReleases);
      mbar_init(&bars[Smem::kVEmpty + s], kReleases);
    }
    for (int s = 0; s < Smem::kStagingStages; ++s) {  // V transposed in the producer: TMA fills, its warps empty
      mbar_init(&bars[Smem::kStagedFull + s], 1);
      mbar_init(&bars[Smem::kStagedEmpty + s], kTransposeWarps);
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
      // ---- producer: one elected thread of warp 0 issues every copy; warps 1-3 only give back registers, or
      // (Cfg::kTransposesV) make each V_j^T from the V_j that thread stages (transpose_v_blocks).
      enter_producer_role<Cfg::kProducerRegisters>();
      if constexpr (Cfg::kTransposesV) {  // first, so that nothing it holds stays live through the issuer's code
        static_assert(Cfg::kPersistent, "V is transposed in the producer at the persistent step only");
        const auto warp = static_cast<unsigned>(tid / 32);
        if (warp > 0) transpose_v_blocks<Cfg>(smem, warp - 1, static_cast<unsigned>(lane));
      }
      if (tid / 32 == 0 && elect_one()) {
        TimelineLane<kTimeline> tl;
        tl.start(p, true);
        // The K/V blocks of one tile, in the order the consumers take them.
        auto load_tile_kv = [&](const Tile& tile, std::uint32_t kv_iter, bool k0_issued) {
          const int n = tile.n_blocks;
          if constexpr (Sched::kKAhead) {
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
            const Tile tile = make_tile<Cfg::kBr, Cfg::kBc, tile_order<Sched, true>()>(p, ti);
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
          if constexpr (Cfg::kTransposesV) loader.end_v_staging(kv_iter);
          finish_tiles(p);
        } else {
          const Tile tile = make_tile<Cfg::kBr, Cfg::kBc, tile_order<Sched, false>()>(p, static_cast<int>(blockIdx.x));
          loader.load_q(tile, 0, tl, p);
          load_tile_kv(tile, 0, false);
        }
      }
    } else {
      // ---- consumers
      enter_consumer_role<Cfg::kConsumerRegisters>();
      const Consumer<T, D, kStep, kDropout, kTimeline, Sched> consumer{p, &loader, smem, bars, wg - 1, wg, tid, tid / 32, lane / 4, lane % 4};
      consumer.tl.start(p, tid == 0);
      consumer.run(total_tiles);
    }
  } else {
    const Consumer<T, D, kStep, kDropout, kTimeline, Sched> consumer{p, &loader, smem, bars, 0, wg, tid, tid / 32, lane / 4, lane % 4};
    consumer.tl.start(p, tid == 0);
    consumer.run(total_tiles);
  }
}

// ---- launch ---------------------------------------------------------------------------------------------------


template <class F, std::size_t... I>
bool dispatch_step_impl(int step, F&& f, std::index_sequence<I...>) {
  return ((step == static_cast<int>(I) + 1 ? (f.template operator()<static_cast<int>(I) + 1>(), true) : false) || ...);
}
// Calls f.template operator()<kStep>() for the ladder step (1..kLadderSteps).
template <class F>
void dispatch_step(LadderStep step, F&& f) {
  if (!dispatch_step_impl(static_cast<int>(step), f, std::make_index_sequence<kLadderSteps>{}))
    precondition_failed("ladder steps are 1 to " + std::to_string(kLadderSteps) + ", not " +
                        std::to_string(static_cast<int>(step)));
}


// `heads_per_group`: step 5's tile order, 0 for the launcher's choice (what ships: forward.cu passes none);
// tools/fa3_harness's candidates pass others to race them.
template <class T, int D, int kStep, bool kDropout, bool kTimeline, class Sched>
void launch_config(const Params& p, cudaStream_t stream, int heads_per_group_given = 0) {
  using Cfg = KernelConfig<T, D, kStep, Sched>;
  using E = ElementTraits<T>;
  TmaMaps maps;
  maps.q = make_bshd_tensor_map(p.q, E::kTensorMapType, E::kBytes, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.k = make_bshd_tensor_map(p.k, E::kTensorMapType, E::kBytes, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  if constexpr (Cfg::kE4m3 && !Cfg::kTransposesV)  // V^T, from the pre-pass (launch_forward_e4m3): a panel's keys by d
    maps.v = make_vt_tensor_map(p.vt, p.batch, p.heads_kv, D, fp8_vt_keys(p.seq_k), D, Cfg::kVtPanelKeys);
  else maps.v = make_bshd_tensor_map(p.v, E::kTensorMapType, E::kBytes, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  auto kernel = fa3_ws_kernel<T, D, kStep, kDropout, kTimeline, Sched>;
  constexpr int kSmem = Cfg::Smem::kBytes;
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), kSmem);
  const long long total = static_cast<long long>((p.seq_q + Cfg::kBr - 1) / Cfg::kBr) * p.batch * p.heads_q;
  expect(total <= kMaxQueryTiles, [] { return "at most " + std::to_string(kMaxQueryTiles) + " tiles"; });
  int grid = static_cast<int>(total);
  expect(p.heads_per_group == 0, "Params::heads_per_group is the launcher's to set");
  Params params = p;
  if constexpr (Cfg::kPersistent) {
    expect(p.tile_counter != nullptr, "step 5 needs Params::tile_counter (two zeroed ints on the device)");
    const GpuFacts gpu = current_gpu();
    const int sms = gpu.sms, l2_bytes = gpu.l2_bytes;
    grid = grid < sms ? grid : sms;
    // Heads per group of the tile order (cuda/tilings.hpp): as many KV heads as have K and V fit in half
    // the L2 (the H100's L2 is two partitions), times the query heads that share each. Under a causal mask
    // over 4096 keys or more, four times as many: measured on the H100 (fa3_harness --hpg,
    // bench/results/h100-fa3-ws-notes.md), larger groups ran faster there at d = 128 and 256, but slower
    // below 4096 keys, and even or slower without a mask. Why is not pinned down yet (no counters taken
    // on it).
    const Shape shape{.batch = p.batch, .heads_q = p.heads_q, .heads_kv = p.heads_kv, .seq_q = p.seq_q,
                      .seq_k = p.seq_k, .head_dim = D};
    params.heads_per_group = heads_per_group_given > 0 ? heads_per_group_given
                                                       : heads_per_group(l2_bytes, shape, ElementTraits<T>::kBytes,
                                                                         p.align != CausalAlign::None);
  }
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(params, maps, static_cast<int>(total));
  check_cuda(cudaGetLastError(), "the kernel launch");
}

// The schedule that ships without dropout, for this problem (cuda/tilings.hpp, forward_choice): wider K/V blocks for
// long keys at d = 64 and 128 (HeadConfig says why) from step 2 on, and at d = 64 from step 5 on three consumer
// warpgroups wherever their 192-row tiles pad the queries little, at any key length; where they would pad them
// more (few queries, a decode step), two, on the wide blocks if the keys are long. Step 1's block is one warpgroup:
// with the narrow blocks two fit an SM at d = 64 (104 KiB each), with the wide ones only one (152 KiB), and step 1
// lost a third of its speed there (H100, N >= 2k). (Dropout keeps the narrow blocks: forward.cu.) Steps 6 and 7 are
// step 5 with one of FlashAttention-4's switches flipped (RungSchedule).
template <int D, int kStep, class F>
void with_shipped_schedule(const Params& p, F&& launch) {
  const ForwardChoice choice = forward_choice(D, p.seq_q, p.seq_k, p.align != CausalAlign::None, false, kStep);
  constexpr bool kThreeByDefault = HeadConfig<D, ShippedSchedule<true>, StepConfig<kStep>::kPersistent>::kConsumers == 3;
  if (choice.consumers == 3 || (choice.wide && !kThreeByDefault)) {
    launch.template operator()<RungSchedule<kStep, ShippedSchedule<true>>>();
  } else if (choice.wide) {
    if constexpr (kThreeByDefault) launch.template operator()<RungSchedule<kStep, WithConsumers<ShippedSchedule<true>, 2>>>();
  } else {
    launch.template operator()<RungSchedule<kStep, ShippedSchedule<false>>>();
  }
}

// What every entry asserts before it touches the GPU (the registry checked it): the dtype, the head dim (in
// kHeadDims, which the entries then dispatch on through cuda/dispatch.cuh) and the GPU.
inline void check_launch(DType dtype, const Params& p) {
  expect(dtype == DType::F16 || dtype == DType::BF16, "the inputs are f16 or bf16");
  expect(lists_head_dim<kHeadDims>(p.head_dim), [&] {
    return "the head dim is one of " + listed_head_dims<kHeadDims>() + ", not " + std::to_string(p.head_dim);
  });
  expect(on_hopper(), "the GPU has compute capability 9.0");
}
// The same for the FP8 forward (launch_forward_e4m3 and its timeline build): its head dims, no dropout, the
// descales and V^T's scratch (`needs_vt`: not with V transposed in the producer, launch_forward_e4m3_vt_in_smem).
inline void check_launch_e4m3(const Params& p, bool needs_vt = true) {
  expect(lists_head_dim<kE4m3HeadDims>(p.head_dim), [&] {
    return "the FP8 forward's head dim is one of " + listed_head_dims<kE4m3HeadDims>() + ", not " +
           std::to_string(p.head_dim);
  });
  expect(on_hopper(), "the GPU has compute capability 9.0");
  expect(!p.dropout, "the FP8 forward has no dropout");
  expect(p.q_descale != nullptr && p.k_descale != nullptr && p.v_descale != nullptr,
         "the FP8 forward needs Q's, K's and V's descales");
  expect(!needs_vt || p.vt != nullptr, "the FP8 forward needs V^T's scratch (fp8_vt_bytes)");
}

}  // namespace flashlab::cuda::fa3_ws
