// The Pipeline panel's logic (viz/logic/pipeline_view.hpp), without a window: the time window (fit,
// zoom around a point, pan, clamped to the data), lanes (block then warpgroup, two timelines stacked
// with a title each), time <-> pixels, hit-testing and its hover text, colours per kind, loading bad
// files as one sentence, a ring's timeline (rank and stream lanes), and the committed synthetic example timelines (viz/timelines/) being exactly
// what the generator writes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "app/palette.hpp"
#include "core/problem.hpp"
#include "logic/pipeline_view.hpp"
#include "logic/scenario.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

// Block 0: producer WG0 and consumer WG1; block 1: consumer WG1 only. Stamps start at 1000 ns.
Timeline tiny() {
  return Timeline{.device = "dev",
                  .variant = "cuda-fa3-ws",
                  .label = "synthetic: tiny",
                  .producer_warpgroups = 1,
                  .spans = {
                      {.block = 1, .warpgroup = 1, .event = PipelineEvent::Softmax, .begin_ns = 1500, .end_ns = 1900},
                      {.block = 0, .warpgroup = 1, .event = PipelineEvent::BarrierWait, .begin_ns = 1000, .end_ns = 2000},
                      {.block = 0, .warpgroup = 1, .event = PipelineEvent::TmaLanded, .begin_ns = 2000, .end_ns = 2000},
                      {.block = 0, .warpgroup = 0, .event = PipelineEvent::TmaIssue, .begin_ns = 1000, .end_ns = 1000},
                      {.block = 0, .warpgroup = 1, .event = PipelineEvent::Softmax, .begin_ns = 2100, .end_ns = 2105},
                  }};
}

std::string text_of(const Timeline& t) {
  std::ostringstream out;
  write_trace_event_json(t, out);
  return out.str();
}

const std::filesystem::path kTimelines = std::filesystem::path(FLASHLAB_SOURCE_DIR) / "viz" / "timelines";

// The demo's two timelines: ladder step 2 (consumers share the tensor cores at once) above step 3
// (they take turns, so one's softmax hides under the other's wgmma). Made up, labelled so.
Timeline demo(bool overlap) {
  return synthetic_timeline({.blocks = 2, .consumers = 2, .kv_tiles = 6, .stages = 2, .overlap = overlap,
                             .label = overlap ? "ladder step 3 (ping-pong consumers), a toy model, not measured"
                                              : "ladder step 2 (consumers in lock-step), a toy model, not measured"});
}

}  // namespace

