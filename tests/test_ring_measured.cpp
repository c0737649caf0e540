// A measured ring timeline read step by step (model/ring_measured.hpp), on synthetic timelines built here
// whose answers are computed by hand: step boundaries, the slowest rank, hidden fractions, the implied
// bandwidth, the compute rate, the transfers' kinds in the backward, and one sentence for each kind of bad file.
// A timeline made by ring_timeline from an NCCL ring's stamps is read too.
#include <doctest/doctest.h>

#include "core/flops.hpp"
#include "model/ring_measured.hpp"
#include "model/ring_timeline.hpp"

using namespace flashlab;

namespace {

constexpr std::uint64_t kOrigin = 5'000'000;  // ns: stamps do not start at 0
constexpr std::uint64_t kUs = 1000;           // ns per microsecond

TimelineSpan span(std::uint32_t rank, PipelineEvent e, int step, std::uint64_t begin_us, std::uint64_t end_us) {
  return {.block = rank,
          .warpgroup = e == PipelineEvent::RingSendRecv ? 1u : 0u,
          .event = e,
          .begin_ns = kOrigin + begin_us * kUs,
          .end_ns = kOrigin + end_us * kUs,
          .step = step};
}

std::map<std::string, std::string> info(const char* pass) {
  return {{"ranks", "2"},  {"layout", "contiguous"}, {"pass", pass},      {"batch", "1"},
          {"heads", "8"},  {"heads_kv", "8"},        {"seq", "1024"},     {"head_dim", "64"},
          {"causal", "none"}, {"dtype", "bf16"},     {"block_kernel", "cuda-fa2"}};
}

// Two ranks, forward, no mask, 8 heads: a K/V hop is K and V of 512 tokens, 2 * 512 * 8 * 64 * 2 bytes = 1 MiB.
// Times in microseconds:
//   rank 0  compute 0-100, merge 100-110 | compute 120-220, merge 220-230;  K/V hop 20-70 (inside its compute)
//   rank 1  compute 10-90, merge 90-100  | compute 170-250, merge 250-260;  K/V hop 60-160 (40 of it under work)
Timeline forward_pair() {
  Timeline t{.device = "none (synthetic)", .variant = "ring", .label = "synthetic: two ranks", .info = info("forward"), .spans = {}};
  t.info["hop_bytes"] = "1048576";
  using E = PipelineEvent;
  t.spans = {span(0, E::RingCompute, 0, 0, 100),   span(0, E::RingMerge, 0, 100, 110), span(0, E::RingSendRecv, 0, 20, 70),
             span(0, E::RingCompute, 1, 120, 220), span(0, E::RingMerge, 1, 220, 230), span(1, E::RingCompute, 0, 10, 90),
             span(1, E::RingMerge, 0, 90, 100),    span(1, E::RingSendRecv, 0, 60, 160), span(1, E::RingCompute, 1, 170, 250),
             span(1, E::RingMerge, 1, 250, 260)};
  return t;
}

// Two ranks, backward, no hop sizes in the file: each step a rank sends its K/V share (but at the last step)
// and then its dK/dV partials. Spans listed out of time order on purpose.
Timeline backward_pair() {
  Timeline t{.device = "none (synthetic)", .variant = "ring", .label = "synthetic: backward", .info = info("backward"), .spans = {}};
  using E = PipelineEvent;
  for (std::uint32_t r = 0; r < 2; ++r) {
    t.spans.push_back(span(r, E::RingSendRecv, 0, 110, 150));  // partials of step 0
    t.spans.push_back(span(r, E::RingSendRecv, 0, 0, 20));     // K/V hop of step 0
    t.spans.push_back(span(r, E::RingCompute, 0, 0, 100));
    t.spans.push_back(span(r, E::RingCompute, 1, 120, 220));
    t.spans.push_back(span(r, E::RingMerge, 1, 220, 230));
    t.spans.push_back(span(r, E::RingSendRecv, 1, 230, 270));  // partials home
  }
  return t;
}

}  // namespace

