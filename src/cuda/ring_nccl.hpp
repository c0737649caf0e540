#pragma once
// Ring attention over NCCL: one rank of model/ring.hpp's schedule in this process, on the current GPU, one
// process per GPU (`flashlab ring --gpus P` starts them). What each rank keeps and computes is the one-GPU
// ring's (ring_rank.cuh); only the transport differs: the K/V share goes to rank + 1 with NCCL's grouped
// send / recv on a communication stream, overlapped with the compute on the share in hand, and in the backward
// each share's fp32 dK/dV partials follow it. NCCL refuses two ranks on one GPU, so on one GPU this runs with
// one rank (a smoke test of the path) and the P-rank ring runs as streams instead (ring.hpp).
//
// Timed runs hold no global tensors: each rank makes its queries and its share in place (random), so N is bounded
// by what one rank keeps, its tokens and the shares in flight. A run to check holds the problem's whole q, k, v
// (and dO) on every rank, in the global (B, S, H, D) layout, and each rank writes only its own tokens.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/bench.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cuda/ring.hpp"  // RingBlockKernel
#include "model/ring.hpp"
#include "model/ring_timeline.hpp"

namespace flashlab {

// The rendezvous of a ring's processes: NCCL's unique id, made once by the launcher and handed to every rank.
struct NcclRingId {
  std::array<unsigned char, 128> bytes{};
  std::string to_hex() const;
  static NcclRingId from_hex(const std::string&);  // throws InputError for anything but 256 hex digits
};
bool nccl_available();  // false when built without NCCL
NcclRingId nccl_ring_id();  // ncclGetUniqueId; throws InputError when built without NCCL

// What one rank runs: the timed passes on random shares made in place, or, with `inputs`, one forward (and
// backward) on them.
struct NcclRankPlan {
  RingBlockKernel kernel = RingBlockKernel::Fa3Ws;
  bool backward = false;
  int warmup = 1, iters = 3;
  const Qkv* inputs = nullptr;  // host inputs (every rank the same): run once, outputs gathered on rank 0
  const HostTensor* d_o = nullptr;  // with inputs and backward
  // Timed runs: also record, with CUDA events, the spans of the last timed run of each pass (each block's
  // compute and merge, each hop) and gather every rank's on rank 0 (model/ring_timeline.hpp). Off, nothing is
  // recorded beyond what the ring needs.
  bool timeline = false;
};

// One pass's spans from every rank, rank after rank: ns after each rank's reference (model/ring_timeline.hpp).
struct NcclPassStamps {
  RingStampLayout layout;
  std::vector<std::int64_t> stamps;
};

// What it reports. Times: the median over iterations of each pass's slowest rank (ms); outputs: on rank 0
// of a run with inputs, every rank's tokens gathered (a sum over ranks of outputs each rank zeroed and then
// wrote its tokens of); stamps: on rank 0 of timed runs with plan.timeline, each pass's.
struct NcclRankOutcome {
  double forward_ms = -1, backward_ms = -1;
  ForwardOut forward;
  Grads grads;
  std::optional<NcclPassStamps> forward_stamps, backward_stamps;
};

// Joins the ring as rank `rank` of ring.ranks on the current GPU and runs the plan. What the one-GPU ring takes
// (check_gpu_ring_problem): f16 or bf16, the block kernel's head dims (and GPU), no dropout. Throws InputError for what it refuses,
// std::runtime_error naming the NCCL or CUDA call that failed.
NcclRankOutcome nccl_ring_rank(const RingSchedule& ring, int rank, const NcclRingId& id, const Problem& p, DType dtype,
                               const NcclRankPlan& plan);

}  // namespace flashlab
