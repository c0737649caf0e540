// An NCCL ring's CUDA-event stamps as a timeline (model/ring_timeline.hpp): where each span's stamps go in a
// rank's fixed-size array, that array as ring spans on the right lane and step with the run's info, and the
// result through the Trace Event writer and reader unchanged.
#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <stdexcept>

#include "model/ring_timeline.hpp"

using namespace flashlab;

namespace {

Shape shape(int seq) {
  Shape s;
  s.batch = 2;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.seq_q = s.seq_k = seq;
  s.head_dim = 64;
  return s;
}

RingTimelineRun run_of(Pass pass, int seq) {
  return RingTimelineRun{.pass = pass,
                         .shape = shape(seq),
                         .dtype = DType::BF16,
                         .block_kernel = "cuda-fa3-ws",
                         .device = "test GPU",
                         .warmup = 1,
                         .iters = 3};
}

// Every span of every rank not taken; stamp() fills one in as a rank's events would.
std::vector<std::int64_t> no_stamps(const RingStampLayout& l, int ranks) {
  return std::vector<std::int64_t>(std::size_t(ranks) * l.stamps_per_rank(), kNoStamp);
}
void stamp(std::vector<std::int64_t>& stamps, const RingStampLayout& l, int rank, std::size_t span, std::int64_t begin,
           std::int64_t end) {
  stamps[std::size_t(rank) * l.stamps_per_rank() + 2 * span] = begin;
  stamps[std::size_t(rank) * l.stamps_per_rank() + 2 * span + 1] = end;
}

}  // namespace

TEST_CASE("the stamp layout gives every span of a rank its own place, and its size follows the schedule") {
  const RingSchedule ring = ring_schedule(RingLayout::Zigzag, 4, 64, 64, CausalAlign::BottomRight);
  const RingStampLayout fwd = ring_stamp_layout(ring, Pass::Forward);
  const RingStampLayout bwd = ring_stamp_layout(ring, Pass::Backward);
  std::size_t most_pairs = 0;
  for (const auto& step : ring.steps)
    for (const RankStep& rs : step) most_pairs = std::max(most_pairs, rs.pairs.size());
  CHECK(fwd.steps == 4);
  CHECK(fwd.blocks_per_step == int(most_pairs));
  CHECK(fwd.blocks_per_step == 4);  // zigzag: two query ranges against the share's two ranges
  CHECK(bwd.blocks_per_step == 1);
  for (const RingStampLayout& l : {fwd, bwd}) {
    std::set<std::size_t> seen;
    for (int s = 0; s < l.steps; ++s) {
      for (int b = 0; b < l.blocks_per_step; ++b) {
        seen.insert(l.compute(s, b));
        seen.insert(l.merge(s, b));
      }
      seen.insert(l.kv_hop(s));
      seen.insert(l.partials_hop(s));
    }
    CHECK(seen.size() == l.spans_per_rank());
    CHECK(*seen.rbegin() == l.spans_per_rank() - 1);
    CHECK(l.stamps_per_rank() == 2 * l.spans_per_rank());
    CHECK_THROWS_AS((void)l.kv_hop(l.steps), std::out_of_range);
    CHECK_THROWS_AS((void)l.compute(0, l.blocks_per_step), std::out_of_range);
    CHECK_THROWS_AS((void)l.merge(-1, 0), std::out_of_range);
  }
}

TEST_CASE("a forward's stamps become ring spans on the compute and communication lanes, each with its step") {
  const RingSchedule ring = ring_schedule(RingLayout::Contiguous, 2, 64, 64, CausalAlign::None);
  const RingStampLayout l = ring_stamp_layout(ring, Pass::Forward);
  REQUIRE(l.blocks_per_step == 1);
  auto stamps = no_stamps(l, 2);
  // Rank 0: step 0 computes and merges while its K/V hop runs; step 1 (the last) has no hop.
  stamp(stamps, l, 0, l.compute(0, 0), 1000, 5000);
  stamp(stamps, l, 0, l.merge(0, 0), 5000, 5400);
  stamp(stamps, l, 0, l.kv_hop(0), 1200, 3900);
  stamp(stamps, l, 0, l.compute(1, 0), 5500, 9000);
  stamp(stamps, l, 0, l.merge(1, 0), 9000, 9300);
  // Rank 1 counts from its own reference: only its step 1 block is stamped here.
  stamp(stamps, l, 1, l.compute(1, 0), 800, 4000);

  const Timeline t = ring_timeline(ring, run_of(Pass::Forward, 64), l, stamps);
  CHECK(t.is_ring());
  CHECK(t.variant == "ring");
  CHECK(t.device == "test GPU");
  REQUIRE(t.spans.size() == 6);
  CHECK(t.spans[0] == TimelineSpan{.block = 0, .warpgroup = 0, .event = PipelineEvent::RingCompute, .begin_ns = 1000,
                                   .end_ns = 5000, .step = 0});
  CHECK(t.spans[1] == TimelineSpan{.block = 0, .warpgroup = 0, .event = PipelineEvent::RingMerge, .begin_ns = 5000,
                                   .end_ns = 5400, .step = 0});
  CHECK(t.spans[2] == TimelineSpan{.block = 0, .warpgroup = 1, .event = PipelineEvent::RingSendRecv, .begin_ns = 1200,
                                   .end_ns = 3900, .step = 0});
  CHECK(t.spans[3].step == 1);
  CHECK(t.spans[4].event == PipelineEvent::RingMerge);
  CHECK(t.spans[5] == TimelineSpan{.block = 1, .warpgroup = 0, .event = PipelineEvent::RingCompute, .begin_ns = 800,
                                   .end_ns = 4000, .step = 1});

  CHECK(t.info.at("ranks") == "2");
  CHECK(t.info.at("layout") == "contiguous");
  CHECK(t.info.at("pass") == "forward");
  CHECK(t.info.at("batch") == "2");
  CHECK(t.info.at("heads") == "4");
  CHECK(t.info.at("heads_kv") == "2");
  CHECK(t.info.at("seq") == "64");
  CHECK(t.info.count("seq_k") == 0);
  CHECK(t.info.at("head_dim") == "64");
  CHECK(t.info.at("causal") == "none");
  CHECK(t.info.at("dtype") == "bf16");
  CHECK(t.info.at("block_kernel") == "cuda-fa3-ws");
  // K and V of a 32-token share: 2 tensors x batch 2 x 2 kv heads x 32 tokens x 64 x 2 bytes.
  CHECK(t.info.at("hop_bytes") == std::to_string(2 * 2 * 2 * 32 * 64 * 2));
  CHECK(t.info.count("partials_bytes") == 0);
  CHECK(t.info.count("link") == 0);
  CHECK(t.info.at("iteration").find("last of 3") != std::string::npos);
}

