#pragma once
// The Ring panel's logic, without a window: what the panel draws for ring attention (sequence
// parallelism) over P ranks, built from the ring's one schedule and its cost model (model/ring.hpp)
// and nothing else. Per step, the schedule says which K/V share each rank holds and where it goes
// next; the cost model (or a file of measured times) says how long each rank computes at each step
// and how long it then waits for the slowest one. The three layouts are shown side by side.
//
// Measured times come from a small JSON file that a GPU run of the ring writes, one per layout:
//
//   {
//     "device": "NVIDIA H100 80GB HBM3",   the device that ran it (required, not empty)
//     "layout": "zigzag",                  contiguous, zigzag or striped
//     "P": 4, "N": 16384,                  ranks; tokens (seq_q = seq_k)
//     "heads": 16, "head_dim": 128,        per rank, B = 1 (optional "batch", default 1)
//     "causal": true,                      top-left causal mask, or none
//     "pass": "forward",                   optional: forward (default) or backward
//     "step_ms": [[...], ...],             P rows, one per step, each with P numbers: the milliseconds
//                                          rank r spent computing at step s (its attention on the block
//                                          in hand, not its wait for the link or the other ranks)
//     "command": "...", "date": "..."      optional: how and when it was recorded
//   }
//
// A step then lasts as long as its slowest rank's compute, and every other rank is idle for the
// difference. The file fixes the problem: the panel shows its P, N, heads, d, mask and pass for all
// three layouts, the file's times for its layout and the model's for the other two.
//
// A measured ring timeline (the Trace Event file a GPU ring records, model/timeline.hpp) says more: every
// rank's compute, merge and send/recv spans. With one (settings.timeline) the panel shows that run beside the
// model of its problem, on the model's assumed rates or on the rates the run implies (RingTimelineView, at the
// end of this file).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/ring.hpp"
#include "model/ring_measured.hpp"
#include "model/timeline.hpp"