TEST_CASE("two forward ranks: step boundaries, the slowest rank, hidden fractions and the link's bandwidth") {
  const RingMeasurement m = measure_ring(forward_pair(), "t.json");
  CHECK(m.run.ranks == 2);
  CHECK(m.run.layout == RingLayout::Contiguous);
  CHECK(m.run.pass == Pass::Forward);
  CHECK(m.run.shape.seq_q == 1024);
  CHECK(m.run.hop_bytes == 1'048'576);
  REQUIRE(m.steps.size() == 2);

  // Step 0: from the first stamp (0) to the first start of step 1 (rank 0 at 120); rank 0 computes longest (100
  // against 80).
  CHECK(m.steps[0].begin_seconds == doctest::Approx(0));
  CHECK(m.steps[0].seconds() == doctest::Approx(120e-6));
  CHECK(m.steps[0].slowest_rank == 0);
  CHECK(m.steps[0].slowest_compute_seconds == doctest::Approx(100e-6));
  CHECK(m.steps[0].ranks[1].compute_seconds == doctest::Approx(80e-6));
  CHECK(m.steps[0].ranks[1].merge_seconds == doctest::Approx(10e-6));
  // Step 1, the last: from rank 0's start (120) to the last stamp (rank 1's merge end, 260). The steps add up.
  CHECK(m.steps[1].begin_seconds == doctest::Approx(120e-6));
  CHECK(m.steps[1].seconds() == doctest::Approx(140e-6));
  CHECK(m.steps[1].slowest_rank == 0);
  CHECK(m.seconds == doctest::Approx(260e-6));
  CHECK(m.steps[0].end_seconds == m.steps[1].begin_seconds);

  // Rank 0's hop lies inside its compute: all hidden. Rank 1's hop (60-160) meets its compute stream over
  // 60-100 only (compute then merge): 40 of 100.
  REQUIRE(m.transfers.size() == 2);
  const MeasuredTransfer& a = m.transfers[std::size_t(m.steps[0].ranks[0].transfers.at(0))];
  const MeasuredTransfer& b = m.transfers[std::size_t(m.steps[0].ranks[1].transfers.at(0))];
  CHECK(a.kind == RingTransferKind::KV);
  CHECK(a.hidden_fraction() == doctest::Approx(1.0));
  CHECK(b.hidden_fraction() == doctest::Approx(0.4));
  CHECK(*m.steps[0].hidden_fraction == doctest::Approx((50.0 + 40.0) / (50.0 + 100.0)));
  CHECK(!m.steps[1].hidden_fraction);  // the last step sends nothing
  CHECK(*m.hidden_fraction == doctest::Approx(0.6));

  // 1 MiB in 50 us is 20.97 GB/s, in 100 us half that: the median is their mean.
  CHECK(a.bytes == 1'048'576);
  CHECK(a.bytes_per_second() == doctest::Approx(1048576 / 50e-6));
  CHECK(*m.median_bytes_per_second == doctest::Approx(0.75 * 1048576 / 50e-6));
  CHECK(*m.best_bytes_per_second == doctest::Approx(1048576 / 50e-6));

  // The whole attention's FLOPs (no mask, every score seen once) over 100 + 80 + 100 + 80 us of compute.
  const double flops = forward_flops(m.run.shape, CausalAlign::None);
  CHECK(m.flops_per_second == doctest::Approx(flops / 360e-6));
  const RingMachine measured = measured_machine(m);
  CHECK(measured.flops_per_second == doctest::Approx(m.flops_per_second));
  CHECK(measured.link_bytes_per_second == doctest::Approx(*m.median_bytes_per_second));
  CHECK(measured.kv_bytes_per_element == 2);
}

TEST_CASE("the model on the measured rates computes each step as long as the slowest rank took on average") {
  const RingMeasurement m = measure_ring(forward_pair(), "t.json");
  const RingCost replay = model_cost(m, measured_machine(m));
  // Every (rank, step) has the same work here, so at the mean rate each step's compute is 90 us; the first
  // step's K/V hop (1 MiB at the median 15.7 GB/s: 66.7 us) is shorter.
  REQUIRE(replay.steps.size() == 2);
  CHECK(replay.steps[0].seconds == doctest::Approx(90e-6));
  CHECK(replay.steps[1].seconds == doctest::Approx(90e-6));
  CHECK(replay.steps[0].link_bytes[0] == 1'048'576);
  // The model on its assumed rates differs (and keeps its own link).
  const RingMachine assumed = model_machine(m.run);
  CHECK(assumed.link_bytes_per_second == RingMachine{}.link_bytes_per_second);
  CHECK(model_cost(m, assumed).seconds < replay.seconds);
}

