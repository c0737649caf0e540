#include "model/ring_timeline.hpp"

#include <algorithm>
#include <stdexcept>

namespace flashlab {

namespace {

void check_step(const RingStampLayout& l, int step) {
  if (step < 0 || step >= l.steps)
    throw std::out_of_range("ring stamp layout: step " + std::to_string(step) + " of " + std::to_string(l.steps));
}

void check_block(const RingStampLayout& l, int block) {
  if (block < 0 || block >= l.blocks_per_step)
    throw std::out_of_range("ring stamp layout: block " + std::to_string(block) + " of " +
                            std::to_string(l.blocks_per_step));
}

const char* pass_name(Pass pass) { return pass == Pass::Forward ? "forward" : "backward"; }

// What span k of a step is: its event and its lane (0 compute stream, 1 communication stream).
struct SpanKind {
  PipelineEvent event;
  std::uint32_t lane;
};
SpanKind span_kind(const RingStampLayout& l, std::size_t within_step) {
  const std::size_t blocks = std::size_t(l.blocks_per_step);
  if (within_step < blocks) return {PipelineEvent::RingCompute, 0};
  if (within_step < 2 * blocks) return {PipelineEvent::RingMerge, 0};
  return {PipelineEvent::RingSendRecv, 1};  // the K/V hop, then the partials hop
}

}  // namespace

std::size_t RingStampLayout::compute(int step, int block) const {
  check_step(*this, step);
  check_block(*this, block);
  return std::size_t(step) * spans_per_step() + std::size_t(block);
}

std::size_t RingStampLayout::merge(int step, int block) const {
  check_step(*this, step);
  check_block(*this, block);
  return std::size_t(step) * spans_per_step() + std::size_t(blocks_per_step) + std::size_t(block);
}

std::size_t RingStampLayout::kv_hop(int step) const {
  check_step(*this, step);
  return std::size_t(step) * spans_per_step() + 2 * std::size_t(blocks_per_step);
}

std::size_t RingStampLayout::partials_hop(int step) const {
  check_step(*this, step);
  return std::size_t(step) * spans_per_step() + 2 * std::size_t(blocks_per_step) + 1;
}

RingStampLayout ring_stamp_layout(const RingSchedule& ring, Pass pass) {
  RingStampLayout l{.steps = ring.ranks, .blocks_per_step = 1};
  if (pass == Pass::Forward)
    for (const std::vector<RankStep>& step : ring.steps)
      for (const RankStep& rs : step) l.blocks_per_step = std::max(l.blocks_per_step, int(rs.pairs.size()));
  return l;
}

Timeline ring_timeline(const RingSchedule& ring, const RingTimelineRun& run, const RingStampLayout& layout,
                       const std::vector<std::int64_t>& stamps) {
  const int P = ring.ranks;
  if (layout.steps != P || stamps.size() != std::size_t(P) * layout.stamps_per_rank())
    throw std::logic_error("ring_timeline: " + std::to_string(stamps.size()) + " stamps for " + std::to_string(P) +
                           " ranks of " + std::to_string(layout.stamps_per_rank()) + " (" +
                           std::to_string(layout.steps) + " steps)");
  const Shape& s = run.shape;
  Timeline t;
  t.device = run.device;
  t.variant = "ring";
  t.label = "ring attention over NCCL: " + std::to_string(P) + (P == 1 ? " rank" : " ranks") + ", " +
            to_string(ring.layout) + ", " + run.block_kernel + " blocks, " + pass_name(run.pass) + ", batch " +
            std::to_string(s.batch) + ", heads " + std::to_string(s.heads_q) + " (kv " + std::to_string(s.heads_kv) +
            "), seq " + std::to_string(s.seq_q) + (s.seq_k != s.seq_q ? " x " + std::to_string(s.seq_k) : "") +
            ", head_dim " + std::to_string(s.head_dim) + ", causal " + to_string(ring.causal) + ", " +
            to_string(run.dtype) + "; the last timed run; ranks aligned at a barrier to within microseconds";

  int largest_share = 0;
  for (int origin = 0; origin < P; ++origin) largest_share = std::max(largest_share, ring.kv_tokens(origin));
  auto& info = t.info;
  info["ranks"] = std::to_string(P);
  info["layout"] = to_string(ring.layout);
  info["pass"] = pass_name(run.pass);
  info["batch"] = std::to_string(s.batch);
  info["heads"] = std::to_string(s.heads_q);
  info["heads_kv"] = std::to_string(s.heads_kv);
  info["seq"] = std::to_string(s.seq_q);
  if (s.seq_k != s.seq_q) info["seq_k"] = std::to_string(s.seq_k);
  info["head_dim"] = std::to_string(s.head_dim);
  info["causal"] = to_string(ring.causal);
  info["dtype"] = to_string(run.dtype);
  info["block_kernel"] = run.block_kernel;
  info["transport"] = "NCCL, one process per GPU";
  info["iteration"] = "the last of " + std::to_string(run.iters) + " timed runs (after " + std::to_string(run.warmup) +
                      " untimed)";
  info["clock"] =
      "CUDA events; each rank's times count from an event it records on its communication stream as the all-reduce "
      "of the barrier before the pass completes, so ranks are aligned to within that all-reduce's completion skew "
      "(about P - 1 NCCL hops, microseconds)";
  // K and V: two tensors of the share.
  info["hop_bytes"] = std::to_string(2 * kv_share_bytes(s, largest_share, dtype_bytes(run.dtype)));
  if (run.pass == Pass::Backward)
    info["partials_bytes"] = std::to_string(2 * kv_share_bytes(s, largest_share, RingMachine{}.grad_bytes_per_element));
  info["send_recv"] =
      run.pass == Pass::Forward
          ? "at step s < P - 1, the K/V hop that brings the share of step s + 1 (NCCL kernel start to end, waiting "
            "for the peer included)"
          : "at step s < P - 1, the K/V hop that brings the share of step s + 1, then at every step the hop of the "
            "step's dK/dV partials to the next rank (the last one takes them home); NCCL kernel start to end, "
            "waiting for the peer included";
  if (!run.link.empty()) info["link"] = run.link;

  for (int r = 0; r < P; ++r)
    for (std::size_t k = 0; k < layout.spans_per_rank(); ++k) {
      const std::int64_t* span = stamps.data() + std::size_t(r) * layout.stamps_per_rank() + 2 * k;
      const int step = int(k / layout.spans_per_step());
      if (span[0] == kNoStamp && span[1] == kNoStamp) continue;
      const std::string where = "rank " + std::to_string(r) + "'s span " + std::to_string(k) + " (step " +
                                std::to_string(step) + ")";
      if (span[0] < 0 || span[1] < 0)
        throw InputError(where + " has stamps " + std::to_string(span[0]) + " and " + std::to_string(span[1]) +
                         "; a span has both stamps, at or after the rank's reference, or neither");
      if (span[1] < span[0])
        throw InputError(where + " ends before it begins (" + std::to_string(span[0]) + " ns, then " +
                         std::to_string(span[1]) + " ns)");
      const SpanKind kind = span_kind(layout, k % layout.spans_per_step());
      t.spans.push_back({.block = std::uint32_t(r),
                         .warpgroup = kind.lane,
                         .event = kind.event,
                         .begin_ns = std::uint64_t(span[0]),
                         .end_ns = std::uint64_t(span[1]),
                         .step = step});
    }
  return t;
}

std::string ring_timeline_path(const std::string& path, Pass pass) {
  if (pass == Pass::Forward) return path;
  const std::string ext = ".json";
  if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0)
    return path.substr(0, path.size() - ext.size()) + "-backward" + ext;
  return path + "-backward";
}

}  // namespace flashlab
