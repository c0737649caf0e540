// The Ring panel's logic (viz/logic/ring_view.hpp), without a window: the shares it shows rotate one
// rank per step along the schedule's send_to; each rank's idle time is its step's time minus its
// work; the model's numbers are ring_cost's and `flashlab trace --ring`'s; zigzag and striped remove
// the causal imbalance that contiguous has, by the exact count of visible scores; the transport's
// clock maps onto the ring's steps and back; measured-times files are read, and each kind of mistake
// in one is refused with one sentence naming the file; the scenario's "ring" object parses. A measured ring
// timeline (Trace Event JSON) is drawn beside the model: the model's bars are ring_cost's, the run's are its
// spans with the stretches where a hop was not hidden, per step model against measured; a bad or truncated
// file is one sentence; the synthetic run the scenario shows until a GPU run is recorded is the generator's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.hpp"
#include "logic/ring_view.hpp"
#include "logic/scenario.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

constexpr RingLayout kLayouts[] = {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped};

RingSettings settings(int ranks, int seq, bool causal = true, Pass pass = Pass::Forward) {
  RingSettings s;
  s.ranks = ranks;
  s.seq = seq;
  s.causal = causal;
  s.pass = pass;
  return s;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max({1.0, std::abs(a), std::abs(b)}); }

// A measured-times file as a test writes it: made-up times for the format, not measurements.
nlohmann::json measured_json(int ranks = 4, int seq = 1024) {
  nlohmann::json steps = nlohmann::json::array();
  for (int s = 0; s < ranks; ++s) {
    nlohmann::json row = nlohmann::json::array();
    for (int r = 0; r < ranks; ++r) row.push_back(1.0 + 0.25 * r + 0.5 * s);
    steps.push_back(row);
  }
  return {{"device", "test device"}, {"layout", "zigzag"}, {"P", ranks}, {"N", seq}, {"heads", 16},
          {"head_dim", 128},         {"causal", true},     {"pass", "forward"}, {"step_ms", steps}};
}