TEST_CASE("a backward's timeline has its partials hop after the K/V hop on the communication lane, and their bytes") {
  const RingSchedule ring = ring_schedule(RingLayout::Zigzag, 2, 64, 64, CausalAlign::BottomRight);
  const RingStampLayout l = ring_stamp_layout(ring, Pass::Backward);
  auto stamps = no_stamps(l, 2);
  for (int r = 0; r < 2; ++r) {
    stamp(stamps, l, r, l.compute(0, 0), 100, 900);
    stamp(stamps, l, r, l.kv_hop(0), 120, 600);
    stamp(stamps, l, r, l.partials_hop(0), 910, 1300);
    stamp(stamps, l, r, l.compute(1, 0), 905, 1700);
    stamp(stamps, l, r, l.merge(1, 0), 1700, 1750);
    stamp(stamps, l, r, l.partials_hop(1), 1760, 2100);
  }
  RingTimelineRun run = run_of(Pass::Backward, 64);
  run.link = "NVLink";
  const Timeline t = ring_timeline(ring, run, l, stamps);
  REQUIRE(t.spans.size() == 12);
  std::vector<TimelineSpan> comm;
  for (const TimelineSpan& s : t.spans)
    if (s.block == 0 && s.warpgroup == 1) comm.push_back(s);
  REQUIRE(comm.size() == 3);
  for (const TimelineSpan& s : comm) CHECK(s.event == PipelineEvent::RingSendRecv);
  CHECK(comm[0].begin_ns == 120);  // step 0's K/V hop
  CHECK(comm[1].begin_ns == 910);  // then its partials
  CHECK(comm[1].step == 0);
  CHECK(comm[2].step == 1);
  CHECK(t.info.at("pass") == "backward");
  CHECK(t.info.at("causal") == "bottom-right");
  CHECK(t.info.at("partials_bytes") == std::to_string(2 * 2 * 2 * 32 * 64 * 4));  // fp32
  CHECK(t.info.at("link") == "NVLink");
}

TEST_CASE("a ring timeline made from stamps reads back from its Trace Event file unchanged") {
  const RingSchedule ring = ring_schedule(RingLayout::Zigzag, 4, 128, 128, CausalAlign::BottomRight);
  const RingStampLayout l = ring_stamp_layout(ring, Pass::Forward);
  auto stamps = no_stamps(l, 4);
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 4; ++s) {
      const std::int64_t at = 3'000'000 * s + 1'234 * r + 17;
      stamp(stamps, l, r, l.compute(s, 0), at, at + 1'500'003);
      stamp(stamps, l, r, l.merge(s, 0), at + 1'500'003, at + 1'600'000);
      if (s < 3) stamp(stamps, l, r, l.kv_hop(s), at + 5, at + 900'001);
    }
  const Timeline t = ring_timeline(ring, run_of(Pass::Forward, 128), l, stamps);
  REQUIRE(t.spans.size() == 4 * (4 * 2 + 3));
  std::ostringstream out;
  write_trace_event_json(t, out);
  std::istringstream in(out.str());
  const Timeline back = read_trace_event_json(in, "timeline ring.json");
  CHECK(back == t);
}

TEST_CASE("stamps that are not a span's are refused") {
  const RingSchedule ring = ring_schedule(RingLayout::Contiguous, 2, 64, 64, CausalAlign::None);
  const RingStampLayout l = ring_stamp_layout(ring, Pass::Forward);
  const RingTimelineRun run = run_of(Pass::Forward, 64);
  auto half = no_stamps(l, 2);
  half[2 * l.compute(1, 0)] = 500;  // a begin without its end
  CHECK_THROWS_WITH_AS(ring_timeline(ring, run, l, half), doctest::Contains("rank 0's span"), InputError);
  auto backwards = no_stamps(l, 2);
  stamp(backwards, l, 1, l.kv_hop(0), 900, 800);
  CHECK_THROWS_WITH_AS(ring_timeline(ring, run, l, backwards), doctest::Contains("ends before it begins"), InputError);
  auto short_array = no_stamps(l, 1);
  CHECK_THROWS_AS(ring_timeline(ring, run, l, short_array), std::logic_error);
}

TEST_CASE("the backward's timeline goes beside the forward's") {
  CHECK(ring_timeline_path("out/run.json", Pass::Forward) == "out/run.json");
  CHECK(ring_timeline_path("out/run.json", Pass::Backward) == "out/run-backward.json");
  CHECK(ring_timeline_path("trace", Pass::Backward) == "trace-backward");
  CHECK(ring_timeline_path(".json", Pass::Backward) == ".json-backward");
}
