#pragma once
// Ring attention as the command line reaches it: model/ring.hpp's schedule run on a transport, with the problem
// checked first. On one GPU the P ranks are P streams and the hops device-to-device copies (cuda/ring.hpp);
// each block is one launch of a block kernel, cuda-fa3-ws (Hopper) or cuda-fa2 (kRingBlockKernels), so a problem must
// be one that kernel runs. Over NCCL each rank is a process
// on a GPU of its own (cuda/ring_nccl.hpp), started by `flashlab ring --gpus P`.
#include <optional>
#include <string>

#include "core/bench.hpp"
#include "core/problem.hpp"
#include "model/ring.hpp"
#include "model/timeline.hpp"
#include "registry/check.hpp"

namespace flashlab {

// The variants a ring's blocks can run on; the first is the default.
inline constexpr const char* kRingBlockKernels[] = {"cuda-fa3-ws", "cuda-fa2"};
// Throws InputError, in one sentence, unless `blocks` is one of kRingBlockKernels.
void check_ring_block_kernel(const std::string& blocks);

// Times the ring of P ranks in `layout` on the current GPU: whole forward (and, with settings.backward,
// backward) passes on random inputs, as Variant::bench times a kernel. Throws InputError, in one sentence, when
// built without CUDA, for what cuda-fa3-ws refuses (GPU, dtype, head dim), for what the schedule refuses (a
// length the layout cannot share out) and for what the GPU ring refuses (dropout; diagonal blocks that would
// need their rows split), and when the device runs out of memory.
BenchResult bench_ring_on_one_gpu(RingLayout layout, int ranks, const Problem& p, DType dtype,
                                  const BenchSettings& settings, const std::string& blocks = kRingBlockKernels[0]);

// ---- over NCCL --------------------------------------------------------------------------------------------

// Throws InputError, in one sentence, unless a ring of P ranks of `layout` over NCCL could run the problem: built
// with CUDA and NCCL, at least P GPUs, each one the block kernel runs on, and what the GPU ring refuses.
void check_nccl_ring(RingLayout layout, int ranks, const Problem& p, DType dtype, bool backward,
                     const std::string& blocks = kRingBlockKernels[0]);
// A fresh rendezvous id for one ring's processes, as hex (NcclRingId).
std::string new_nccl_ring_id();

struct RingRankRequest {
  RingLayout layout = RingLayout::Zigzag;
  int ranks = 1, rank = 0;
  int device = -1;      // the GPU this rank runs on (a launcher's LOCAL_RANK); -1: GPU `rank`, as on one host
  std::string nccl_id;  // new_nccl_ring_id()'s, the same for every rank
  Problem problem;
  DType dtype = DType::BF16;
  std::string blocks = kRingBlockKernels[0];  // the block kernel
  bool backward = false;
  bool check = false;     // one run on check_inputs(), checked against the reference on rank 0; else timed runs
  int warmup = 1, iters = 3;
  bool one_shot = true;   // timed runs: rank 0 also times the block kernel on the whole problem, alone on its GPU
  bool timeline = false;  // timed runs: record the last run of each pass, every rank's spans (not with check)
};

struct RingRankReport {
  double forward_ms = -1, backward_ms = -1;  // median of the slowest rank's pass
  std::optional<CheckReport> check;          // rank 0 of a check
  std::optional<BenchResult> one_shot;       // rank 0 of timed runs with one_shot
  std::string one_shot_skipped;              // why it could not run (out of memory at a length only the ring fits)
  // Rank 0 of timed runs with timeline: each pass's ring timeline (model/ring_timeline.hpp), every rank's spans
  // of the last timed run, device this rank's GPU.
  std::optional<Timeline> forward_timeline, backward_timeline;
};

// What this process does as rank `rank` of the ring, on GPU `device` (default: GPU `rank`). Every rank must call it with the same
// request but its rank; it returns when this rank is done. Throws as check_nccl_ring, InputError for timeline with
// check, and std::runtime_error naming a failed NCCL or CUDA call.
RingRankReport run_ring_rank(const RingRankRequest&);

}  // namespace flashlab
