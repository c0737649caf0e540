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
#include <tuple>

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

// --- A measured ring timeline beside the model.

namespace {

// The parts of [b, e) when none of `busy` (sorted, disjoint) covers it.
std::vector<std::pair<double, double>> uncovered(double b, double e, const std::vector<std::pair<double, double>>& busy) {
  std::vector<std::pair<double, double>> gaps;
  double at = b;
  for (const auto& [bb, be] : busy) {
    if (be <= at) continue;
    if (bb >= e) break;
    if (bb > at) gaps.emplace_back(at, bb);
    at = std::max(at, be);
    if (at >= e) break;
  }
  if (at < e) gaps.emplace_back(at, e);
  return gaps;
}

std::vector<std::pair<double, double>> union_of(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

std::string problem_of(const RingRun& run) {
  const Shape& s = run.shape;
  return "P = " + std::to_string(run.ranks) + ", " + to_string(run.layout) + ", N = " + std::to_string(s.seq_q) +
         (s.seq_k != s.seq_q ? " x " + std::to_string(s.seq_k) : "") + ", batch " + std::to_string(s.batch) + ", " +
         std::to_string(s.heads_q) + " heads (" + std::to_string(s.heads_kv) + " K/V), d = " +
         std::to_string(s.head_dim) + ", causal " + to_string(run.causal) + ", " + to_string(run.dtype) + ", " +
         (run.pass == Pass::Forward ? "forward" : "backward") + ", " + run.block_kernel + " blocks";
}

}  // namespace

RingGantt model_gantt(const RingSchedule& ring, const Shape& shape, Pass pass, const RingMachine& machine,
                      const std::string& title) {
  const RingCost cost = ring_cost(ring, shape, pass, machine);
  const int P = ring.ranks;
  RingGantt g;
  g.title = title;
  double t = 0;
  for (int s = 0; s < P; ++s) {
    const RingStepCost& step = cost.steps[std::size_t(s)];
    g.step_begin_seconds.push_back(t);
    for (int r = 0; r < P; ++r) {
      const int origin = ring.steps[s][r].kv_origin;
      const double compute_end = t + step.flops[r] / machine.flops_per_second;
      if (step.flops[r] > 0)
        g.bars.push_back({.kind = RingBarKind::Compute, .rank = r, .lane = 0, .step = s, .share = origin,
                          .begin_seconds = t, .end_seconds = compute_end, .exposed = {}});
      if (P == 1) continue;  // one rank has no link (ring_cost)
      // The same bytes as ring_cost's link_bytes, split into its two hops.
      double at = t;
      const int tokens = ring.kv_tokens(origin);
      const auto hop = [&](RingBarKind kind, int bytes_per_element) {
        const double end = at + double(2 * kv_share_bytes(shape, tokens, bytes_per_element)) / machine.link_bytes_per_second;
        RingBar bar{.kind = kind, .rank = r, .lane = 1, .step = s, .share = origin, .begin_seconds = at,
                    .end_seconds = end, .exposed = {}};
        if (end > compute_end) bar.exposed.emplace_back(std::max(at, compute_end), end);
        g.bars.push_back(std::move(bar));
        at = end;
      };
      if (ring.kv_travels_on(s)) hop(RingBarKind::KV, machine.kv_bytes_per_element);
      if (pass == Pass::Backward) hop(RingBarKind::Partials, machine.grad_bytes_per_element);
    }
    t += step.seconds;
    g.step_end_seconds.push_back(t);
  }
  g.seconds = t;
  return g;
}

RingGantt measured_gantt(const Timeline& t, const RingMeasurement& m, const std::string& title) {
  RingGantt g;
  g.title = title;
  const std::uint64_t t0 = t.start_ns();
  const int P = m.run.ranks;
  std::vector<std::vector<std::pair<double, double>>> busy(std::size_t(P), std::vector<std::pair<double, double>>{});
  for (const TimelineSpan& s : t.spans) {
    if (s.event == PipelineEvent::RingSendRecv) continue;  // from the measurement, which knows each one's kind
    const double b = double(s.begin_ns - t0) * 1e-9, e = double(s.end_ns - t0) * 1e-9;
    g.bars.push_back({.kind = s.event == PipelineEvent::RingMerge ? RingBarKind::Merge : RingBarKind::Compute,
                      .rank = int(s.block), .lane = 0, .step = s.step,
                      .share = m.schedule.steps[std::size_t(s.step)][s.block].kv_origin, .begin_seconds = b,
                      .end_seconds = e, .exposed = {}});
    busy[s.block].emplace_back(b, e);
  }
  for (auto& b : busy) b = union_of(std::move(b));
  for (const MeasuredTransfer& x : m.transfers)
    g.bars.push_back({.kind = x.kind == RingTransferKind::KV ? RingBarKind::KV : RingBarKind::Partials,
                      .rank = x.rank, .lane = 1, .step = x.step,
                      .share = m.schedule.steps[std::size_t(x.step)][std::size_t(x.rank)].kv_origin,
                      .begin_seconds = x.begin_seconds, .end_seconds = x.end_seconds,
                      .exposed = uncovered(x.begin_seconds, x.end_seconds, busy[std::size_t(x.rank)])});
  for (const MeasuredStep& s : m.steps) {
    g.step_begin_seconds.push_back(s.begin_seconds);
    g.step_end_seconds.push_back(s.end_seconds);
  }
  g.seconds = m.seconds;
  return g;
}

int bar_at(const RingGantt& g, int rank, int lane, double seconds, double tolerance) {
  int best = -1;
  for (std::size_t k = 0; k < g.bars.size(); ++k) {
    const RingBar& b = g.bars[k];
    if (b.rank != rank || b.lane != lane || seconds < b.begin_seconds - tolerance || seconds > b.end_seconds + tolerance)
      continue;
    const auto length = [](const RingBar& x) { return x.end_seconds - x.begin_seconds; };
    if (best < 0 || length(b) < length(g.bars[std::size_t(best)])) best = int(k);
  }
  return best;
}

RingTimelineView ring_timeline_view(const Timeline& t, const std::string& what, const RingMachine& assumed) {
  RingTimelineView v;
  v.measured = measure_ring(t, what);
  const RingRun& run = v.measured.run;
  if (run.ranks > kMaxPanelRanks)
    throw InputError(what + " is a ring of " + std::to_string(run.ranks) + " ranks; the Ring panel draws 1 to " +
                     std::to_string(kMaxPanelRanks) + " (flashlab trace --ring --from-timeline reads any)");
  v.label = t.label;
  v.device = t.device;
  v.problem = problem_of(run);
  v.assumed = model_machine(run, assumed);
  v.replayed = measured_machine(v.measured, assumed);
  v.assumed_cost = model_cost(v.measured, v.assumed);
  v.replay_cost = model_cost(v.measured, v.replayed);
  const auto rates = [](const RingMachine& m) {
    return rate("%.0f", m.flops_per_second / 1e12) + " TFLOP/s per rank, " + rate("%.0f", m.link_bytes_per_second / 1e9) +
           " GB/s per link";
  };
  v.model_assumed = model_gantt(v.measured.schedule, run.shape, run.pass, v.assumed,
                                "model (ring_cost) at assumed rates: " + rates(v.assumed));
  v.model_replayed = model_gantt(v.measured.schedule, run.shape, run.pass, v.replayed,
                                 "model (ring_cost) at the measured rates: " + rates(v.replayed) + " (median link)");
  v.gantt = measured_gantt(t, v.measured, "measured: " + (t.label.empty() ? std::string("(no label)") : t.label));
  for (int s = 0; s < run.ranks; ++s) {
    const MeasuredStep& m = v.measured.steps[std::size_t(s)];
    v.steps.push_back({.model_seconds = v.assumed_cost.steps[std::size_t(s)].seconds,
                       .replay_seconds = v.replay_cost.steps[std::size_t(s)].seconds,
                       .measured_seconds = m.seconds(),
                       .slowest_rank = m.slowest_rank,
                       .slowest_compute_seconds = m.slowest_compute_seconds,
                       .hidden_fraction = m.hidden_fraction});
  }
  v.seconds_max = std::max({v.model_assumed.seconds, v.model_replayed.seconds, v.gantt.seconds});
  return v;
}

LoadedRingTimeline load_ring_timeline(const std::string& path, const RingMachine& assumed) {
  LoadedRingTimeline l{.path = path, .view = std::nullopt, .error = ""};
  try {
    l.view = ring_timeline_view(read_trace_event_file(path), "timeline " + path, assumed);
    l.view->path = path;
  } catch (const InputError& e) {
    l.error = e.what();
  }
  return l;
}

bool is_trace_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(4096, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(std::size_t(in.gcount()));
  return head.find("\"traceEvents\"") != std::string::npos;
}

// --- Synthetic ring timelines.

namespace {

// A fixed number in [-1, 1] for each (rank, step, what): the synthetic run's unevenness, the same every time.
double wobble(int rank, int step, int salt) {
  std::uint32_t h = std::uint32_t(rank) * 73856093u ^ std::uint32_t(step) * 19349663u ^ std::uint32_t(salt) * 83492791u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  return double(h % 2001) / 1000.0 - 1.0;
}

}  // namespace

Timeline synthetic_ring_timeline(const SyntheticRing& p) {
  constexpr std::uint64_t kOrigin = 1'700'000'000'000'000'000ull;  // a clock-like origin
  const int P = p.ranks;
  const Shape shape{.batch = 1, .heads_q = p.heads, .heads_kv = p.heads, .seq_q = p.seq, .seq_k = p.seq, .head_dim = p.head_dim};
  const RingSchedule ring = ring_schedule(p.layout, P, p.seq, p.seq, p.causal);
  const RingCost work = ring_cost(ring, shape, p.pass, RingMachine{});
  const bool backward = p.pass == Pass::Backward;
  const int kv_bytes = dtype_bytes(DType::BF16), grad_bytes = RingMachine{}.grad_bytes_per_element;

  Timeline t{.device = "none (synthetic)", .variant = "ring (model)", .label = "synthetic: " + p.label,
             .producer_warpgroups = 1, .info = {}, .spans = {}};
  int largest = 0;
  for (int origin = 0; origin < P; ++origin) largest = std::max(largest, ring.kv_tokens(origin));
  t.info = {{"ranks", std::to_string(P)},
            {"layout", to_string(p.layout)},
            {"pass", backward ? "backward" : "forward"},
            {"batch", "1"},
            {"heads", std::to_string(p.heads)},
            {"heads_kv", std::to_string(p.heads)},
            {"seq", std::to_string(p.seq)},
            {"head_dim", std::to_string(p.head_dim)},
            {"causal", to_string(p.causal)},
            {"dtype", to_string(DType::BF16)},
            {"block_kernel", "cuda-fa3-ws"},
            {"hop_bytes", std::to_string(2 * kv_share_bytes(shape, largest, kv_bytes))}};
  if (backward) t.info["partials_bytes"] = std::to_string(2 * kv_share_bytes(shape, largest, grad_bytes));

  const auto add = [&](int r, PipelineEvent e, int step, double b, double end) {
    t.spans.push_back({.block = std::uint32_t(r), .warpgroup = e == PipelineEvent::RingSendRecv ? 1u : 0u, .event = e,
                       .begin_ns = kOrigin + std::uint64_t(std::llround(b * 1e9)),
                       .end_ns = kOrigin + std::uint64_t(std::llround(end * 1e9)), .step = step});
  };
  // One grouped send/recv on every rank: each starts when its stream gets to it, and moves its bytes once the
  // slower of its two neighbours has started too (the span includes the wait, as NCCL's kernel does).
  std::vector<double> compute_free(P, 0.0), comm_free(P, 0.0), arrived(P, 0.0), grads_in(P, 0.0), grads_before(P, 0.0);
  const auto hop = [&](int step, const std::vector<double>& ready, int bytes_per_element, int salt) {
    std::vector<double> launch(P, 0.0), end(P, 0.0);
    for (int r = 0; r < P; ++r) launch[r] = std::max(comm_free[r], ready[r]);
    for (int r = 0; r < P; ++r) {
      const int prev = (r + P - 1) % P, next = (r + 1) % P;
      const double bytes = double(2 * kv_share_bytes(shape, ring.kv_tokens(ring.steps[step][r].kv_origin), bytes_per_element));
      const double go = std::max({launch[r], launch[prev], launch[next]});
      end[r] = go + bytes / p.link_bytes_per_second * (1 + 0.5 * p.jitter * wobble(r, step, salt));
      add(r, PipelineEvent::RingSendRecv, step, launch[r], end[r]);
      comm_free[r] = end[r];
    }
    return end;
  };
  for (int s = 0; s < P; ++s) {
    // The K/V hop for step s + 1 leaves once the rank is done with step s - 1 (the slot it overwrites).
    std::vector<double> next_arrived = arrived;
    if (ring.kv_travels_on(s)) next_arrived = hop(s, s == 0 ? arrived : compute_free, kv_bytes, 1);
    for (int r = 0; r < P; ++r) {
      double at = std::max(compute_free[r], arrived[r]);
      if (backward && s >= 2) at = std::max(at, grads_before[r]);  // the slot's last partials have left
      const double flops = work.steps[s].flops[r];
      if (flops > 0) {
        const double end = at + p.launch_seconds + flops / p.flops_per_second * (1 + p.jitter * wobble(r, s, 0));
        add(r, PipelineEvent::RingCompute, s, at, end);
        at = end;
      }
      if (!backward && flops > 0) add(r, PipelineEvent::RingMerge, s, at, at + p.merge_seconds), at += p.merge_seconds;
      if (backward && s > 0) {  // adding the partials that came in from the rank before
        at = std::max(at, grads_in[r]);
        add(r, PipelineEvent::RingMerge, s, at, at + p.merge_seconds), at += p.merge_seconds;
      }
      compute_free[r] = at;
    }
    arrived = next_arrived;
    if (backward) {  // (one rank sends its partials to itself, as the NCCL ring does)
      grads_before = grads_in;
      grads_in = hop(s, compute_free, grad_bytes, 2);
    }
  }
  std::stable_sort(t.spans.begin(), t.spans.end(), [](const TimelineSpan& a, const TimelineSpan& b) {
    return std::tie(a.block, a.warpgroup, a.begin_ns) < std::tie(b.block, b.warpgroup, b.begin_ns);
  });
  return t;
}

}  // namespace flashlab::viz
