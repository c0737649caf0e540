// The Ring panel's logic (ring_view.hpp says what it builds). Every fact of the ring comes from
// model/ring.hpp: who holds what from ring_schedule, FLOPs, bytes and the model's times from
// ring_cost; this file only converts them into what the panel draws, or puts measured times in the
// model's place.
#include "ring_view.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace flashlab::viz {

namespace {

using nlohmann::json;

const std::vector<std::string> kMeasuredKeys = {"device", "layout", "P",       "N",       "batch",  "heads",
                                                "head_dim", "causal", "pass", "step_ms", "command", "date"};
const std::vector<std::string> kRequiredKeys = {"device", "layout", "P", "N", "heads", "head_dim", "causal", "step_ms"};

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : ", ") + w;
  return s;
}

std::string rate(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// "P = 4, N = 16384, 16 heads, d = 128, causal, forward": what a view was made for.
std::string describe(const RingSettings& s) {
  return "P = " + std::to_string(s.ranks) + ", N = " + std::to_string(s.seq) + ", batch " + std::to_string(s.batch) +
         ", " + std::to_string(s.heads) + " heads, d = " + std::to_string(s.head_dim) + ", " +
         (s.causal ? "causal" : "no mask") + ", " + (s.pass == Pass::Forward ? "forward" : "backward");
}

bool same_problem(const RingSettings& a, const RingSettings& b) {
  return a.ranks == b.ranks && a.seq == b.seq && a.batch == b.batch && a.heads == b.heads &&
         a.head_dim == b.head_dim && a.causal == b.causal && a.pass == b.pass;
}

int positive_int(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1 || v.get<std::int64_t>() > (std::int64_t(1) << 30))
    throw InputError(where + ": \"" + key + "\" must be a positive integer, got " + v.dump());
  return static_cast<int>(v.get<std::int64_t>());
}

std::string text(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  if (!v.is_string()) throw InputError(where + ": \"" + key + "\" must be a string, got " + v.dump());
  return v.get<std::string>();
}

// Model and measured views alike: the per-step table from per-rank work times (the model's idle
// times are ring_cost's own; measured ones are the step's slowest rank minus each rank's work).
void add_totals(RingView& view) {
  const int P = view.schedule.ranks;
  view.work_per_rank.assign(P, 0.0);
  double start = 0;
  for (RingStepView& step : view.steps) {
    step.start_seconds = start;
    start += step.seconds;
    for (int r = 0; r < P; ++r) view.work_per_rank[r] += step.ranks[r].work_seconds;
  }
  view.seconds = start;
  double total = 0, most = 0;
  for (double w : view.work_per_rank) total += w, most = std::max(most, w);
  view.imbalance = total > 0 ? most / (total / P) : 1.0;
  view.busy = view.seconds > 0 ? total / (P * view.seconds) : 1.0;
}

}  // namespace

Shape ring_shape(const RingSettings& s) {
  if (s.ranks < 1 || s.ranks > kMaxPanelRanks)
    throw InputError("the Ring panel draws 1 to " + std::to_string(kMaxPanelRanks) + " ranks, got P = " +
                     std::to_string(s.ranks) + " (flashlab trace --ring takes more)");
  Problem p;
  p.shape = Shape{s.batch, s.heads, s.heads, s.seq, s.seq, s.head_dim};
  p.options.causal = ring_causal(s);
  validate(p);
  return p.shape;
}

CausalAlign ring_causal(const RingSettings& s) { return s.causal ? CausalAlign::TopLeft : CausalAlign::None; }