std::string measured_error(const std::string& text) {
  try {
    parse_measured_ring(text, "ring.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string scenario_error(const std::string& text) {
  try {
    parse_scenario(text, "test.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("each share starts on its own rank and moves one rank on per step, along send_to") {
  for (RingLayout layout : kLayouts)
    for (int P : {1, 2, 3, 4, 8}) {
      CAPTURE(to_string(layout));
      CAPTURE(P);
      const RingView v = ring_view(layout, settings(P, 32 * P), RingMachine{});
      const RingSchedule& ring = v.schedule;
      REQUIRE(int(v.steps.size()) == P);
      for (int origin = 0; origin < P; ++origin) CHECK(holder_of(ring, 0, origin) == origin);
      for (int s = 0; s + 1 < P; ++s)
        for (int origin = 0; origin < P; ++origin) {
          const int here = holder_of(ring, s, origin), next = holder_of(ring, s + 1, origin);
          CHECK(next == (here + 1) % P);
          CHECK(next == ring.steps[s][here].send_to);
        }
      // The forward sends K/V on after every step but the last; the backward's partials go home after it.
      for (int s = 0; s < P; ++s) CHECK(sends_after(v, s) == (P > 1 && s + 1 < P));
      const RingView b = ring_view(layout, settings(P, 32 * P, true, Pass::Backward), RingMachine{});
      for (int s = 0; s < P; ++s) CHECK(sends_after(b, s) == (P > 1));
    }
}

TEST_CASE("idle time is the step's time minus the rank's work; a step lasts as long as its slowest compute or link") {
  const RingMachine machine;
  for (RingLayout layout : kLayouts)
    for (Pass pass : {Pass::Forward, Pass::Backward})
      for (int seq : {512, 65536}) {  // 128 tokens per rank: the link is slower than the compute; 16384: faster
        CAPTURE(to_string(layout));
        CAPTURE(seq);
        const RingView v = ring_view(layout, settings(4, seq, true, pass), machine);
        double start = 0;
        for (const RingStepView& step : v.steps) {
          CHECK(close(step.start_seconds, start));
          double slowest = 0;
          for (const RankStepTime& r : step.ranks) {
            CHECK(close(r.idle_seconds, step.seconds - r.work_seconds));
            CHECK(r.idle_seconds >= -1e-18);
            CHECK(close(r.transfer_seconds, double(r.link_bytes) / machine.link_bytes_per_second));
            slowest = std::max({slowest, r.work_seconds, r.transfer_seconds});
          }
          CHECK(close(step.seconds, slowest));
          start += step.seconds;
        }
        CHECK(close(v.seconds, start));
        double work = 0;
        for (double w : v.work_per_rank) work += w;
        CHECK(close(v.busy, work / (4 * v.seconds)));
      }
  // Short shares: the transfer outlasts the compute, so even the busiest rank waits on the link.
  const RingView small = ring_view(RingLayout::Striped, settings(4, 512, false), machine);
  CHECK(small.steps[0].ranks[0].transfer_seconds > small.steps[0].ranks[0].work_seconds);
  CHECK(small.steps[0].ranks[0].idle_seconds > 0);
}

TEST_CASE("the model's numbers are ring_cost's, as `flashlab trace --ring --json` prints them") {
  for (const char* layout : {"contiguous", "zigzag"})
    for (bool backward : {false, true}) {
      CAPTURE(layout);
      CAPTURE(backward);
      std::vector<std::string> args = {"trace",     "--ring",   "4",          "--layout", layout,  "--heads", "16",
                                       "--seq-q",   "16384",    "--head-dim", "128",      "--causal", "top-left",
                                       "--json"};
      if (backward) args.push_back("--backward");
      std::ostringstream out, err;
      REQUIRE_MESSAGE(run_cli(args, out, err) == 0, err.str());
      const nlohmann::json trace = nlohmann::json::parse(out.str());
      const RingMachine machine;
      const RingView v = ring_view(parse_ring_layout(layout), settings(4, 16384, true, backward ? Pass::Backward : Pass::Forward),
                                   machine);
      CHECK(close(v.seconds, trace.at("seconds").get<double>()));
      CHECK(close(v.imbalance, trace.at("imbalance").get<double>()));
      for (int s = 0; s < 4; ++s) {
        const nlohmann::json& step = trace.at("steps").at(s);
        CHECK(close(v.steps[s].seconds, step.at("seconds").get<double>()));
        for (int r = 0; r < 4; ++r) {
          CHECK(close(v.steps[s].ranks[r].work_seconds, step.at("flops").at(r).get<double>() / machine.flops_per_second));
          CHECK(close(v.steps[s].ranks[r].idle_seconds, step.at("idle_seconds").at(r).get<double>()));
          CHECK(v.steps[s].ranks[r].link_bytes == step.at("link_bytes").at(r).get<std::int64_t>());
        }
      }
    }
}

TEST_CASE("zigzag and striped balance causal work; contiguous leaves the last rank with the most") {
  for (int P : {2, 4, 8}) {
    CAPTURE(P);
    const int seq = 4096, c = seq / P;
    const RingMachine machine;
    const RingView contiguous = ring_view(RingLayout::Contiguous, settings(P, seq), machine);
    const RingView zigzag = ring_view(RingLayout::Zigzag, settings(P, seq), machine);
    const RingView striped = ring_view(RingLayout::Striped, settings(P, seq), machine);
    // Contiguous: the last rank sees P - 1 full blocks and its diagonal; the mean is the triangle / P.
    const double last = double(P - 1) * c * c + double(c) * (c + 1) / 2, mean = double(seq) * (seq + 1) / 2 / P;
    CHECK(close(contiguous.imbalance, last / mean));
    CHECK(zigzag.imbalance < contiguous.imbalance);
    CHECK(striped.imbalance < contiguous.imbalance);
    CHECK(zigzag.imbalance < 1.001);  // every rank holds one early and one late chunk: equal to within rounding of c
    CHECK(zigzag.seconds < contiguous.seconds);
    CHECK(zigzag.busy > contiguous.busy);
    // The busiest contiguous rank is the last; rank 0 computes only at step 0.
    CHECK(std::max_element(contiguous.work_per_rank.begin(), contiguous.work_per_rank.end()) -
              contiguous.work_per_rank.begin() == P - 1);
    for (int s = 1; s < P; ++s) CHECK(contiguous.steps[s].ranks[0].work_seconds == 0);
    // Without the mask every layout is balanced.
    for (RingLayout layout : kLayouts) CHECK(close(ring_view(layout, settings(P, seq, false), machine).imbalance, 1.0));
  }
}

TEST_CASE("the transport's clock lays the P steps over the stream, and a step's first event maps back to it") {
  for (int P = 1; P <= kMaxPanelRanks; ++P)
    for (std::int64_t events : {std::int64_t(P), std::int64_t(1000), std::int64_t(6'000'001)}) {
      CAPTURE(P);
      CAPTURE(events);
      for (int s = 0; s < P; ++s) {
        const std::int64_t e = event_of_ring_step(s, events, P);
        const RingPosition at = ring_position(e, events, P);
        CHECK(at.step == s);
        CHECK(at.progress >= 0.0);
        CHECK(at.progress < 1.0);
        if (s > 0) CHECK(ring_position(e - 1, events, P).step == s - 1);
      }
      const RingPosition end = ring_position(events, events, P);
      CHECK(end.step == P - 1);
      CHECK(end.progress == 1.0);
      CHECK(ring_position(0, events, P).step == 0);
      CHECK(event_of_ring_step(P + 3, events, P) == event_of_ring_step(P - 1, events, P));  // clamped
    }
  CHECK(hop_fraction(0.0) == 0.0);
  CHECK(hop_fraction(kHopStarts) == 0.0);
  CHECK(hop_fraction(1.0) == 1.0);
  CHECK(hop_fraction(0.8) > hop_fraction(0.7));
}

TEST_CASE("measured times replace the model's: idle is the step's slowest rank minus each rank's work") {
  const MeasuredRing m = parse_measured_ring(measured_json().dump(), "runs/h100-ring.json");
  CHECK(m.device == "test device");
  CHECK(m.layout == RingLayout::Zigzag);
  CHECK(m.settings.ranks == 4);
  CHECK(m.settings.measured == "runs/h100-ring.json");
  const RingView v = ring_view(m);
  CHECK(v.measured);
  CHECK(v.source.find("measured on test device") != std::string::npos);
  CHECK(v.source.find("h100-ring.json") != std::string::npos);
  double total = 0;
  for (int s = 0; s < 4; ++s) {
    const double slowest = (1.0 + 0.25 * 3 + 0.5 * s) * 1e-3;
    CHECK(close(v.steps[s].seconds, slowest));
    for (int r = 0; r < 4; ++r) {
      CHECK(close(v.steps[s].ranks[r].work_seconds, (1.0 + 0.25 * r + 0.5 * s) * 1e-3));
      CHECK(close(v.steps[s].ranks[r].idle_seconds, slowest - v.steps[s].ranks[r].work_seconds));
      CHECK(v.steps[s].ranks[r].transfer_seconds == 0);  // no rate was measured for the link
    }
    total += slowest;
  }
  CHECK(close(v.seconds, total));
  // Rank 3 works 1.75 + 0.5 s ms per step against a mean of 1.375 + 0.5 s.
  CHECK(close(v.imbalance, (4 * 1.75 + 3) / (4 * 1.375 + 3)));

  // In the panel, the file's layout is measured and the others are the model's, for the file's problem.
  RingSettings same = m.settings;
  const std::vector<RingColumn> columns = ring_columns(same, RingMachine{}, &m);
  REQUIRE(columns.size() == 3);
  CHECK(!columns[0].view->measured);
  CHECK(columns[1].view->measured);
  CHECK(!columns[2].view->measured);
  RingSettings other = same;
  other.seq = 2048;
  try {
    ring_columns(other, RingMachine{}, &m);
    FAIL("a measured file for another problem must be refused");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("was recorded for P = 4, N = 1024") != std::string::npos);
    CHECK(std::string(e.what()).find("the panel is set to P = 4, N = 2048") != std::string::npos);
  }
}

TEST_CASE("a malformed measured file is refused with one sentence naming the file and the mistake") {
  auto with = [](const char* key, const nlohmann::json& value) {
    nlohmann::json j = measured_json();
    j[key] = value;
    return j.dump();
  };
  auto without = [](const char* key) {
    nlohmann::json j = measured_json();
    j.erase(key);
    return j.dump();
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"device\": ", "is not valid JSON"},
      {"[1, 2]", "must hold a JSON object"},
      {without("device"), "the key \"device\" is missing"},
      {without("step_ms"), "the key \"step_ms\" is missing"},
      {with("devices", "x"), "unknown key \"devices\""},
      {with("device", ""), "\"device\" must name the device"},
      {with("layout", "spiral"), "unknown ring layout 'spiral'"},
      {with("P", 0), "\"P\" must be a positive integer"},
      {with("P", 9), "the Ring panel draws 1 to 8 ranks"},
      {with("N", 1004), "not a multiple of it"},  // zigzag: 2P = 8 does not divide 1004
      {with("causal", "yes"), "\"causal\" must be true or false"},
      {with("pass", "sideways"), "\"pass\" must be forward or backward"},
      {with("step_ms", nlohmann::json::array({{1, 2, 3, 4}})), "\"step_ms\" must hold P = 4 rows, one per step, got 1 rows"},
      {with("step_ms", {{1, 2, 3, 4}, {1, 2, 3}, {1, 2, 3, 4}, {1, 2, 3, 4}}), "row 1 of \"step_ms\" must hold P = 4 times"},
      {with("step_ms", {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, -2, 3, 4}, {1, 2, 3, 4}}), "row 2 of \"step_ms\" holds -2"},
      {with("step_ms", {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, {1, "fast", 3, 4}}), "holds \"fast\", not a time"},
      {with("step_ms", 7), "\"step_ms\" must hold P = 4 rows"},
  };
  for (const auto& [text, expected] : cases) {
    CAPTURE(text);
    const std::string e = measured_error(text);
    CHECK(e.find(expected) != std::string::npos);
    CHECK(e.rfind("ring.json", 0) == 0);  // names the file first
    CHECK(std::count(e.begin(), e.end(), '\n') == 0);
  }
  CHECK(measured_error(measured_json().dump()).empty());
  CHECK_THROWS_WITH_AS(load_measured_ring("/nonexistent/ring.json"),
                       "cannot read the measured ring file '/nonexistent/ring.json'", InputError);
}

TEST_CASE("a layout that cannot run the problem says why in its column; the others are drawn") {
  const std::vector<RingColumn> columns = ring_columns(settings(4, 1004), RingMachine{});
  REQUIRE(columns.size() == 3);
  CHECK(columns[0].view.has_value());
  CHECK(!columns[1].view.has_value());
  CHECK(columns[1].error.find("zigzag layout cuts the sequence into 2P = 8 equal chunks") != std::string::npos);
  CHECK(columns[2].view.has_value());
  CHECK_THROWS_WITH_AS(ring_view(RingLayout::Striped, settings(0, 1004), RingMachine{}),
                       "the Ring panel draws 1 to 8 ranks, got P = 0 (flashlab trace --ring takes more)", InputError);
}

TEST_CASE("the scenario's \"ring\" object: parsed, written back, checked, and the step it opens at") {
  const Scenario s = parse_scenario(R"({"panels": ["transport", "ring"], "ring": {"ranks": 6, "seq": 6144,
      "heads": 8, "head_dim": 64, "causal": false, "pass": "backward", "step": 2}})");
  CHECK(s.ring.ranks == 6);
  CHECK(s.ring.seq == 6144);
  CHECK(s.ring.heads == 8);
  CHECK(s.ring.head_dim == 64);
  CHECK(!s.ring.causal);
  CHECK(s.ring.pass == Pass::Backward);
  CHECK(s.ring.step == 2);
  CHECK(parse_scenario(to_json(s)).ring == s.ring);  // round trip
  CHECK(parse_scenario("{}").ring == RingSettings{});
  CHECK(RingSettings{}.causal);  // the panel opens on the causal mask

  CHECK(start_event(s, 6000) == event_of_ring_step(2, 6000, 6));
  CHECK(ring_position(start_event(s, 6000), 6000, 6).step == 2);
  Scenario stepped = s;
  stepped.step = 17;  // the loop nest's own step wins
  CHECK(start_event(stepped, 6000) == 17);
  CHECK(start_event(parse_scenario("{}"), 6000) == 6000);  // the end, as before

  CHECK(scenario_error(R"({"ring": {"rank": 4}})").find("unknown key \"rank\" in \"ring\"") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"ranks": 0}})").find("\"ranks\" must be in [1, 8]") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"ranks": 9}})").find("\"ranks\" must be in [1, 8]") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"ranks": 4, "step": 4}})").find("step 4 does not exist") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"causal": "yes"}})").find("must be true or false") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"pass": "up"}})").find("unknown pass 'up'") != std::string::npos);
  CHECK(scenario_error(R"({"ring": 4})").find("\"ring\" must be an object") != std::string::npos);
  // A length some layout cannot take is the panel's business, column by column (zigzag needs 2P | N).
  const Scenario short_ring = parse_scenario(R"({"ring": {"ranks": 4, "seq": 2}})");
  for (const RingColumn& c : ring_columns(short_ring.ring, RingMachine{})) {
    CAPTURE(to_string(c.layout));
    CHECK(!c.view.has_value());
    CHECK(c.error.find(c.layout == RingLayout::Zigzag ? "is not a multiple of it" : "seq_q = 2 is shorter than the 4 ranks") !=
          std::string::npos);
  }
  for (const std::string& e : {scenario_error(R"({"ring": {"rank": 4}})"), scenario_error(R"({"ring": 4})")})
    CHECK(e.rfind("test.json", 0) == 0);
}

