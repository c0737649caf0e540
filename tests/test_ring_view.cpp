// The Ring panel's logic (viz/logic/ring_view.hpp), without a window: the shares it shows rotate one
// rank per step along the schedule's send_to; each rank's idle time is its step's time minus its
// work; the model's numbers are ring_cost's and `flashlab trace --ring`'s; zigzag and striped remove
// the causal imbalance that contiguous has, by the exact count of visible scores; the transport's
// clock maps onto the ring's steps and back; measured-times files are read, and each kind of mistake
// in one is refused with one sentence naming the file; the scenario's "ring" object parses.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
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
  const Scenario s = load_scenario_file(std::string(FLASHLAB_SOURCE_DIR) + "/viz/scenarios/lesson07-ring.json");
  CHECK(std::find(s.panels.begin(), s.panels.end(), "ring") != s.panels.end());
  CHECK(s.ring.causal);
  CHECK(s.ring.measured.empty());  // no measurement is shipped: the figure shows the model
  for (const RingColumn& c : ring_columns(s.ring, RingMachine{})) {
    CAPTURE(to_string(c.layout));
    CHECK(c.error.empty());
    REQUIRE(c.view.has_value());
  }
}