TEST_CASE("backward: the K/V hop then the partials, each with the schedule's bytes when the file names none") {
  const RingMeasurement m = measure_ring(backward_pair(), "t.json");
  REQUIRE(m.transfers.size() == 6);  // per rank: K/V + partials at step 0, partials at step 1
  const MeasuredRankStep& r0 = m.steps[0].ranks[0];
  REQUIRE(r0.transfers.size() == 2);
  const MeasuredTransfer& kv = m.transfers[std::size_t(r0.transfers[0])];
  const MeasuredTransfer& partials = m.transfers[std::size_t(r0.transfers[1])];
  CHECK(kv.kind == RingTransferKind::KV);
  CHECK(kv.begin_seconds == doctest::Approx(0));
  CHECK(kv.bytes == 2 * 512 * 8 * 64 * 2);        // K and V of 512 tokens, bf16
  CHECK(partials.kind == RingTransferKind::Partials);
  CHECK(partials.bytes == 2 * 512 * 8 * 64 * 4);  // dK and dV partial sums, fp32
  CHECK(kv.hidden_fraction() == doctest::Approx(1.0));
  // 110-150 overlaps step 1's compute from 120: 30 of 40.
  CHECK(partials.hidden_fraction() == doctest::Approx(0.75));
  // The last hop (230-270) starts after all the rank's work: nothing hidden.
  const MeasuredTransfer& home = m.transfers[std::size_t(m.steps[1].ranks[0].transfers.at(0))];
  CHECK(home.kind == RingTransferKind::Partials);
  CHECK(home.hidden_fraction() == doctest::Approx(0.0));
  CHECK(*m.steps[1].hidden_fraction == doctest::Approx(0.0));
  CHECK(m.seconds == doctest::Approx(270e-6));
  CHECK(m.steps[1].seconds() == doctest::Approx(150e-6));  // the last step holds the hop home: 120 to 270
  // Bandwidths: K/V 1 MiB / 20 us, the partials (at both steps) 2 MiB / 40 us: all six the same.
  CHECK(*m.median_bytes_per_second == doctest::Approx(1048576 / 20e-6));
  CHECK(*m.best_bytes_per_second == doctest::Approx(1048576 / 20e-6));
  // The backward's FLOPs are 2.5x the forward's.
  CHECK(m.flops_per_second == doctest::Approx(backward_flops(m.run.shape, CausalAlign::None) / 400e-6));
}

TEST_CASE("a bad ring timeline gets one sentence naming the file and what is wrong") {
  const auto fails = [](Timeline t, const char* says) {
    CHECK_THROWS_WITH_AS(measure_ring(t, "timeline x.json"), doctest::Contains(says), InputError);
  };
  Timeline t = forward_pair();
  t.info.clear();
  fails(t, "timeline x.json is not a ring timeline: its otherData.info has no \"ranks\"");
  t = forward_pair();
  t.info.erase("head_dim");
  fails(t, "timeline x.json: info \"head_dim\" is missing");
  t = forward_pair();
  t.info["seq"] = "12k";
  fails(t, "timeline x.json: info \"seq\" is \"12k\"; it must be a whole number");
  t = forward_pair();
  t.info["causal"] = "yes";
  fails(t, "timeline x.json: unknown causal alignment 'yes'");
  t = forward_pair();
  t.info["pass"] = "both";
  fails(t, "info \"pass\" is \"both\"; it must be forward or backward");
  t = forward_pair();
  t.spans.push_back(span(2, PipelineEvent::RingCompute, 0, 0, 10));
  fails(t, "a ring_compute span is on rank 2, but info \"ranks\" is 2 (ranks 0 to 1)");
  t = forward_pair();
  t.spans.push_back(span(1, PipelineEvent::RingCompute, 2, 0, 10));
  fails(t, "has step 2; a ring of 2 ranks has steps 0 to 1");
  t = forward_pair();
  t.spans.push_back(span(1, PipelineEvent::RingCompute, -1, 0, 10));
  fails(t, "a ring_compute span of rank 1 has no step");
  t = forward_pair();
  t.spans.erase(t.spans.begin() + 8);  // rank 1's compute at step 1
  fails(t, "rank 1 has no ring_compute span at step 1, where its schedule has work");
  t = forward_pair();
  t.info["hop_bytes"] = "1000000";
  fails(t, "info \"hop_bytes\" is 1000000, but the K/V of its largest share (512 tokens) are 1048576 bytes");
  t = forward_pair();
  t.spans.push_back(span(0, PipelineEvent::RingSendRecv, 1, 230, 240));
  fails(t, "rank 0 has 1 ring_send_recv spans at step 1, but the forward ring makes 0 there (none)");
  t = forward_pair();
  t.spans.push_back({.block = 0, .warpgroup = 0, .event = PipelineEvent::Softmax, .begin_ns = kOrigin, .end_ns = kOrigin});
  fails(t, "holds ring_compute, ring_send_recv and ring_merge spans, not softmax");
  t = forward_pair();
  t.spans[2].warpgroup = 0;
  fails(t, "is on stream 0; compute and merge go on stream 0, send/recv on stream 1");
  t = forward_pair();
  t.info["layout"] = "zigzag";
  t.info["seq"] = "1022";
  fails(t, "is not a multiple of it");  // the schedule's own sentence (zigzag: N a multiple of 2P)
  t = backward_pair();
  t.spans.erase(t.spans.begin());  // rank 0's partials of step 0
  fails(t, "rank 0 has 1 ring_send_recv spans at step 0, but the backward ring makes 2 there (K/V then dK/dV partials)");
}