namespace flashlab::viz {

// The problem the panel shows. One head size and one mask for all three layouts.
struct RingSettings {
  int ranks = 4;          // P
  int seq = 16384;        // N = seq_q = seq_k
  int batch = 1, heads = 16, head_dim = 128;
  bool causal = true;     // top-left
  Pass pass = Pass::Forward;
  int step = -1;          // the ring step a scenario opens at (-1: where the transport is)
  std::string measured;   // a measured-times file (the format above); empty: the model's times
  // A measured ring timeline (Trace Event JSON, model/timeline.hpp): the panel then shows that run beside the
  // model of the same problem (RingTimelineView below); the file fixes the problem.
  std::string timeline;
  bool operator==(const RingSettings&) const = default;
};
constexpr int kMaxPanelRanks = 8;  // the panel draws one box per rank; the schedule itself takes more

// The settings' problem as the library's Shape and mask. Throws InputError for P outside
// [1, kMaxPanelRanks] or an impossible shape.
Shape ring_shape(const RingSettings&);
CausalAlign ring_causal(const RingSettings&);

// A measured-times file, read and checked.
struct MeasuredRing {
  std::string path, device, command, date;
  RingLayout layout = RingLayout::Contiguous;
  RingSettings settings;                           // P, N, batch, heads, d, mask, pass; measured = path
  std::vector<std::vector<double>> step_seconds;  // [step][rank]
};
// Throws InputError, one sentence starting with `where`, for anything but the format above.
MeasuredRing parse_measured_ring(const std::string& json_text, const std::string& where);
MeasuredRing load_measured_ring(const std::string& path);  // also when the file cannot be read

// One rank at one step.
struct RankStepTime {
  double work_seconds = 0;      // computing on the block in hand
  double idle_seconds = 0;      // the step's time minus the work: waiting for the slowest rank or the link
  double transfer_seconds = 0;  // the model's time to send what leaves the rank after the step (0 when measured)
  std::int64_t link_bytes = 0;  // the model's bytes on the rank's link to the next (0 when measured)
};

struct RingStepView {
  std::vector<RankStepTime> ranks;  // [rank]
  double start_seconds = 0;         // when the step begins: the sum of the steps before it
  double seconds = 0;               // how long it lasts
};

struct RingView {
  RingSchedule schedule;  // who holds which share at each step, and its pairs (the only source)
  Pass pass = Pass::Forward;
  bool measured = false;
  std::string source;     // "model: ..." with the machine's rates, or "measured on DEVICE"
  std::vector<RingStepView> steps;
  std::vector<double> work_per_rank;  // seconds over all steps
  double seconds = 0;    // the ring's time: the sum of the steps'
  double imbalance = 1;  // max over ranks of the total work / its mean
  double busy = 1;       // the work of all ranks / (P * seconds): 1 when no rank ever waits
};

// The model's view of one layout: ring_schedule and ring_cost, with the machine's rates.
RingView ring_view(RingLayout, const RingSettings&, const RingMachine&);
// The measured view: the schedule of the file's layout and problem, the file's times.
RingView ring_view(const MeasuredRing&);

// The rank that holds the K/V share of `origin` at `step` (the schedule's kv_origin, inverted).
int holder_of(const RingSchedule&, int step, int origin);
// Whether anything leaves each rank over its link after `step`: the share while it is still needed,
// and in the backward pass the dK/dV partials, whose last hop takes them home.
bool sends_after(const RingView&, int step);

// One column of the panel: a layout's view, or the sentence saying why the layout cannot run this
// problem (zigzag needs N to be a multiple of 2P).
struct RingColumn {
  RingLayout layout = RingLayout::Contiguous;
  std::optional<RingView> view;
  std::string error;
};
// Contiguous, zigzag and striped. With a measured file its layout's column is measured and the
// settings must be the file's (throws InputError saying what differs).
std::vector<RingColumn> ring_columns(const RingSettings&, const RingMachine&, const MeasuredRing* = nullptr);

// --- The transport's clock. The app has one: the position in the loop nest's event stream. The
// ring is shown at the same fraction of the way through (as the Compare panel shows a second
// algorithm), its P steps laid end to end over the stream.
struct RingPosition {
  int step = 0;         // in [0, P)
  double progress = 0;  // through that step, in [0, 1]; 1 only at the very end
};
RingPosition ring_position(std::int64_t event, std::int64_t events, int ranks);
// The first event at which ring_position says `step` (clamped to [0, P)), for the step buttons.
std::int64_t event_of_ring_step(int step, std::int64_t events, int ranks);
// Within a step the ranks compute first and the shares travel last: how far along the hop a share
// is, 0 until kHopStarts of the step, then rising to 1 at its end.
constexpr double kHopStarts = 0.6;
double hop_fraction(double progress);

// --- A measured ring timeline beside the model. What the GPUs did (per rank, per stream, the recorded spans) and
// what the model says for the same problem, as bars on one time axis, and per step the model's time against the
// measured one (model/ring_measured.hpp defines the step boundaries, the hidden fraction and the rates).

enum class RingBarKind { Compute, Merge, KV, Partials };
struct RingBar {
  RingBarKind kind = RingBarKind::Compute;
  int rank = 0, lane = 0, step = 0;  // lane 0: the compute stream, 1: communication
  int share = 0;                     // the rank the K/V share (computed on, or carried) started on: its colour
  double begin_seconds = 0, end_seconds = 0;
  // Transfers: the stretches when the rank's compute stream was idle, so the ring waited on the link.
  std::vector<std::pair<double, double>> exposed;
};
struct RingGantt {
  std::string title;
  std::vector<RingBar> bars;
  std::vector<double> step_begin_seconds, step_end_seconds;  // [step]
  double seconds = 0;  // where the last bar ends
};

struct RingStepCompare {
  double model_seconds = 0;     // ring_cost at the model's assumed rates
  double replay_seconds = 0;    // ring_cost at the measured rates
  double measured_seconds = 0;  // the step's wall time
  int slowest_rank = 0;
  double slowest_compute_seconds = 0;
  std::optional<double> hidden_fraction;
  double replay_error() const { return measured_seconds > 0 ? replay_seconds / measured_seconds - 1 : 0.0; }
};

struct RingTimelineView {
  std::string path, label, device;
  RingMeasurement measured;
  RingMachine assumed, replayed;  // the model's rates; the measured ones (measured_machine)
  RingCost assumed_cost, replay_cost;
  RingGantt model_assumed, model_replayed, gantt;  // the model on each machine; what the GPUs did
  std::vector<RingStepCompare> steps;               // [step]
  std::string problem;  // "P = 4, zigzag, N = 32768, 16 heads (16 K/V), d = 128, causal top-left, bf16, forward"
  double seconds_max = 0;  // the longest of the three: a shared time axis
};

// The model's bars: each step starts when the one before ends (ring_cost's steps end to end); a rank computes from
// the step's start for its FLOPs / rate, and sends what leaves it (the K/V share, then in the backward its partials)
// from the step's start at the link's rate.
RingGantt model_gantt(const RingSchedule&, const Shape&, Pass, const RingMachine&, const std::string& title);
// The recorded spans as bars, times from the timeline's first stamp.
RingGantt measured_gantt(const Timeline&, const RingMeasurement&, const std::string& title);
// The bar of (rank, lane) under `seconds`, within `tolerance` of its ends (the shortest wins): its index, or -1.
int bar_at(const RingGantt&, int rank, int lane, double seconds, double tolerance = 0);
// The view of a ring timeline; throws InputError (one sentence naming `what`) for a bad one, or more ranks than
// the panel draws.
RingTimelineView ring_timeline_view(const Timeline&, const std::string& what, const RingMachine& assumed = {});

// A ring timeline file as the panel holds it: the view, or the one sentence saying why not (never throws).
struct LoadedRingTimeline {
  std::string path;
  std::optional<RingTimelineView> view;
  std::string error;
};
LoadedRingTimeline load_ring_timeline(const std::string& path, const RingMachine& assumed = {});
// Whether a file is a Trace Event file (a ring timeline) rather than a measured-times file: the panel's one path
// field takes either.
bool is_trace_event_file(const std::string& path);

// --- Made-up ring timelines for tests and the demo: the schedule's work at `flops_per_second` (each (rank, step)
// off by up to +-jitter, deterministically), its hops at `link_bytes_per_second`, a hop ending when the slower
// of its two ends is ready, streams ordered as the NCCL ring orders them (cuda/ring_nccl.cu). Nothing is
// measured; the label says "synthetic".
struct SyntheticRing {
  RingLayout layout = RingLayout::Zigzag;
  int ranks = 4, seq = 32768, heads = 16, head_dim = 128;
  CausalAlign causal = CausalAlign::TopLeft;
  Pass pass = Pass::Forward;
  double flops_per_second = 450e12, link_bytes_per_second = 150e9;
  double jitter = 0.12;
  double launch_seconds = 8e-6;  // each compute span's fixed cost
  double merge_seconds = 25e-6;
  std::string label;  // "synthetic: " is put in front
};
Timeline synthetic_ring_timeline(const SyntheticRing&);

}  // namespace flashlab::viz