TEST_CASE("fit, zoom around a point, pan, and clamping to the data") {
  const double end = 10'000;
  const TimeWindow all = fit_all(end);
  CHECK(all.begin_ns < 0);
  CHECK(all.end_ns > end);
  CHECK(all.begin_ns == doctest::Approx(-200));
  CHECK(all.end_ns == doctest::Approx(10'200));

  // Zooming in by 2 around t = 4000 keeps 4000 at the same place in the window.
  const TimeWindow z = zoom(all, 4000, 0.5, end);
  CHECK(z.width() == doctest::Approx(all.width() / 2));
  CHECK((4000 - z.begin_ns) / z.width() == doctest::Approx((4000 - all.begin_ns) / all.width()));
  // Zooming in forever stops at the minimum width, still around the point.
  TimeWindow deep = all;
  for (int k = 0; k < 200; ++k) deep = zoom(deep, 4000, 0.5, end);
  CHECK(deep.width() == doctest::Approx(kMinWindowNs));
  CHECK(deep.begin_ns <= 4000);
  CHECK(deep.end_ns >= 4000);
  // Zooming out never goes past fit-all.
  CHECK(zoom(z, 4000, 100, end) == all);

  // Pan: moves, but not past either edge.
  const TimeWindow p = pan(z, 1000, end);
  CHECK(p.begin_ns == doctest::Approx(z.begin_ns + 1000));
  CHECK(p.width() == doctest::Approx(z.width()));
  CHECK(pan(z, 1e9, end).end_ns == doctest::Approx(all.end_ns));
  CHECK(pan(z, -1e9, end).begin_ns == doctest::Approx(all.begin_ns));
  // Nonsense windows become fit-all.
  CHECK(clamp_window({.begin_ns = 5, .end_ns = 5}, end) == all);
  CHECK(clamp_window({.begin_ns = NAN, .end_ns = 1}, end) == all);
}

TEST_CASE("time <-> pixels, ticks and labels") {
  const TimeWindow w{.begin_ns = 1000, .end_ns = 3000};
  CHECK(x_of(w, 1000, 50, 400) == doctest::Approx(50));
  CHECK(x_of(w, 2000, 50, 400) == doctest::Approx(250));
  CHECK(x_of(w, 3000, 50, 400) == doctest::Approx(450));
  CHECK(t_of(w, 250, 50, 400) == doctest::Approx(2000));
  CHECK(time_ticks(w, 5) == std::vector<double>{1000, 1500, 2000, 2500, 3000});
  CHECK(time_ticks({.begin_ns = -100, .end_ns = 1000}, 4) == std::vector<double>{0, 500, 1000});
  CHECK(format_us(1234) == "1.234 \xC2\xB5s");
  CHECK(format_us(2000, 500) == "2.0 \xC2\xB5s");
  CHECK(format_us(12000, 5000) == "12 \xC2\xB5s");
}

TEST_CASE("lanes: one per (block, warpgroup), ordered, two timelines stacked with a title each") {
  const Timeline a = tiny(), b = tiny();
  const LaneMetrics m{.lane_height = 20, .lane_gap = 2, .block_gap = 6, .title_height = 18, .group_gap = 10};
  const LaneLayout one = layout_lanes({&a}, m);
  REQUIRE(one.groups.size() == 1);
  CHECK(one.groups[0].title == "synthetic: tiny  \xC2\xB7  cuda-fa3-ws  \xC2\xB7  dev");
  REQUIRE(one.lanes.size() == 3);
  CHECK(one.lanes[0].name == "block 0 producer WG0");
  CHECK(one.lanes[1].name == "block 0 consumer WG1");
  CHECK(one.lanes[2].name == "block 1 consumer WG1");
  CHECK(one.lanes[0].y0 == 18);
  CHECK(one.lanes[1].y0 == 18 + 22);
  CHECK(one.lanes[2].y0 == 18 + 44 + 6);  // a gap between blocks
  CHECK(one.height == doctest::Approx(18 + 66 + 6));

  const LaneLayout two = layout_lanes({&a, &b}, m);
  REQUIRE(two.groups.size() == 2);
  REQUIRE(two.lanes.size() == 6);
  CHECK(two.groups[1].timeline == 1);
  CHECK(two.groups[1].y0 == doctest::Approx(one.height + 10));  // the second group sits below the first
  CHECK(two.lanes[3].timeline == 1);
  CHECK(two.lanes[3].y0 == doctest::Approx(two.groups[1].y0 + 18));
  for (std::size_t k = 1; k < two.lanes.size(); ++k) CHECK(two.lanes[k].y0 >= two.lanes[k - 1].y1);  // no overlap

  // A missing compare file keeps the first group alone; lanes fit the height they are given.
  CHECK(layout_lanes({&a, nullptr}, m).lanes.size() == 3);
  const LaneMetrics fitted = fit_lanes({&a, &b}, 400);
  CHECK(layout_lanes({&a, &b}, fitted).height <= 400 + 1e-3);
  CHECK(fit_lanes({&a, &b}, 50).lane_height == 12);  // no smaller than readable
  CHECK(fit_lanes({&a}, 5000).lane_height == 36);
}

TEST_CASE("hit-testing finds the span under the mouse and says what it is") {
  const Timeline t = tiny();
  const std::vector<const Timeline*> ts = {&t};
  const LaneMetrics m{.lane_height = 20, .lane_gap = 2, .block_gap = 6, .title_height = 18, .group_gap = 10};
  const LaneLayout layout = layout_lanes(ts, m);
  const TimeWindow w{.begin_ns = 0, .end_ns = 1200};  // 1 px = 3 ns at width 400
  const float width = 400;
  const float lane1 = (layout.lanes[1].y0 + layout.lanes[1].y1) / 2;  // block 0 consumer WG1
  // The barrier wait: 0..1000 ns after the start.
  auto hit = hit_test(layout, ts, w, x_of(w, 500, 0, width), lane1, width);
  REQUIRE(hit);
  CHECK(t.spans[hit->span].event == PipelineEvent::BarrierWait);
  CHECK(hover_text(t, hit->span) == "barrier_wait\nblock 0 consumer WG1\nstart 0.000 \xC2\xB5s, duration 1.000 \xC2\xB5s");
  // Near the end of the wait the instant (TMA landed at 1000 ns) wins.
  hit = hit_test(layout, ts, w, x_of(w, 1003, 0, width), lane1, width);
  REQUIRE(hit);
  CHECK(t.spans[hit->span].event == PipelineEvent::TmaLanded);
  CHECK(hover_text(t, hit->span) == "tma_landed\nblock 0 consumer WG1\nat 1.000 \xC2\xB5s (instant)");
  // A 5 ns softmax is still hit a few pixels away (it is drawn at least that wide).
  hit = hit_test(layout, ts, w, x_of(w, 1102 + 9, 0, width), lane1, width);
  REQUIRE(hit);
  CHECK(t.spans[hit->span].event == PipelineEvent::Softmax);
  // Empty space, the title line and outside the plot: nothing.
  CHECK(!hit_test(layout, ts, w, x_of(w, 1050, 0, width), lane1, width));
  CHECK(!hit_test(layout, ts, w, 100, 5, width));
  CHECK(!hit_test(layout, ts, w, -3, lane1, width));
  // Block 1's lane is its own.
  const float lane2 = (layout.lanes[2].y0 + layout.lanes[2].y1) / 2;
  hit = hit_test(layout, ts, w, x_of(w, 700, 0, width), lane2, width);
  REQUIRE(hit);
  CHECK(t.spans[hit->span].block == 1);
}

TEST_CASE("each event kind has its own colour from the app's palette") {
  std::set<int> seen;
  for (int k = 0; k < kPipelineEventCount; ++k) {
    const int c = palette_index(static_cast<PipelineEvent>(k));
    CHECK(c >= 0);
    CHECK(c < palette::kSeriesCount);
    seen.insert(c);
  }
  CHECK(seen.size() == std::size_t(kPipelineEventCount));
}

TEST_CASE("a ring timeline opens: rank and stream lanes, its step in the hover text, only its kinds in the legend") {
  Timeline ring{.device = "dev", .variant = "ring", .label = "synthetic: ring", .info = {{"ranks", "2"}}, .spans = {}};
  using E = PipelineEvent;
  ring.spans = {{.block = 0, .warpgroup = 0, .event = E::RingCompute, .begin_ns = 1000, .end_ns = 5000, .step = 0},
                {.block = 0, .warpgroup = 1, .event = E::RingSendRecv, .begin_ns = 1500, .end_ns = 3000, .step = 0},
                {.block = 0, .warpgroup = 0, .event = E::RingMerge, .begin_ns = 5000, .end_ns = 5200, .step = 0},
                {.block = 1, .warpgroup = 0, .event = E::RingCompute, .begin_ns = 1100, .end_ns = 4000, .step = 0}};
  // It survives the file format, lanes and all.
  const auto path = std::filesystem::temp_directory_path() / "flashlab_pipeline_view_ring.json";
  std::ofstream(path) << text_of(ring);
  const LoadedTimeline l = load_timeline(path.string());
  std::filesystem::remove(path);
  REQUIRE_MESSAGE(l.timeline, l.error);
  const Timeline& t = *l.timeline;
  const LaneMetrics m{.lane_height = 20, .lane_gap = 2, .block_gap = 6, .title_height = 18, .group_gap = 10};
  const LaneLayout layout = layout_lanes({&t}, m);
  REQUIRE(layout.lanes.size() == 3);
  CHECK(layout.lanes[0].name == "rank 0 compute");
  CHECK(layout.lanes[1].name == "rank 0 communication");
  CHECK(layout.lanes[2].name == "rank 1 compute");
  const TimeWindow w{.begin_ns = 0, .end_ns = 4400};
  const auto hit = hit_test(layout, {&t}, w, x_of(w, 1000, 0, 440), (layout.lanes[1].y0 + layout.lanes[1].y1) / 2, 440);
  REQUIRE(hit);
  CHECK(hover_text(t, hit->span) ==
        "ring_send_recv\nrank 0 communication\nstart 0.500 \xC2\xB5s, duration 1.500 \xC2\xB5s\nring step 0");
  CHECK(kinds_in({&t, nullptr}) == std::vector<PipelineEvent>{E::RingCompute, E::RingSendRecv, E::RingMerge});
  for (PipelineEvent e : kinds_in({&t})) CHECK(is_ring_event(e));
}

TEST_CASE("loading a bad or truncated file gives its one sentence, never an exception") {
  const auto dir = std::filesystem::temp_directory_path() / "flashlab_pipeline_view_test";
  std::filesystem::create_directories(dir);
  const std::string good = text_of(tiny());
  const auto cut = dir / "cut.json";
  std::ofstream(cut) << good.substr(0, 300);
  const LoadedTimeline l = load_timeline(cut.string());
  CHECK(!l.timeline);
  CHECK(l.error.find("timeline " + cut.string() + " is not valid JSON: it ends early, after") == 0);
  const auto empty = dir / "empty.json";
  std::ofstream(empty) << R"({"traceEvents": []})";
  CHECK(load_timeline(empty.string()).error.find("holds no pipeline events") != std::string::npos);
  CHECK(load_timeline((dir / "missing.json").string()).error.find("cannot read timeline file") == 0);
  const auto ok = dir / "ok.json";
  std::ofstream(ok) << good;
  const LoadedTimeline g = load_timeline(ok.string());
  REQUIRE(g.timeline);
  CHECK(g.error.empty());
  CHECK(*g.timeline == tiny());
  std::filesystem::remove_all(dir);
}

TEST_CASE("the synthetic pipeline says so, is well formed, and overlap makes it shorter") {
  const Timeline lock = demo(false), ping = demo(true);
  CHECK(lock.label.rfind("synthetic: ", 0) == 0);
  CHECK(ping.device.find("synthetic") != std::string::npos);
  for (const Timeline* t : {&lock, &ping}) {
    std::set<std::pair<std::uint32_t, std::uint32_t>> lanes;
    for (const TimelineSpan& s : t->spans) {
      lanes.insert({s.block, s.warpgroup});
      CHECK(s.end_ns >= s.begin_ns);
      if (!is_span(s.event)) CHECK(s.end_ns == s.begin_ns);
    }
    CHECK(lanes.size() == 6);  // 2 blocks x (1 producer + 2 consumers)
    // The demo shows every kind of the Hopper kernel's warpgroups, and none of the ring's.
    std::vector<PipelineEvent> hopper;
    for (int k = 0; k < kPipelineEventCount; ++k)
      if (!is_ring_event(static_cast<PipelineEvent>(k))) hopper.push_back(static_cast<PipelineEvent>(k));
    CHECK(hopper.size() == 7);
    CHECK(kinds_in({t}) == hopper);
  }
  CHECK(ping.end_ns() - ping.start_ns() < lock.end_ns() - lock.start_ns());
}

TEST_CASE("the committed example timelines are the generator's output, byte for byte") {
  // To regenerate after changing the generator: FLASHLAB_WRITE_TIMELINES=1 build-cpu/bin/pipeline_view_tests
  const bool write = std::getenv("FLASHLAB_WRITE_TIMELINES") != nullptr;
  for (bool overlap : {false, true}) {
    const auto path = kTimelines / (overlap ? "synthetic-ladder3.trace.json" : "synthetic-ladder2.trace.json");
    const std::string want = text_of(demo(overlap));
    if (write) std::ofstream(path, std::ios::binary) << want;
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in, "missing " << path.string() << "; run with FLASHLAB_WRITE_TIMELINES=1");
    std::ostringstream have;
    have << in.rdbuf();
    CHECK_MESSAGE(have.str() == want, path.string() << " differs from the generator; run with FLASHLAB_WRITE_TIMELINES=1");
    const LoadedTimeline l = load_timeline(path.string());
    REQUIRE_MESSAGE(l.timeline, l.error);
    CHECK(*l.timeline == demo(overlap));
  }
}

TEST_CASE("the demo scenario names both timelines, relative to its own folder") {
  const auto file = std::filesystem::path(FLASHLAB_SOURCE_DIR) / "viz" / "scenarios" / "pipeline-demo.json";
  const Scenario s = load_scenario_file(file.string());
  CHECK(std::filesystem::equivalent(s.timeline, kTimelines / "synthetic-ladder2.trace.json"));
  CHECK(std::filesystem::equivalent(s.timeline_compare, kTimelines / "synthetic-ladder3.trace.json"));
  CHECK(s.panels == std::vector<std::string>{"controls", "pipeline"});
  CHECK_THROWS_WITH_AS(parse_scenario(R"({"timeline": 3})", "t.json"), "t.json: \"timeline\" must be a string, got 3", InputError);
  CHECK(s.timeline.find("..") == std::string::npos);  // shown in the panel: no "scenarios/../"
  // Paths in a scenario given as text stay as written; an absolute path stays absolute.
  CHECK(parse_scenario(R"({"timeline": "a/b.json"})", "t.json").timeline == "a/b.json");
}