TEST_CASE("the lesson's scenario shows the ring, causal, with all three layouts drawable") {
  const Scenario s = load_scenario_file(std::string(FLASHLAB_SOURCE_DIR) + "/viz/scenarios/lesson09-ring.json");
  CHECK(std::find(s.panels.begin(), s.panels.end(), "ring") != s.panels.end());
  CHECK(s.ring.causal);
  CHECK(s.ring.measured.empty());  // no measurement is shipped: the figure shows the model
  for (const RingColumn& c : ring_columns(s.ring, RingMachine{})) {
    CAPTURE(to_string(c.layout));
    CHECK(c.error.empty());
    REQUIRE(c.view.has_value());
  }
}

// --- A measured ring timeline beside the model.

namespace {

const std::filesystem::path kTimelines = std::filesystem::path(FLASHLAB_SOURCE_DIR) / "viz" / "timelines";

// The demo's run: made up by the toy simulation, labelled so.
Timeline demo_ring() {
  // A slow link (60 GB/s), so that some hops outlast the compute they should hide behind.
  return synthetic_ring_timeline(
      {.link_bytes_per_second = 60e9, .label = "4 ranks simulated at 450 TFLOP/s and 60 GB/s, not measured"});
}

std::string trace_text(const Timeline& t) {
  std::ostringstream out;
  write_trace_event_json(t, out);
  return out.str();
}

// Two ranks, forward, no mask, times in microseconds (the hand-made run of tests/test_ring_measured.cpp):
//   rank 0  compute 0-100, merge 100-110 | compute 120-220, merge 220-230;  K/V hop 20-70
//   rank 1  compute 10-90, merge 90-100  | compute 170-250, merge 250-260;  K/V hop 60-160
Timeline two_ranks() {
  Timeline t{.device = "dev", .variant = "ring", .label = "synthetic: two ranks", .info = {}, .spans = {}};
  t.info = {{"ranks", "2"},  {"layout", "contiguous"}, {"pass", "forward"}, {"batch", "1"},     {"heads", "8"},
            {"heads_kv", "8"}, {"seq", "1024"},       {"head_dim", "64"},   {"causal", "none"}, {"dtype", "bf16"},
            {"block_kernel", "cuda-fa2"}};
  const auto add = [&](std::uint32_t r, PipelineEvent e, int step, std::uint64_t b, std::uint64_t end) {
    t.spans.push_back({.block = r, .warpgroup = e == PipelineEvent::RingSendRecv ? 1u : 0u, .event = e,
                       .begin_ns = 7000 + b * 1000, .end_ns = 7000 + end * 1000, .step = step});
  };
  using E = PipelineEvent;
  add(0, E::RingCompute, 0, 0, 100), add(0, E::RingMerge, 0, 100, 110), add(0, E::RingSendRecv, 0, 20, 70);
  add(0, E::RingCompute, 1, 120, 220), add(0, E::RingMerge, 1, 220, 230);
  add(1, E::RingCompute, 0, 10, 90), add(1, E::RingMerge, 0, 90, 100), add(1, E::RingSendRecv, 0, 60, 160);
  add(1, E::RingCompute, 1, 170, 250), add(1, E::RingMerge, 1, 250, 260);
  return t;
}

}  // namespace