MeasuredRing parse_measured_ring(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw InputError(where + " is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object())
    throw InputError(where + " must hold a JSON object with the keys " + join(kRequiredKeys) + " (ring_view.hpp)");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (std::find(kMeasuredKeys.begin(), kMeasuredKeys.end(), key) == kMeasuredKeys.end())
      throw InputError(where + ": unknown key \"" + key + "\"; a measured ring file has " + join(kMeasuredKeys));
  }
  for (const std::string& key : kRequiredKeys)
    if (!j.contains(key)) throw InputError(where + ": the key \"" + key + "\" is missing (the file needs " + join(kRequiredKeys) + ")");

  MeasuredRing m;
  m.path = where;
  try {
    m.device = text(j, "device", where);
    if (m.device.empty()) throw InputError(where + ": \"device\" must name the device the times were measured on");
    m.layout = parse_ring_layout(text(j, "layout", where));
    m.settings.ranks = positive_int(j, "P", where);
    m.settings.seq = positive_int(j, "N", where);
    if (j.contains("batch")) m.settings.batch = positive_int(j, "batch", where);
    m.settings.heads = positive_int(j, "heads", where);
    m.settings.head_dim = positive_int(j, "head_dim", where);
    if (!j.at("causal").is_boolean()) throw InputError(where + ": \"causal\" must be true or false, got " + j.at("causal").dump());
    m.settings.causal = j.at("causal").get<bool>();
    if (j.contains("pass")) {
      const std::string pass = text(j, "pass", where);
      if (pass != "forward" && pass != "backward")
        throw InputError(where + ": \"pass\" must be forward or backward, got '" + pass + "'");
      m.settings.pass = pass == "forward" ? Pass::Forward : Pass::Backward;
    }
    if (j.contains("command")) m.command = text(j, "command", where);
    if (j.contains("date")) m.date = text(j, "date", where);
    m.settings.measured = where;
    ring_shape(m.settings);  // P within the panel's range, a valid shape

    const json& steps = j.at("step_ms");
    const int P = m.settings.ranks;
    if (!steps.is_array() || int(steps.size()) != P)
      throw InputError(where + ": \"step_ms\" must hold P = " + std::to_string(P) + " rows, one per step, got " +
                       (steps.is_array() ? std::to_string(steps.size()) + " rows" : steps.dump()));
    for (std::size_t s = 0; s < steps.size(); ++s) {
      const json& row = steps[s];
      if (!row.is_array() || int(row.size()) != P)
        throw InputError(where + ": row " + std::to_string(s) + " of \"step_ms\" must hold P = " + std::to_string(P) +
                         " times, one per rank, got " + row.dump());
      std::vector<double> seconds;
      for (const json& ms : row) {
        if (!ms.is_number() || !std::isfinite(ms.get<double>()) || ms.get<double>() < 0)
          throw InputError(where + ": row " + std::to_string(s) + " of \"step_ms\" holds " + ms.dump() +
                           ", not a time in milliseconds (a number >= 0)");
        seconds.push_back(ms.get<double>() * 1e-3);
      }
      m.step_seconds.push_back(std::move(seconds));
    }
    // The schedule must exist for this layout and length (zigzag: N a multiple of 2P).
    ring_schedule(m.layout, P, m.settings.seq, m.settings.seq, ring_causal(m.settings));
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    throw InputError(where + ": " + msg);  // the library's sentences, prefixed with the file
  }
  return m;
}

MeasuredRing load_measured_ring(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot read the measured ring file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_measured_ring(text.str(), path);
}

RingView ring_view(RingLayout layout, const RingSettings& settings, const RingMachine& machine) {
  const Shape shape = ring_shape(settings);
  RingView view;
  view.schedule = ring_schedule(layout, settings.ranks, shape.seq_q, shape.seq_k, ring_causal(settings));
  view.pass = settings.pass;
  const RingCost cost = ring_cost(view.schedule, shape, settings.pass, machine);
  view.source = "model (ring_cost): " + rate("%g", machine.flops_per_second / 1e12) + " TFLOP/s per rank, " +
                rate("%g", machine.link_bytes_per_second / 1e9) + " GB/s per link, K/V in " +
                std::to_string(machine.kv_bytes_per_element) + "-byte elements";
  for (const RingStepCost& c : cost.steps) {
    RingStepView step;
    step.seconds = c.seconds;
    for (int r = 0; r < settings.ranks; ++r)
      step.ranks.push_back(RankStepTime{.work_seconds = c.flops[r] / machine.flops_per_second,
                                        .idle_seconds = c.idle_seconds[r],
                                        .transfer_seconds = double(c.link_bytes[r]) / machine.link_bytes_per_second,
                                        .link_bytes = c.link_bytes[r]});
    view.steps.push_back(std::move(step));
  }
  add_totals(view);
  return view;
}