TEST_CASE("a rank the causal mask leaves idle at a step may record nothing there") {
  // Contiguous, top-left: at step 1 rank 0 holds rank 1's keys, all later than its queries.
  Timeline t = forward_pair();
  t.info["causal"] = "top-left";
  t.spans.erase(t.spans.begin() + 3, t.spans.begin() + 5);  // rank 0's compute and merge of step 1
  const RingMeasurement m = measure_ring(t, "t.json");
  CHECK(m.steps[1].ranks[0].compute_seconds == 0);
  CHECK(m.steps[1].slowest_rank == 1);
  CHECK(m.steps[1].begin_seconds == doctest::Approx(170e-6));  // rank 1's start: rank 0 did nothing
  CHECK(m.steps[1].seconds() == doctest::Approx(90e-6));
  // The rate counts the scores the mask leaves, N (N + 1) / 2, over the compute of the (rank, step)s that have
  // any: rank 0 at step 0, rank 1 at both steps.
  const double visible = 1024.0 * 1025.0 / 2;
  CHECK(m.flops_per_second == doctest::Approx(forward_flops_per_score(m.run.shape) * visible / 260e-6));
}

TEST_CASE("a timeline made from an NCCL ring's stamps (model/ring_timeline.hpp) is read as the ring it records") {
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    CAPTURE(pass == Pass::Forward);
    const RingSchedule ring = ring_schedule(RingLayout::Zigzag, 2, 1024, 1024, CausalAlign::TopLeft);
    const RingTimelineRun run{.pass = pass, .shape = Shape{.batch = 1, .heads_q = 8, .heads_kv = 2, .seq_q = 1024,
                                                           .seq_k = 1024, .head_dim = 64},
                              .dtype = DType::BF16, .block_kernel = "cuda-fa2", .device = "test", .link = ""};
    const RingStampLayout layout = ring_stamp_layout(ring, pass);
    std::vector<std::int64_t> stamps(2 * layout.stamps_per_rank(), kNoStamp);
    const auto set = [&](int r, std::size_t span, std::int64_t b, std::int64_t e) {
      stamps[std::size_t(r) * layout.stamps_per_rank() + 2 * span] = b;
      stamps[std::size_t(r) * layout.stamps_per_rank() + 2 * span + 1] = e;
    };
    int computes = 0;
    for (int r = 0; r < 2; ++r) {
      std::int64_t t = 0;
      for (int s = 0; s < 2; ++s) {
        const std::int64_t start = t;
        if (pass == Pass::Forward) {
          for (std::size_t k = 0; k < ring.steps[s][r].pairs.size(); ++k)
            if (ring.steps[s][r].pairs[k].visibility != Visibility::Skipped)
              set(r, layout.compute(s, int(k)), t, t + 100), set(r, layout.merge(s, int(k)), t + 100, t + 110), t += 110,
                  ++computes;
        } else {
          set(r, layout.compute(s, 0), t, t + 300), t += 300, ++computes;
          if (s > 0) set(r, layout.merge(s, 0), t, t + 20), t += 20;
          set(r, layout.partials_hop(s), t, t + 50);
        }
        if (ring.kv_travels_on(s)) set(r, layout.kv_hop(s), start, start + 40);
      }
    }
    const RingMeasurement m = measure_ring(ring_timeline(ring, run, layout, stamps), "stamps");
    CHECK(m.run.shape.heads_kv == 2);
    CHECK(m.run.hop_bytes == 2 * 512 * 2 * 64 * 2);  // K and V of 512 tokens, 2 K/V heads, bf16
    CHECK(m.transfers.size() == (pass == Pass::Forward ? 2u : 6u));
    double compute = 0;
    for (const MeasuredStep& s : m.steps)
      for (const MeasuredRankStep& r : s.ranks) compute += r.compute_seconds;
    CHECK(compute == doctest::Approx(computes * (pass == Pass::Forward ? 100e-9 : 300e-9)));
  }
}