TEST_CASE("the model's bars are ring_cost's: steps end to end, compute for FLOPs / rate, hops at the link's rate") {
  const Shape shape{.batch = 1, .heads_q = 16, .heads_kv = 16, .seq_q = 8192, .seq_k = 8192, .head_dim = 128};
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    const RingSchedule ring = ring_schedule(RingLayout::Contiguous, 4, 8192, 8192, CausalAlign::TopLeft);
    const RingMachine machine{.flops_per_second = 300e12, .link_bytes_per_second = 50e9};
    const RingCost cost = ring_cost(ring, shape, pass, machine);
    const RingGantt g = model_gantt(ring, shape, pass, machine, "model");
    REQUIRE(g.step_begin_seconds.size() == 4);
    CHECK(close(g.seconds, cost.seconds));
    for (int s = 0; s < 4; ++s) {
      CHECK(close(g.step_end_seconds[s] - g.step_begin_seconds[s], cost.steps[s].seconds));
      for (int r = 0; r < 4; ++r) {
        double compute = 0, link = 0, compute_end = g.step_begin_seconds[s];
        for (const RingBar& b : g.bars)
          if (b.rank == r && b.step == s) {
            CHECK(b.begin_seconds >= g.step_begin_seconds[s]);
            CHECK(b.share == ring.steps[s][r].kv_origin);
            if (b.lane == 0) compute += b.end_seconds - b.begin_seconds, compute_end = b.end_seconds;
            else link += b.end_seconds - b.begin_seconds;
          }
        CHECK(close(compute, cost.steps[s].flops[r] / machine.flops_per_second));
        CHECK(close(link, double(cost.steps[s].link_bytes[r]) / machine.link_bytes_per_second));
        // A hop is exposed exactly where it outlasts the rank's compute.
        for (const RingBar& b : g.bars)
          if (b.rank == r && b.step == s && b.lane == 1) {
            double exposed = 0;
            for (const auto& [eb, ee] : b.exposed) exposed += ee - eb;
            CHECK(close(exposed, std::max(0.0, b.end_seconds - std::max(b.begin_seconds, compute_end))));
          }
      }
    }
  }
}

