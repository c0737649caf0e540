#pragma once
// A ring's measured timeline (model/timeline.hpp's ring lanes) from the CUDA-event stamps each rank of an NCCL
// ring (cuda/ring_nccl.hpp) records over one pass. Each rank writes its stamps into an array of one fixed size,
// the same on every rank and known from the schedule alone, so that the ranks' arrays can be gathered as one
// block; once gathered, the array becomes a Timeline with the run's info. The transport fills the array, the
// registry makes the Timeline, the command writes it; this file is the part that needs no GPU.
//
// Clocks: CUDA events of different GPUs have no common zero, so each rank counts from a reference of its own,
// an event recorded on its communication stream as the all-reduce of the barrier before the pass completes.
// That all-reduce ends on every rank within about P - 1 NCCL hops of the others (microseconds), which bounds
// how far apart the ranks' zeros are; the spans are milliseconds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "model/ring.hpp"
#include "model/timeline.hpp"
#include "model/traffic.hpp"  // Pass

namespace flashlab {

// A stamp that was not taken: the span did not happen at that step (a skipped block, no K/V hop at the last step).
inline constexpr std::int64_t kNoStamp = -1;

// Where a span's two stamps (begin, end: ns after the rank's reference) go in a rank's array. Spans of a step, in
// order: `blocks_per_step` compute spans, as many merge spans, the K/V hop, the dK/dV partials hop; steps in order.
// Span k's stamps are at 2k and 2k + 1.
struct RingStampLayout {
  int steps = 1;            // P
  int blocks_per_step = 1;  // the most compute (and merge) spans a rank has at one step

  std::size_t spans_per_step() const { return 2 * std::size_t(blocks_per_step) + 2; }
  std::size_t spans_per_rank() const { return std::size_t(steps) * spans_per_step(); }
  std::size_t stamps_per_rank() const { return 2 * spans_per_rank(); }
  // Span indices (throw std::out_of_range outside the layout).
  std::size_t compute(int step, int block) const;
  std::size_t merge(int step, int block) const;
  std::size_t kv_hop(int step) const;
  std::size_t partials_hop(int step) const;
  bool operator==(const RingStampLayout&) const = default;
};

// Forward: a compute span and a merge span for each block pair of a step (ring.steps[s][r].pairs; a skipped pair
// leaves its two empty), so blocks_per_step is the most pairs any rank has at a step. Backward: one compute span
// a step (its pairs' block backward, which adds into dQ and the partials itself) and one merge span (adding the
// partials that arrived from the rank before).
RingStampLayout ring_stamp_layout(const RingSchedule&, Pass);

// What the run was, beyond its schedule, for the Timeline's device, label and info.
struct RingTimelineRun {
  Pass pass = Pass::Forward;
  Shape shape;  // its seq_q and seq_k are the schedule's
  DType dtype = DType::BF16;
  std::string block_kernel{};  // "cuda-fa3-ws"
  std::string device{};        // the GPU's name
  int warmup = 0, iters = 1;   // the stamps are of the last of the `iters` timed runs after `warmup` untimed ones
  std::string link{};          // how the ranks are linked, when the caller knows it: info "link" ("" leaves it out)
};

// The gathered stamps (rank after rank, layout.stamps_per_rank() each, ns after each rank's reference) as a ring
// Timeline: variant "ring", one lane per rank (block) and stream (warpgroup 0 compute, 1 communication), each span
// with its step; info has "ranks", "layout", "pass", "batch", "heads", "heads_kv", "seq" (and "seq_k" when it
// differs), "head_dim", "causal", "dtype", "block_kernel", "transport", "iteration", "clock", "hop_bytes" (what
// each rank sends per K/V hop: K and V of the largest share), in the backward "partials_bytes" (the same for
// the fp32 dK/dV partials), "send_recv" (what the communication lane's spans are), and "link" when given.
// Throws std::logic_error when the array is not the layout's size for the schedule's ranks, InputError for a
// span with one stamp of two, or one that ends before it begins.
Timeline ring_timeline(const RingSchedule&, const RingTimelineRun&, const RingStampLayout&,
                       const std::vector<std::int64_t>& stamps);

// Where a pass's timeline is written, given the path of --timeline: the forward's at `path`, the backward's with
// "-backward" before a final ".json" (run.json -> run-backward.json), or after the path when it has none.
std::string ring_timeline_path(const std::string& path, Pass);

}  // namespace flashlab
