// The pipeline timeline (model/timeline.hpp): the kernel's record struct, event names, and the Chrome
// Trace Event Format writer and reader: valid JSON of the documented shape, an exact round trip, and
// one clear sentence for each kind of bad file.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/problem.hpp"
#include "model/timeline.hpp"

using namespace flashlab;

namespace {

constexpr std::uint64_t kT0 = 1'700'000'000'000'123'456ull;  // a %globaltimer-like stamp

Timeline small_timeline() {
  return Timeline{
      .device = "test device",
      .variant = "cuda-fa3-ws",
      .label = "synthetic: two blocks, hand-written",
      .producer_warpgroups = 1,
      .spans = {
          {.block = 0, .warpgroup = 0, .event = PipelineEvent::TmaIssue, .begin_ns = kT0, .end_ns = kT0},
          {.block = 0, .warpgroup = 1, .event = PipelineEvent::BarrierWait, .begin_ns = kT0 + 5, .end_ns = kT0 + 812},
          {.block = 0, .warpgroup = 1, .event = PipelineEvent::TmaLanded, .begin_ns = kT0 + 812, .end_ns = kT0 + 812},
          {.block = 0, .warpgroup = 1, .event = PipelineEvent::WgmmaIssue, .begin_ns = kT0 + 813, .end_ns = kT0 + 813},
          {.block = 0, .warpgroup = 1, .event = PipelineEvent::WgmmaWait, .begin_ns = kT0 + 1233, .end_ns = kT0 + 1233},
          {.block = 0, .warpgroup = 1, .event = PipelineEvent::Softmax, .begin_ns = kT0 + 1233, .end_ns = kT0 + 1613},
          {.block = 3, .warpgroup = 2, .event = PipelineEvent::Epilogue, .begin_ns = kT0 + 1700, .end_ns = kT0 + 2301},
      }};
}

std::string written(const Timeline& t) {
  std::ostringstream out;
  write_trace_event_json(t, out);
  return out.str();
}

std::string read_error(const std::string& text) {
  std::istringstream in(text);
  try {
    read_trace_event_json(in, "timeline bad.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the kernel's record is plain, 24 bytes, and becomes spans") {
  static_assert(std::is_trivially_copyable_v<TimelineRecord>);
  CHECK(sizeof(TimelineRecord) == 24);
  const TimelineRecord recs[] = {
      {.block = 2, .warpgroup = 0, .event = std::uint16_t(PipelineEvent::TmaIssue), .t_begin_ns = 100, .t_end_ns = 100},
      {.block = 2, .warpgroup = 1, .event = std::uint16_t(PipelineEvent::Softmax), .t_begin_ns = 150, .t_end_ns = 400},
  };
  const Timeline t = timeline_from_records(recs, 2, "dev", "cuda-fa3-ws", "run");
  REQUIRE(t.spans.size() == 2);
  CHECK(t.spans[1] == TimelineSpan{.block = 2, .warpgroup = 1, .event = PipelineEvent::Softmax, .begin_ns = 150, .end_ns = 400});
  CHECK(t.start_ns() == 100);
  CHECK(t.end_ns() == 400);

  const TimelineRecord bad_event[] = {{.block = 0, .warpgroup = 0, .event = 99, .t_begin_ns = 1, .t_end_ns = 1}};
  CHECK_THROWS_WITH_AS(timeline_from_records(bad_event, 1, "", "", ""), doctest::Contains("event number 99"), InputError);
  const TimelineRecord backwards[] = {
      {.block = 0, .warpgroup = 1, .event = std::uint16_t(PipelineEvent::Softmax), .t_begin_ns = 9, .t_end_ns = 3}};
  CHECK_THROWS_WITH_AS(timeline_from_records(backwards, 1, "", "", ""), doctest::Contains("ends before it begins"), InputError);
  const TimelineRecord long_instant[] = {
      {.block = 0, .warpgroup = 0, .event = std::uint16_t(PipelineEvent::TmaIssue), .t_begin_ns = 1, .t_end_ns = 3}};
  CHECK_THROWS_WITH_AS(timeline_from_records(long_instant, 1, "", "", ""), doctest::Contains("is an instant"), InputError);
}

TEST_CASE("event names are stable and parse back") {
  CHECK(std::string(to_string(PipelineEvent::TmaIssue)) == "tma_issue");
  CHECK(std::string(to_string(PipelineEvent::BarrierWait)) == "barrier_wait");
  for (int k = 0; k < kPipelineEventCount; ++k) {
    const auto e = static_cast<PipelineEvent>(k);
    CHECK(parse_pipeline_event(to_string(e)) == e);
  }
  CHECK(is_span(PipelineEvent::Softmax));
  CHECK(!is_span(PipelineEvent::WgmmaIssue));
  CHECK_THROWS_WITH_AS(parse_pipeline_event("mma"), doctest::Contains("known events are tma_issue, tma_landed"), InputError);
}

TEST_CASE("the writer produces the Trace Event Format Perfetto opens") {
  const std::string text = written(small_timeline());
  const nlohmann::json j = nlohmann::json::parse(text);
  REQUIRE(j["traceEvents"].is_array());
  CHECK(j["displayTimeUnit"] == "ns");
  CHECK(j["otherData"]["device"] == "test device");
  CHECK(j["otherData"]["variant"] == "cuda-fa3-ws");
  CHECK(j["otherData"]["label"] == "synthetic: two blocks, hand-written");
  CHECK(j["otherData"]["t0_ns"].get<std::uint64_t>() == kT0);

  int spans = 0, instants = 0;
  bool block3 = false, producer = false, consumer = false;
  for (const auto& ev : j["traceEvents"]) {
    REQUIRE(ev.contains("pid"));
    REQUIRE(ev.contains("tid"));
    if (ev["ph"] == "M") {
      if (ev["name"] == "process_name" && ev["args"]["name"] == "block 3") block3 = true;
      if (ev["name"] == "thread_name" && ev["args"]["name"] == "producer WG0") producer = true;
      if (ev["name"] == "thread_name" && ev["args"]["name"] == "consumer WG1") consumer = ev["pid"] == 0 && ev["tid"] == 1;
      continue;
    }
    CHECK(ev["ts"].is_number());
    if (ev["ph"] == "X") {
      ++spans;
      CHECK(ev["dur"].get<double>() >= 0);
    } else {
      CHECK(ev["ph"] == "i");
      CHECK(ev["s"] == "t");
      ++instants;
    }
  }
  CHECK(spans == 3);
  CHECK(instants == 4);
  CHECK(block3);
  CHECK(producer);
  CHECK(consumer);
  // Times in microseconds from the earliest stamp: the softmax began 1233 ns in and lasted 380 ns.
  bool softmax = false;
  for (const auto& ev : j["traceEvents"])
    if (ev["name"] == "softmax") {
      softmax = true;
      CHECK(ev["ts"].get<double>() == doctest::Approx(1.233));
      CHECK(ev["dur"].get<double>() == doctest::Approx(0.380));
      CHECK(ev["cat"] == "softmax");
      CHECK(ev["pid"] == 0);
      CHECK(ev["tid"] == 1);
    }
  CHECK(softmax);
}

TEST_CASE("reading the writer's output gives back the same timeline, and writing it again the same bytes") {
  const Timeline t = small_timeline();
  const std::string text = written(t);
  std::istringstream in(text);
  const Timeline back = read_trace_event_json(in, "timeline mem");
  CHECK(back == t);
  CHECK(written(back) == text);
  // An empty timeline round-trips too.
  const Timeline empty{.device = "d", .variant = "v", .label = "l", .producer_warpgroups = 2, .spans = {}};
  std::istringstream in2(written(empty));
  CHECK(read_trace_event_json(in2, "timeline empty") == empty);
}

TEST_CASE("what a bench recorded becomes its Timeline, and a file that cannot be written is one sentence") {
  // A bench hands up the kernel's records and what names them (BenchTimeline); the command line writes the file.
  BenchTimeline recorded;
  recorded.records = {{.block = 0, .warpgroup = 0, .event = 0, .t_begin_ns = 100, .t_end_ns = 100},
                      {.block = 2, .warpgroup = 1, .event = static_cast<std::uint16_t>(PipelineEvent::Softmax),
                       .t_begin_ns = 150, .t_end_ns = 400}};
  recorded.device = "test device";
  recorded.variant = "cuda-fa3-ws";
  recorded.label = "ladder step 2, synthetic";
  recorded.producer_warpgroups = 1;
  const Timeline t = timeline_of(recorded);
  CHECK(t == timeline_from_records(recorded.records.data(), recorded.records.size(), "test device", "cuda-fa3-ws",
                                   "ladder step 2, synthetic", 1));
  REQUIRE(t.spans.size() == 2);
  CHECK(t.spans[1].event == PipelineEvent::Softmax);
  CHECK(t.spans[1].block == 2);

  const std::string path = "/nonexistent-flashlab-dir/timeline.json";
  CHECK_THROWS_WITH_AS(write_trace_event_file(t, path),
                       doctest::Contains(("cannot write the timeline to '" + path + "': ").c_str()), InputError);
  CHECK_FALSE(std::filesystem::exists(path));
  const std::string good = (std::filesystem::temp_directory_path() /
                            ("flashlab_timeline_" + std::to_string(::getpid()) + ".json")).string();
  write_trace_event_file(t, good);
  CHECK(read_trace_event_file(good) == t);
  std::filesystem::remove(good);
}

TEST_CASE("consumer_shares: the median softmax and waiting shares over the consumer lanes, the producer left out") {
  const auto span = [](std::uint32_t block, std::uint32_t wg, PipelineEvent e, std::uint64_t b, std::uint64_t end) {
    return TimelineSpan{.block = block, .warpgroup = wg, .event = e, .begin_ns = b, .end_ns = end};
  };
  Timeline t;
  t.producer_warpgroups = 1;
  t.spans = {
      // The producer's lane: a long wait that must not count.
      span(0, 0, PipelineEvent::BarrierWait, 0, 1000),
      // Block 0, WG1: 0..100, softmax 40 + 10, waiting 20 -> 0.5 and 0.2.
      span(0, 1, PipelineEvent::WgmmaIssue, 0, 0), span(0, 1, PipelineEvent::Softmax, 10, 50),
      span(0, 1, PipelineEvent::BarrierWait, 50, 70), span(0, 1, PipelineEvent::Softmax, 80, 90),
      span(0, 1, PipelineEvent::WgmmaWait, 100, 100),
      // Block 0, WG2: 0..200, softmax 20, waiting 100 -> 0.1 and 0.5.
      span(0, 2, PipelineEvent::Softmax, 0, 20), span(0, 2, PipelineEvent::BarrierWait, 100, 200),
      // Block 1, WG1: 100..200, softmax 60, no wait -> 0.6 and 0.
      span(1, 1, PipelineEvent::Softmax, 100, 160), span(1, 1, PipelineEvent::TmaLanded, 200, 200),
      // Block 1, WG2: one instant, no extent: left out.
      span(1, 2, PipelineEvent::TmaLanded, 300, 300)};
  const ConsumerShares s = consumer_shares(t);
  CHECK(s.lanes == 3);
  CHECK(s.softmax == doctest::Approx(0.5));  // median of 0.5, 0.1, 0.6
  CHECK(s.waiting == doctest::Approx(0.2));  // median of 0.2, 0.5, 0
  Timeline producers_only;
  producers_only.spans = {span(0, 0, PipelineEvent::TmaIssue, 0, 0), span(0, 0, PipelineEvent::BarrierWait, 0, 50)};
  const ConsumerShares none = consumer_shares(producers_only);
  CHECK(none.lanes == 0);
  CHECK(none.softmax == 0);
  // Step 1 has no producer: its one warpgroup is the consumer.
  t.producer_warpgroups = 0;
  CHECK(consumer_shares(t).lanes == 4);
}

TEST_CASE("a file from another tool (no otherData, bare array) still reads") {
  const std::string text = R"([{"name": "softmax", "ph": "X", "ts": 1.5, "dur": 0.25, "pid": 4, "tid": 2},
                               {"name": "tma_issue", "ph": "i", "ts": 0, "pid": 4, "tid": 0}])";
  std::istringstream in(text);
  const Timeline t = read_trace_event_json(in, "timeline other.json");
  REQUIRE(t.spans.size() == 2);
  CHECK(t.spans[0] == TimelineSpan{.block = 4, .warpgroup = 2, .event = PipelineEvent::Softmax, .begin_ns = 1500, .end_ns = 1750});
  CHECK(t.producer_warpgroups == 1);
}

TEST_CASE("a bad timeline file is one sentence naming the file and the problem") {
  const std::string good = written(small_timeline());
  // Truncated: cut in the middle of the events.
  const std::string cut = read_error(good.substr(0, good.size() / 2));
  CHECK(cut.find("timeline bad.json is not valid JSON: it ends early, after") == 0);
  // Cut inside a string, a number or a keyword: still "ends early".
  for (std::size_t n : {std::size_t(30), std::size_t(300), good.size() - 3, good.size() - 2})
    CHECK(read_error(good.substr(0, n)).find("ends early, after") != std::string::npos);
  CHECK(read_error("").find("timeline bad.json is empty") == 0);
  CHECK(read_error("{\"traceEvents\": [}").find("timeline bad.json is not valid JSON: syntax error at byte 1") == 0);
  CHECK(read_error("{\"events\": []}") ==
        "timeline bad.json has no \"traceEvents\" array, so it is not a Chrome trace (Trace Event Format) file");
  CHECK(read_error(R"({"traceEvents": {}})").find("no \"traceEvents\" array") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": 1, "pid": 0, "tid": 1}]})") ==
        "timeline bad.json: event 0 (\"softmax\") has no \"dur\"; every event needs ts, pid and tid, and spans dur");
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "dur": 1, "pid": 0, "tid": 1}]})")
            .find("has no \"ts\"") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": 1, "dur": 1, "tid": 1}]})")
            .find("has no \"pid\"") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": 1, "dur": 1, "pid": 0}]})")
            .find("has no \"tid\"") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "mma", "ph": "X", "ts": 1, "dur": 1, "pid": 0, "tid": 0}]})") ==
        "timeline bad.json: event 0 has unknown name \"mma\"; known events are tma_issue, tma_landed, wgmma_issue, "
        "wgmma_wait, softmax, barrier_wait, epilogue, ring_compute, ring_send_recv, ring_merge");
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": 1, "dur": -2, "pid": 0, "tid": 1}]})") ==
        "timeline bad.json: event 0 (\"softmax\") has a negative duration (-2 us)");
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "B", "ts": 1, "pid": 0, "tid": 1}]})")
            .find("has phase \"B\"; supported are") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": "1", "dur": 1, "pid": 0, "tid": 1}]})")
            .find("\"ts\" = \"1\", not a number") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "softmax", "ph": "X", "ts": 1, "dur": 1, "pid": -1, "tid": 1}]})")
            .find("whole number >= 0") != std::string::npos);
  CHECK(read_error(R"({"traceEvents": [{"name": "tma_issue", "ph": "X", "ts": 1, "dur": 1, "pid": 0, "tid": 0}]})")
            .find("tma_issue is an instant") != std::string::npos);
  // Every message is one sentence: no line breaks.
  for (const std::string& m : {cut, read_error("[1]")}) CHECK(m.find('\n') == std::string::npos);
  CHECK_THROWS_WITH_AS(read_trace_event_file("/nonexistent/t.json"), "cannot read timeline file '/nonexistent/t.json'",
                       InputError);
}
