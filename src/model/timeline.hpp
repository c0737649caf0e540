#pragma once
// A pipeline timeline: when each warpgroup of a few thread blocks of a warp-specialized kernel
// (cuda-fa3-ws) issued its TMA loads, saw them land, issued and waited on its wgmma, ran the softmax,
// waited at a barrier, ran the epilogue. The kernel writes TimelineRecord (plain, fixed-width, usable
// in device code); the host turns them into a Timeline and writes it in the Chrome Trace Event Format
// (what Perfetto and chrome://tracing open); the app reads it back (viz Pipeline panel).
//
// This header stays free of nlohmann/json and of anything a .cu file cannot include.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bench.hpp"            // BenchTimeline: what a bench recorded
#include "core/timeline_record.hpp"  // what the kernel writes, one per event

namespace flashlab {

// Names are stable (they are the "name" of each trace event): append new kinds, never renumber.
enum class PipelineEvent : std::uint16_t {
  TmaIssue,     // instant: the producer issued a TMA load (K/V tile into a stage)
  TmaLanded,    // instant: the tile's bytes arrived (its mbarrier completed)
  WgmmaIssue,   // instant: a warpgroup issued its wgmma (S = Q K^T or O += P V)
  WgmmaWait,    // instant: wgmma.wait_group returned (the product is in registers)
  Softmax,      // span: online softmax of one tile (max, exp, row sums, rescale)
  BarrierWait,  // span: blocked on a barrier (a full stage, an empty stage, the other warpgroup)
  Epilogue,     // span: O / l, LSE, the store of O
  // Ring attention (one lane per rank and stream: block = rank, warpgroup = 0 compute, 1 communication):
  RingCompute,   // span: a rank's block kernel(s) on the share in hand at one step
  RingSendRecv,  // span: one hop, the grouped NCCL send to rank + 1 and receive from rank - 1 (one NCCL
                 // kernel, so the two cannot be timed apart): a K/V share, or in the backward its dK/dV partials
  RingMerge,     // span: folding one step's block result into the rank's running result (LSE merge, or the
                 // fp32 accumulate of the backward)
  Count
};
constexpr int kPipelineEventCount = static_cast<int>(PipelineEvent::Count);

const char* to_string(PipelineEvent);      // "tma_issue", "tma_landed", "wgmma_issue", ...
PipelineEvent parse_pipeline_event(const std::string&);  // throws InputError naming the known ones
bool is_span(PipelineEvent);               // true: has a duration; false: an instant (begin == end)
const char* category(PipelineEvent);       // the trace event "cat": "tma", "wgmma", "softmax", "sync", "epilogue"
std::string known_pipeline_events();       // "tma_issue, tma_landed, ..." for messages

struct TimelineSpan {
  std::uint32_t block = 0;
  std::uint32_t warpgroup = 0;  // the lane within the block
  PipelineEvent event = PipelineEvent::Softmax;
  std::uint64_t begin_ns = 0, end_ns = 0;  // end == begin for instants
  std::int32_t step = -1;                  // a ring's step (written as args.step); -1: none
  bool operator==(const TimelineSpan&) const = default;
};

struct Timeline {
  std::string device, variant;  // "NVIDIA H100 80GB HBM3", "cuda-fa3-ws"
  std::string label;            // what the run was ("ladder step 3, N=4096 d=128"); "synthetic ..." if made up
  std::uint32_t producer_warpgroups = 1;  // warpgroups 0 .. this-1 produce (TMA), the rest consume
  // What else the run was, as written in otherData.info: a ring's "ranks", "layout", "pass", "batch", "heads",
  // "heads_kv", "seq", "head_dim", "causal", "dtype", "block_kernel". A ring timeline is one with "ranks".
  std::map<std::string, std::string> info{};
  std::vector<TimelineSpan> spans;

  bool is_ring() const { return info.count("ranks") > 0; }

  std::uint64_t start_ns() const;  // the earliest stamp (0 when empty)
  std::uint64_t end_ns() const;    // the latest stamp
  bool operator==(const Timeline&) const = default;
};

// The records of a kernel run, as a Timeline. Throws InputError for an unknown event number, an end
// before its begin, or an instant with a duration.
Timeline timeline_from_records(const TimelineRecord* records, std::size_t count, const std::string& device,
                               const std::string& variant, const std::string& label,
                               std::uint32_t producer_warpgroups = 1);

// What a bench recorded (BenchSettings::record_timeline), as a Timeline: timeline_from_records on its records.
Timeline timeline_of(const BenchTimeline&);

// Where a consumer warpgroup's time went: over one lane (a block's warpgroup at or past producer_warpgroups), from
// its first stamp to its last, the fraction inside Softmax spans and inside BarrierWait spans. consumer_shares gives
// the median of each over the consumer lanes with a nonzero extent, and how many there were (0: both shares 0). It
// is how a ladder rung's timeline shows the softmax's share of the consumers' time growing or shrinking.
struct ConsumerShares {
  double softmax = 0, waiting = 0;
  int lanes = 0;
};
ConsumerShares consumer_shares(const Timeline&);

// Chrome Trace Event Format: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}.
// Spans are "ph": "X" with "ts"/"dur" in microseconds relative to the earliest stamp, instants are
// "ph": "i"; pid = block, tid = warpgroup, with "M" events naming them ("block 3", "producer WG0"; for a
// ring "rank 2", "compute" / "communication"); a span's step is its "args": {"step": k}. otherData holds
// device, variant, label, producer_warpgroups, info and t0_ns (the earliest stamp), so reading the output
// gives back the same Timeline.
void write_trace_event_json(const Timeline&, std::ostream&);
// Throws InputError with one sentence naming `what` (e.g. "timeline run.json") for a bad file.
Timeline read_trace_event_json(std::istream&, const std::string& what);
Timeline read_trace_event_file(const std::string& path);  // what = "timeline PATH"
// write_trace_event_json into the file at `path`; InputError with one sentence when it cannot be written.
void write_trace_event_file(const Timeline&, const std::string& path);

}  // namespace flashlab
