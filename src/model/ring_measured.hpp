#pragma once
// What a measured ring timeline says (model/timeline.hpp: one lane per rank and stream, each span with its
// ring step), put beside the ring's model (model/ring.hpp). From the spans alone:
//
//   per step     the slowest rank's compute, the step's wall time, and for each transfer how much of it was
//                hidden behind the same rank's compute stream
//   the link     the bandwidth each transfer implies (its bytes / its duration), median and best
//   the ranks    the rate they computed at: the schedule's FLOPs / the measured compute time
//
// Definitions (the ones every consumer uses; the panel and `flashlab trace --ring --from-timeline` show these):
//   * A rank's compute stream at step s is its ring_compute and ring_merge spans of step s (lane 0): one or
//     more (a span per block pair, say), none where the mask skips all its pairs; its compute time is their sum.
//   * The steps tile the run, from its first stamp to its last: step s begins when the first rank starts its
//     compute stream's work of step s (step 0: at the first stamp) and lasts until step s + 1 begins (the last
//     step: until the last stamp). So a step holds its compute, the waits of ranks that are slower, and the wait
//     for the hop it sends (the share step s + 1 needs), as the model's step does (max of compute and link); the
//     steps add up to the run's time.
//   * A transfer (ring_send_recv, lane 1) of step s is issued during step s: the K/V hop that brings step s+1's
//     share (every step but the last) and, in the backward, after it on the same stream, the hop of the dK/dV
//     partials (every step: the last one takes them home). Its hidden fraction is the time it overlaps the same
//     rank's compute stream (any step), divided by its duration: 1 means the ring paid nothing for it.
//   * A transfer's span runs from the NCCL kernel's start to its end, so it includes waiting for the peer: the
//     bandwidth it implies is at most the link's. The best over transfers is the closest to the link; the
//     median is what a step typically got, and it is the rate the model is given to replay the run.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "model/ring.hpp"
#include "model/timeline.hpp"

namespace flashlab {

// The problem and ring a ring timeline recorded, from its info (model/timeline.hpp lists the keys).
struct RingRun {
  RingLayout layout = RingLayout::Contiguous;
  int ranks = 1;  // P
  Pass pass = Pass::Forward;
  Shape shape;
  CausalAlign causal = CausalAlign::None;
  DType dtype = DType::BF16;
  std::string block_kernel;
  // What the file says each rank sends per hop, for the largest share (K and V; the backward's fp32 dK/dV
  // partials). Checked against the schedule, which gives each transfer its own share's bytes.
  std::optional<std::int64_t> hop_bytes, partials_bytes;
};

enum class RingTransferKind { KV, Partials };
const char* to_string(RingTransferKind);  // "K/V", "dK/dV partials"

struct MeasuredTransfer {
  int rank = 0, step = 0;
  RingTransferKind kind = RingTransferKind::KV;
  double begin_seconds = 0, end_seconds = 0;  // from the timeline's first stamp
  std::int64_t bytes = 0;     // the share's bytes (ring.hpp kv_share_bytes: K and V, or the fp32 partials)
  double hidden_seconds = 0;  // overlapping the rank's compute stream
  double seconds() const { return end_seconds - begin_seconds; }
  double hidden_fraction() const { return seconds() > 0 ? hidden_seconds / seconds() : 1.0; }
  double bytes_per_second() const { return seconds() > 0 ? double(bytes) / seconds() : 0.0; }
};

struct MeasuredRankStep {
  double compute_seconds = 0;  // its ring_compute spans of the step, summed
  double merge_seconds = 0;    // its ring_merge spans of the step, summed
  double begin_seconds = 0, end_seconds = 0;  // the first and last stamp of its compute stream at the step (0, 0
                                              // when the mask skips all its pairs there and it recorded nothing)
  std::vector<int> transfers;  // indices into RingMeasurement::transfers, in time order
};

struct MeasuredStep {
  std::vector<MeasuredRankStep> ranks;   // [rank]
  double begin_seconds = 0, end_seconds = 0;  // the step's boundaries (see the definitions above), from the first stamp
  double seconds() const { return end_seconds - begin_seconds; }
  int slowest_rank = 0;                  // the rank with the longest compute at this step
  double slowest_compute_seconds = 0;
  // The step's transfers together: hidden time / transfer time; none when the step has no transfer.
  std::optional<double> hidden_fraction;
};

struct RingMeasurement {
  RingRun run;
  RingSchedule schedule;  // ring_schedule of the run's layout and lengths: what the model says happened
  std::vector<MeasuredStep> steps;           // [step], P of them
  std::vector<MeasuredTransfer> transfers;   // every ring_send_recv span, by rank then time
  double seconds = 0;                        // the run: the first stamp to the last (the steps' sum)
  std::optional<double> hidden_fraction;     // all transfers: hidden time / transfer time
  // The link, over transfers of positive duration on a ring of more than one rank (none otherwise).
  std::optional<double> median_bytes_per_second, best_bytes_per_second;
  // The schedule's FLOPs (ring_cost, the mask's visible scores) / the ranks' measured compute time, over every
  // (rank, step) that has work: the rate one rank sustained.
  double flops_per_second = 0;
};

// Reads a ring timeline. Throws InputError, one sentence starting with `what`, for a timeline that is not a
// ring's (no info "ranks"), an info key missing or malformed, a span on a rank beyond "ranks", without a step
// or at a step beyond P - 1, a non-ring event, a span on the wrong stream, a (rank, step) where the schedule
// has work but the file no ring_compute, hop sizes that disagree with the schedule's shares, or a (rank, step)
// whose transfers are not the schedule's (forward: one K/V hop per step but the last; backward: that, then one
// partials hop at every step).
RingMeasurement measure_ring(const Timeline&, const std::string& what);

// A machine with the measured rates: the ranks' compute rate and the median link bandwidth (the `base`
// machine's link where nothing was measured, e.g. one rank), elements of the run's dtype.
RingMachine measured_machine(const RingMeasurement&, const RingMachine& base = {});
// The model's machine with the run's element size (K/V as the run stored them).
RingMachine model_machine(const RingRun&, const RingMachine& base = {});
// ring_cost of the measured run's schedule on `machine`.
RingCost model_cost(const RingMeasurement&, const RingMachine&);

}  // namespace flashlab
