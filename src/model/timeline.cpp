#include "model/timeline.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "core/problem.hpp"

namespace flashlab {

namespace {

using nlohmann::json;

struct EventInfo {
  const char* name;
  const char* category;
  bool span;
};
constexpr EventInfo kEvents[kPipelineEventCount] = {
    {"tma_issue", "tma", false},     {"tma_landed", "tma", false}, {"wgmma_issue", "wgmma", false},
    {"wgmma_wait", "wgmma", false},  {"softmax", "softmax", true}, {"barrier_wait", "sync", true},
    {"epilogue", "epilogue", true},  {"ring_compute", "compute", true}, {"ring_send_recv", "transfer", true},
    {"ring_merge", "merge", true},
};

const EventInfo& info(PipelineEvent e) {
  const int k = static_cast<int>(e);
  if (k < 0 || k >= kPipelineEventCount) throw InputError("pipeline event number " + std::to_string(k) + " is unknown");
  return kEvents[k];
}

constexpr const char* kFormat = "flashlab-timeline 1";

// Microseconds in the file, nanoseconds in memory: ns / 1000 as a double prints (shortest round-trip
// form) and parses back to the same integer for any run shorter than days.
double to_us(std::uint64_t ns) { return double(ns) / 1000.0; }

std::string process_name(const Timeline& t, std::uint32_t block) {
  return (t.is_ring() ? "rank " : "block ") + std::to_string(block);
}

std::string role_name(const Timeline& t, std::uint32_t wg) {
  if (t.is_ring()) return wg == 0 ? "compute" : wg == 1 ? "communication" : "stream " + std::to_string(wg);
  return std::string(wg < t.producer_warpgroups ? "producer" : "consumer") + " WG" + std::to_string(wg);
}

// nlohmann's parse error as one sentence: truncated files say so, with the byte where they end.
[[noreturn]] void throw_parse_error(const json::parse_error& e, const std::string& what, std::size_t length) {
  const std::string msg = e.what();
  // The parser read to the last byte (e.byte counts from 1, one past the end inside a string).
  if (msg.find("unexpected end of input") != std::string::npos || e.byte > length)
    throw InputError(what + " is not valid JSON: it ends early, after " + std::to_string(length) +
                     " bytes (a truncated file?)");
  std::string detail;
  if (const auto at = msg.find(" - "); at != std::string::npos) detail = "; " + msg.substr(at + 3);
  throw InputError(what + " is not valid JSON: syntax error at byte " + std::to_string(e.byte) + detail);
}

std::string describe(std::size_t k, const json& ev) {
  std::string s = "event " + std::to_string(k);
  if (ev.contains("name") && ev["name"].is_string()) s += " (\"" + ev["name"].get<std::string>() + "\")";
  return s;
}

double number_field(const json& ev, const char* key, std::size_t k, const std::string& what) {
  if (!ev.contains(key))
    throw InputError(what + ": " + describe(k, ev) + " has no \"" + key + "\"; every event needs ts, pid and tid, and spans dur");
  const json& v = ev[key];
  if (!v.is_number()) throw InputError(what + ": " + describe(k, ev) + " has \"" + key + "\" = " + v.dump() + ", not a number");
  return v.get<double>();
}

std::uint32_t id_field(const json& ev, const char* key, std::size_t k, const std::string& what) {
  const double v = number_field(ev, key, k, what);
  if (v < 0 || v != std::floor(v) || v > double(std::numeric_limits<std::uint32_t>::max()))
    throw InputError(what + ": " + describe(k, ev) + " has \"" + key + "\" = " + ev[key].dump() +
                     "; it must be a whole number >= 0 (the block or warpgroup)");
  return static_cast<std::uint32_t>(v);
}

std::uint64_t to_ns(double us, const char* key, std::size_t k, const json& ev, const std::string& what) {
  if (!std::isfinite(us) || us < 0 || us > 9e12)
    throw InputError(what + ": " + describe(k, ev) + " has \"" + key + "\" = " + ev[key].dump() +
                     (us < 0 ? ", negative" : ", out of range") + " (microseconds from the start)");
  return static_cast<std::uint64_t>(std::llround(us * 1000.0));
}

}  // namespace

const char* to_string(PipelineEvent e) { return info(e).name; }
const char* category(PipelineEvent e) { return info(e).category; }
bool is_span(PipelineEvent e) { return info(e).span; }

std::string known_pipeline_events() {
  std::string s;
  for (const EventInfo& e : kEvents) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

PipelineEvent parse_pipeline_event(const std::string& name) {
  for (int k = 0; k < kPipelineEventCount; ++k)
    if (name == kEvents[k].name) return static_cast<PipelineEvent>(k);
  throw InputError("unknown pipeline event '" + name + "': known events are " + known_pipeline_events());
}

std::uint64_t Timeline::start_ns() const {
  if (spans.empty()) return 0;
  std::uint64_t t = spans.front().begin_ns;
  for (const TimelineSpan& s : spans) t = std::min(t, s.begin_ns);
  return t;
}

std::uint64_t Timeline::end_ns() const {
  std::uint64_t t = 0;
  for (const TimelineSpan& s : spans) t = std::max(t, s.end_ns);
  return t;
}

Timeline timeline_from_records(const TimelineRecord* records, std::size_t count, const std::string& device,
                               const std::string& variant, const std::string& label,
                               std::uint32_t producer_warpgroups) {
  Timeline t{.device = device, .variant = variant, .label = label, .producer_warpgroups = producer_warpgroups, .spans = {}};
  t.spans.reserve(count);
  for (std::size_t k = 0; k < count; ++k) {
    const TimelineRecord& r = records[k];
    if (r.event >= kPipelineEventCount)
      throw InputError("timeline record " + std::to_string(k) + " has event number " + std::to_string(r.event) +
                       "; known events are 0.." + std::to_string(kPipelineEventCount - 1) + " (" +
                       known_pipeline_events() + ")");
    const auto e = static_cast<PipelineEvent>(r.event);
    if (r.t_end_ns < r.t_begin_ns)
      throw InputError("timeline record " + std::to_string(k) + " (" + to_string(e) + ", block " +
                       std::to_string(r.block) + ") ends before it begins");
    if (!is_span(e) && r.t_end_ns != r.t_begin_ns)
      throw InputError("timeline record " + std::to_string(k) + " (" + to_string(e) +
                       ") is an instant but has a duration; set t_end_ns = t_begin_ns");
    t.spans.push_back({.block = r.block, .warpgroup = r.warpgroup, .event = e, .begin_ns = r.t_begin_ns, .end_ns = r.t_end_ns});
  }
  return t;
}

void write_trace_event_json(const Timeline& t, std::ostream& out) {
  const std::uint64_t t0 = t.start_ns();
  // Lanes in order: block, then warpgroup (Perfetto sorts by the sort_index metadata).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> lanes;
  for (const TimelineSpan& s : t.spans) lanes.emplace_back(s.block, s.warpgroup);
  std::sort(lanes.begin(), lanes.end());
  lanes.erase(std::unique(lanes.begin(), lanes.end()), lanes.end());

  std::vector<json> events;
  std::uint32_t last_block = std::numeric_limits<std::uint32_t>::max();
  for (const auto& [block, wg] : lanes) {
    if (block != last_block) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", block}, {"tid", 0},
                        {"args", {{"name", process_name(t, block)}}}});
      events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", block}, {"tid", 0},
                        {"args", {{"sort_index", block}}}});
      last_block = block;
    }
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", block}, {"tid", wg},
                      {"args", {{"name", role_name(t, wg)}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", block}, {"tid", wg},
                      {"args", {{"sort_index", wg}}}});
  }
  for (const TimelineSpan& s : t.spans) {
    json ev = {{"name", to_string(s.event)}, {"cat", category(s.event)}};
    if (is_span(s.event)) {
      ev["ph"] = "X";
      ev["ts"] = to_us(s.begin_ns - t0);
      ev["dur"] = to_us(s.end_ns - s.begin_ns);
    } else {
      ev["ph"] = "i";
      ev["s"] = "t";  // thread-scoped instant: drawn on its warpgroup's lane
      ev["ts"] = to_us(s.begin_ns - t0);
    }
    ev["pid"] = s.block;
    ev["tid"] = s.warpgroup;
    if (s.step >= 0) ev["args"] = {{"step", s.step}};
    events.push_back(std::move(ev));
  }
  const json other = {{"format", kFormat},
                      {"device", t.device},
                      {"variant", t.variant},
                      {"label", t.label},
                      {"producer_warpgroups", t.producer_warpgroups},
                      {"info", t.info},
                      {"t0_ns", t0}};
  // One event a line: readable, diffable, and still one JSON document.
  out << "{\"traceEvents\": [\n";
  for (std::size_t k = 0; k < events.size(); ++k) out << "  " << events[k].dump() << (k + 1 < events.size() ? ",\n" : "\n");
  out << "],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": " << other.dump() << "}\n";
}