TEST_CASE("a measured timeline's view: its spans as bars, the waits on the link, per step model against measured") {
  const RingMachine assumed{.flops_per_second = 100e12, .link_bytes_per_second = 25e9};
  const RingTimelineView v = ring_timeline_view(two_ranks(), "t.json", assumed);
  CHECK(v.problem == "P = 2, contiguous, N = 1024, batch 1, 8 heads (8 K/V), d = 64, causal none, bf16, forward, "
                     "cuda-fa2 blocks");
  CHECK(v.gantt.title == "measured: synthetic: two ranks");
  CHECK(v.gantt.bars.size() == 10);
  // Rank 1's hop (60-160 us) is exposed where its compute stream idles: 100-160 us (it computes again at 170).
  const int hop = bar_at(v.gantt, 1, 1, 100e-6);
  REQUIRE(hop >= 0);
  const RingBar& b = v.gantt.bars[std::size_t(hop)];
  CHECK(b.kind == RingBarKind::KV);
  CHECK(b.share == 1);  // at step 0 rank 1 holds (and sends on) its own share
  REQUIRE(b.exposed.size() == 1);
  CHECK(b.exposed[0].first == doctest::Approx(100e-6));
  CHECK(b.exposed[0].second == doctest::Approx(160e-6));
  const int inside = bar_at(v.gantt, 0, 1, 50e-6);
  REQUIRE(inside >= 0);
  CHECK(v.gantt.bars[std::size_t(inside)].exposed.empty());  // rank 0's hop lies inside its compute
  CHECK(bar_at(v.gantt, 0, 1, 100e-6) == -1);                // no hop there
  CHECK(v.gantt.bars[std::size_t(bar_at(v.gantt, 0, 0, 105e-6))].kind == RingBarKind::Merge);

  // The steps: the model at the assumed rates, at the measured ones, and the measurement.
  REQUIRE(v.steps.size() == 2);
  CHECK(v.steps[0].measured_seconds == doctest::Approx(120e-6));
  CHECK(v.steps[1].measured_seconds == doctest::Approx(140e-6));
  CHECK(v.steps[0].slowest_rank == 0);
  CHECK(*v.steps[0].hidden_fraction == doctest::Approx(0.6));
  CHECK(!v.steps[1].hidden_fraction);
  CHECK(v.steps[0].model_seconds == doctest::Approx(v.assumed_cost.steps[0].seconds));
  CHECK(v.assumed.flops_per_second == 100e12);
  CHECK(v.replayed.flops_per_second == doctest::Approx(v.measured.flops_per_second));
  // At the measured (mean) rate each step computes 90 us, longer than the 1 MiB hop at the median link.
  CHECK(v.steps[0].replay_seconds == doctest::Approx(90e-6));
  CHECK(v.steps[0].replay_error() == doctest::Approx(90.0 / 120.0 - 1));
  CHECK(v.seconds_max == doctest::Approx(260e-6));  // the run is the longest of the three here
}