RingView ring_view(const MeasuredRing& m) {
  const RingSettings& settings = m.settings;
  const Shape shape = ring_shape(settings);
  RingView view;
  view.schedule = ring_schedule(m.layout, settings.ranks, shape.seq_q, shape.seq_k, ring_causal(settings));
  view.pass = settings.pass;
  view.measured = true;
  view.source = "measured on " + m.device + " (" + std::filesystem::path(m.path).filename().string() + ")";
  // What goes over the links is a fact of the schedule and the shape, not of a rate: the model's bytes.
  const RingCost bytes = ring_cost(view.schedule, shape, settings.pass, RingMachine{});
  for (int s = 0; s < settings.ranks; ++s) {
    RingStepView step;
    const std::vector<double>& work = m.step_seconds.at(s);
    step.seconds = *std::max_element(work.begin(), work.end());
    for (int r = 0; r < settings.ranks; ++r)
      step.ranks.push_back(RankStepTime{.work_seconds = work[r],
                                        .idle_seconds = step.seconds - work[r],
                                        .transfer_seconds = 0,
                                        .link_bytes = bytes.steps[s].link_bytes[r]});
    view.steps.push_back(std::move(step));
  }
  add_totals(view);
  return view;
}

int holder_of(const RingSchedule& ring, int step, int origin) {
  for (int r = 0; r < ring.ranks; ++r)
    if (ring.steps.at(step).at(r).kv_origin == origin) return r;
  return -1;
}

bool sends_after(const RingView& view, int step) {
  for (const RankStepTime& r : view.steps.at(step).ranks)
    if (r.link_bytes > 0) return true;
  return false;
}

std::vector<RingColumn> ring_columns(const RingSettings& settings, const RingMachine& machine, const MeasuredRing* measured) {
  if (measured && !same_problem(settings, measured->settings))
    throw InputError("the measured file " + measured->path + " was recorded for " + describe(measured->settings) +
                     ", but the panel is set to " + describe(settings));
  std::vector<RingColumn> columns;
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped}) {
    RingColumn column;
    column.layout = layout;
    try {
      column.view = measured && measured->layout == layout ? ring_view(*measured) : ring_view(layout, settings, machine);
    } catch (const InputError& e) {
      column.error = e.what();
    }
    columns.push_back(std::move(column));
  }
  return columns;
}

RingPosition ring_position(std::int64_t event, std::int64_t events, int ranks) {
  if (events <= 0 || ranks < 1) return {};
  if (event >= events) return {ranks - 1, 1.0};
  event = std::max<std::int64_t>(event, 0);
  const std::int64_t scaled = event * ranks;  // exact: the step is floor(event / events * P)
  const auto step = static_cast<int>(scaled / events);
  return {step, double(scaled - std::int64_t(step) * events) / double(events)};
}

std::int64_t event_of_ring_step(int step, std::int64_t events, int ranks) {
  if (events <= 0 || ranks < 1) return 0;
  step = std::clamp(step, 0, ranks - 1);
  return (std::int64_t(step) * events + ranks - 1) / ranks;  // ceil(step * events / P)
}

double hop_fraction(double progress) {
  if (progress <= kHopStarts) return 0.0;
  return std::min(1.0, (progress - kHopStarts) / (1.0 - kHopStarts));
}

}  // namespace flashlab::viz