Timeline read_trace_event_json(std::istream& in, const std::string& what) {
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw InputError(what + " is empty; expected a Chrome trace (JSON with a \"traceEvents\" array)");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw_parse_error(e, what, text.size());
  }
  const json* events = nullptr;
  if (j.is_array()) events = &j;  // the format also allows a bare array of events
  else if (j.is_object() && j.contains("traceEvents") && j["traceEvents"].is_array()) events = &j["traceEvents"];
  if (!events)
    throw InputError(what + " has no \"traceEvents\" array, so it is not a Chrome trace (Trace Event Format) file");

  Timeline t;
  std::uint64_t t0 = 0;
  if (j.is_object() && j.contains("otherData") && j["otherData"].is_object()) {
    const json& o = j["otherData"];
    auto str = [&](const char* key, std::string& dst) {
      if (o.contains(key) && o[key].is_string()) dst = o[key].get<std::string>();
    };
    str("device", t.device);
    str("variant", t.variant);
    str("label", t.label);
    if (o.contains("producer_warpgroups") && o["producer_warpgroups"].is_number_unsigned())
      t.producer_warpgroups = o["producer_warpgroups"].get<std::uint32_t>();
    if (o.contains("t0_ns") && o["t0_ns"].is_number_unsigned()) t0 = o["t0_ns"].get<std::uint64_t>();
    if (o.contains("info") && o["info"].is_object())
      for (const auto& [key, value] : o["info"].items()) {
        if (!value.is_string())
          throw InputError(what + ": otherData.info." + key + " is " + value.dump() + ", not a string");
        t.info[key] = value.get<std::string>();
      }
  }

  for (std::size_t k = 0; k < events->size(); ++k) {
    const json& ev = (*events)[k];
    if (!ev.is_object()) throw InputError(what + ": event " + std::to_string(k) + " is " + ev.dump() + ", not an object");
    const std::string ph = ev.contains("ph") && ev["ph"].is_string() ? ev["ph"].get<std::string>() : "";
    if (ph == "M") continue;  // names and sort order of processes and threads
    if (ph != "X" && ph != "i" && ph != "I")
      throw InputError(what + ": " + describe(k, ev) + " has phase " + (ev.contains("ph") ? ev["ph"].dump() : "(none)") +
                       "; supported are \"X\" (span), \"i\" (instant) and \"M\" (metadata)");
    if (!ev.contains("name") || !ev["name"].is_string())
      throw InputError(what + ": event " + std::to_string(k) + " has no \"name\"; known events are " + known_pipeline_events());
    const std::string name = ev["name"].get<std::string>();
    PipelineEvent e;
    try {
      e = parse_pipeline_event(name);
    } catch (const InputError&) {
      throw InputError(what + ": event " + std::to_string(k) + " has unknown name \"" + name + "\"; known events are " +
                       known_pipeline_events());
    }
    TimelineSpan s{.block = id_field(ev, "pid", k, what), .warpgroup = id_field(ev, "tid", k, what), .event = e};
    const std::uint64_t begin = to_ns(number_field(ev, "ts", k, what), "ts", k, ev, what);
    std::uint64_t dur = 0;
    if (ph == "X") {
      const double d = number_field(ev, "dur", k, what);
      if (d < 0)
        throw InputError(what + ": " + describe(k, ev) + " has a negative duration (" + ev["dur"].dump() + " us)");
      dur = to_ns(d, "dur", k, ev, what);
    }
    if (ph == "X" && !is_span(e))
      throw InputError(what + ": " + describe(k, ev) + " is a span (\"ph\": \"X\") but " + name + " is an instant (\"ph\": \"i\")");
    if (ph != "X" && is_span(e))
      throw InputError(what + ": " + describe(k, ev) + " is an instant but " + name + " is a span (\"ph\": \"X\" with \"dur\")");
    s.begin_ns = t0 + begin;
    s.end_ns = s.begin_ns + dur;
    if (ev.contains("args") && ev["args"].is_object() && ev["args"].contains("step")) {
      const json& step = ev["args"]["step"];
      if (!step.is_number_integer() || step.get<std::int64_t>() < 0 || step.get<std::int64_t>() > 1 << 30)
        throw InputError(what + ": " + describe(k, ev) + " has args.step = " + step.dump() + "; a ring step is a whole number >= 0");
      s.step = step.get<std::int32_t>();
    }
    t.spans.push_back(s);
  }
  return t;
}