TEST_CASE("the synthetic ring is read like a measured one and keeps to the rates it was made with") {
  for (RingLayout layout : kLayouts)
    for (Pass pass : {Pass::Forward, Pass::Backward})
      for (int P : {1, 2, 4}) {
        CAPTURE(to_string(layout));
        CAPTURE(P);
        CAPTURE(pass == Pass::Forward);
        const SyntheticRing cfg{.layout = layout, .ranks = P, .seq = 4096, .pass = pass, .label = "test"};
        const Timeline t = synthetic_ring_timeline(cfg);
        CHECK(t.label == "synthetic: test");
        CHECK(t.device.find("synthetic") != std::string::npos);
        const RingMeasurement m = measure_ring(t, "synthetic");  // a well-formed ring timeline
        CHECK(m.run.ranks == P);
        // Each compute lasts launch + FLOPs / rate * (1 + jitter * w), |w| <= 1, so the rate the spans imply is
        // within those bounds.
        double flops = 0, spans = 0;
        const RingCost work = ring_cost(m.schedule, m.run.shape, pass, RingMachine{});
        for (const auto& step : work.steps)
          for (double f : step.flops) flops += f, spans += f > 0;
        CHECK(m.flops_per_second <= cfg.flops_per_second / (1 - cfg.jitter));
        CHECK(m.flops_per_second >= flops / (spans * cfg.launch_seconds + flops / cfg.flops_per_second * (1 + cfg.jitter)));
        // A hop moves its bytes at the link's rate (+- half the jitter) after waiting for its neighbours: never faster.
        for (const MeasuredTransfer& x : m.transfers)
          CHECK(x.bytes_per_second() <= cfg.link_bytes_per_second / (1 - 0.5 * cfg.jitter));
        if (P > 1) CHECK(m.best_bytes_per_second.has_value());
      }
}