Timeline timeline_of(const BenchTimeline& t) {
  return timeline_from_records(t.records.data(), t.records.size(), t.device, t.variant, t.label, t.producer_warpgroups);
}

ConsumerShares consumer_shares(const Timeline& t) {
  struct Lane {
    std::uint64_t first = std::numeric_limits<std::uint64_t>::max(), last = 0, softmax = 0, waiting = 0;
  };
  std::map<std::pair<std::uint32_t, std::uint32_t>, Lane> lanes;  // (block, warpgroup)
  for (const TimelineSpan& s : t.spans) {
    if (s.warpgroup < t.producer_warpgroups) continue;
    Lane& lane = lanes[{s.block, s.warpgroup}];
    lane.first = std::min(lane.first, s.begin_ns);
    lane.last = std::max(lane.last, s.end_ns);
    if (s.event == PipelineEvent::Softmax) lane.softmax += s.end_ns - s.begin_ns;
    if (s.event == PipelineEvent::BarrierWait) lane.waiting += s.end_ns - s.begin_ns;
  }
  std::vector<double> softmax, waiting;
  for (const auto& [key, lane] : lanes) {
    if (lane.last <= lane.first) continue;
    const double extent = static_cast<double>(lane.last - lane.first);
    softmax.push_back(static_cast<double>(lane.softmax) / extent);
    waiting.push_back(static_cast<double>(lane.waiting) / extent);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  if (softmax.empty()) return {};
  return {.softmax = median(softmax), .waiting = median(waiting), .lanes = static_cast<int>(softmax.size())};
}

void write_trace_event_file(const Timeline& timeline, const std::string& path) {
  errno = 0;
  std::ofstream file(path, std::ios::binary);
  if (!file)
    throw InputError("cannot write the timeline to '" + path + "': " +
                     (errno != 0 ? std::strerror(errno) : "the file cannot be opened for writing"));
  write_trace_event_json(timeline, file);
  file.close();
  if (!file) throw InputError("cannot write the timeline to '" + path + "': the write failed (is the disk full?)");
}

Timeline read_trace_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot read timeline file '" + path + "'");
  return read_trace_event_json(in, "timeline " + path);
}

}  // namespace flashlab