TEST_CASE("a ring timeline file loads into the panel, and a bad one gives its one sentence") {
  const auto dir = std::filesystem::temp_directory_path() / "flashlab_ring_view_timeline";
  std::filesystem::create_directories(dir);
  const std::string text = trace_text(demo_ring());
  const auto good = dir / "ring.json";
  std::ofstream(good) << text;
  const LoadedRingTimeline l = load_ring_timeline(good.string());
  REQUIRE_MESSAGE(l.view, l.error);
  CHECK(l.view->path == good.string());
  CHECK(l.view->steps.size() == 4);
  CHECK(is_trace_event_file(good.string()));

  const auto cut = dir / "cut.json";
  std::ofstream(cut) << text.substr(0, text.size() / 2);
  const LoadedRingTimeline c = load_ring_timeline(cut.string());
  CHECK(!c.view);
  CHECK(c.error.rfind("timeline " + cut.string() + " is not valid JSON: it ends early, after", 0) == 0);
  CHECK(is_trace_event_file(cut.string()));  // still a ring timeline, so the panel says what is wrong with it

  const LoadedRingTimeline hopper = load_ring_timeline((kTimelines / "synthetic-ladder2.trace.json").string());
  CHECK(hopper.error.find("is not a ring timeline") != std::string::npos);
  CHECK(load_ring_timeline((dir / "missing.json").string()).error.rfind("cannot read timeline file", 0) == 0);

  const auto big = dir / "big.json";
  std::ofstream(big) << trace_text(synthetic_ring_timeline({.layout = RingLayout::Striped, .ranks = 9, .seq = 9 * 128,
                                                            .label = "nine"}));
  CHECK(load_ring_timeline(big.string()).error.find("is a ring of 9 ranks; the Ring panel draws 1 to 8") !=
        std::string::npos);

  const auto times = dir / "times.json";
  std::ofstream(times) << measured_json().dump();
  CHECK(!is_trace_event_file(times.string()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the committed synthetic ring timeline is the generator's output, byte for byte") {
  // To regenerate after changing the generator: FLASHLAB_WRITE_TIMELINES=1 build-cpu/bin/ring_view_tests
  const auto path = kTimelines / "synthetic-ring-zigzag-p4.trace.json";
  const std::string want = trace_text(demo_ring());
  if (std::getenv("FLASHLAB_WRITE_TIMELINES")) std::ofstream(path, std::ios::binary) << want;
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "missing " << path.string() << "; run with FLASHLAB_WRITE_TIMELINES=1");
  std::ostringstream have;
  have << in.rdbuf();
  CHECK_MESSAGE(have.str() == want, path.string() << " differs from the generator; run with FLASHLAB_WRITE_TIMELINES=1");
}

TEST_CASE("the measured-ring scenario names a ring timeline, relative to its folder, and the panel can show it") {
  const Scenario s = load_scenario_file(std::string(FLASHLAB_SOURCE_DIR) + "/viz/scenarios/lesson09-ring-measured.json");
  CHECK(std::find(s.panels.begin(), s.panels.end(), "ring") != s.panels.end());
  REQUIRE(!s.ring.timeline.empty());
  CHECK(s.ring.timeline.find("..") == std::string::npos);
  CHECK(s.ring.measured.empty());
  const LoadedRingTimeline l = load_ring_timeline(s.ring.timeline);
  REQUIRE_MESSAGE(l.view, l.error);
  // A synthetic run (until a GPU run is recorded) is named so, and says so in its label; a measured one neither.
  const bool named_synthetic = std::filesystem::path(s.ring.timeline).filename().string().find("synthetic") != std::string::npos;
  CHECK(named_synthetic == (l.view->label.rfind("synthetic: ", 0) == 0));

  const Scenario parsed = parse_scenario(R"({"ring": {"timeline": "runs/ring.json"}})");
  CHECK(parsed.ring.timeline == "runs/ring.json");
  CHECK(parse_scenario(to_json(parsed)).ring == parsed.ring);  // round trip
  CHECK(scenario_error(R"({"ring": {"timeline": "a.json", "measured": "b.json"}})")
            .find("names both a measured-times file and a timeline") != std::string::npos);
  CHECK(scenario_error(R"({"ring": {"timeline": 3}})").find("\"timeline\" must be a string") != std::string::npos);
}

TEST_CASE("`flashlab trace --ring --from-timeline` prints the panel's numbers, and the timeline fixes the problem") {
  const auto path = std::filesystem::temp_directory_path() / "flashlab_ring_view_trace.json";
  const Timeline t = synthetic_ring_timeline({.pass = Pass::Backward, .label = "trace"});
  std::ofstream(path) << trace_text(t);
  const auto run = [&](std::vector<std::string> extra, std::string& text) {
    std::vector<std::string> args = {"trace", "--ring", "4", "--from-timeline", path.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    std::ostringstream out, err;
    const int rc = run_cli(args, out, err);
    text = rc == 0 ? out.str() : err.str();
    return rc;
  };
  std::string text;
  REQUIRE_MESSAGE(run({"--json", "--tflops", "300", "--link-gbs", "100"}, text) == 0, text);
  const nlohmann::json j = nlohmann::json::parse(text);
  const RingTimelineView v =
      ring_timeline_view(t, "t", RingMachine{.flops_per_second = 300e12, .link_bytes_per_second = 100e9});
  CHECK(j.at("pass") == "backward");
  CHECK(close(j.at("measured_rates").at("flops_per_second").get<double>(), v.measured.flops_per_second));
  CHECK(close(j.at("measured_rates").at("median_link_bytes_per_second").get<double>(), *v.measured.median_bytes_per_second));
  for (int s = 0; s < 4; ++s) {
    const nlohmann::json& step = j.at("steps").at(s);
    CHECK(close(step.at("model_seconds").get<double>(), v.steps[s].model_seconds));
    CHECK(close(step.at("model_measured_rates_seconds").get<double>(), v.steps[s].replay_seconds));
    CHECK(close(step.at("measured_seconds").get<double>(), v.steps[s].measured_seconds));
    CHECK(close(step.at("error").get<double>(), v.steps[s].replay_error()));
    CHECK(close(step.at("hidden_fraction").get<double>(), *v.steps[s].hidden_fraction));  // the backward hops every step
  }
  CHECK(close(j.at("measured_seconds").get<double>(), v.measured.seconds));
  // The text table has a row per step and one for the ring.
  REQUIRE(run({}, text) == 0);
  CHECK(text.find("step  model, assumed (us)") != std::string::npos);
  CHECK(text.find("\nring  ") != std::string::npos);

  CHECK(run({"--seq-q", "1024"}, text) != 0);
  CHECK(text.find("--seq-q does not apply with --from-timeline: the timeline's info fixes the problem") != std::string::npos);
  std::vector<std::string> wrong = {"trace", "--ring", "8", "--from-timeline", path.string()};
  std::ostringstream out, err;
  CHECK(run_cli(wrong, out, err) != 0);
  CHECK(err.str().find("--ring 8 does not match the timeline, a ring of 4 ranks") != std::string::npos);
  std::filesystem::remove(path);
}
