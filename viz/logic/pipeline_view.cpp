#include "pipeline_view.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>

#include "core/problem.hpp"

namespace flashlab::viz {

namespace {

constexpr double kFitMargin = 0.02;  // of the data's length, each side

std::vector<std::pair<std::uint32_t, std::uint32_t>> lanes_of(const Timeline& t) {
  std::vector<std::pair<std::uint32_t, std::uint32_t>> v;
  for (const TimelineSpan& s : t.spans) v.emplace_back(s.block, s.warpgroup);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int blocks_of(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& lanes) {
  int n = 0;
  for (std::size_t k = 0; k < lanes.size(); ++k) n += k == 0 || lanes[k].first != lanes[k - 1].first;
  return n;
}

}  // namespace

LoadedTimeline load_timeline(const std::string& path) {
  LoadedTimeline l{.path = path, .timeline = std::nullopt, .error = ""};
  try {
    Timeline t = read_trace_event_file(path);
    if (t.spans.empty())
      l.error = "timeline " + path + " holds no pipeline events (" + known_pipeline_events() + ")";
    else
      l.timeline = std::move(t);
  } catch (const InputError& e) {
    l.error = e.what();
  }
  return l;
}

TimeWindow fit_all(double data_end_ns) {
  const double len = std::max(data_end_ns, kMinWindowNs);
  return {.begin_ns = -len * kFitMargin, .end_ns = len * (1 + kFitMargin)};
}

TimeWindow clamp_window(TimeWindow w, double data_end_ns) {
  const TimeWindow all = fit_all(data_end_ns);
  if (!std::isfinite(w.begin_ns) || !std::isfinite(w.end_ns) || !(w.width() > 0)) return all;
  const double width = std::clamp(w.width(), kMinWindowNs, all.width());
  double begin = std::clamp(w.begin_ns, all.begin_ns, all.end_ns - width);
  return {.begin_ns = begin, .end_ns = begin + width};
}

TimeWindow zoom(TimeWindow w, double at_ns, double factor, double data_end_ns) {
  w = clamp_window(w, data_end_ns);
  const TimeWindow all = fit_all(data_end_ns);
  const double width = std::clamp(w.width() * factor, kMinWindowNs, all.width());
  const double r = (at_ns - w.begin_ns) / w.width();  // where `at` sits in the window, 0..1
  const double begin = at_ns - r * width;
  return clamp_window({.begin_ns = begin, .end_ns = begin + width}, data_end_ns);
}

TimeWindow pan(TimeWindow w, double delta_ns, double data_end_ns) {
  return clamp_window({.begin_ns = w.begin_ns + delta_ns, .end_ns = w.end_ns + delta_ns}, data_end_ns);
}

float x_of(const TimeWindow& w, double t_ns, float x0, float width) {
  return x0 + float((t_ns - w.begin_ns) / w.width() * double(width));
}

double t_of(const TimeWindow& w, float x, float x0, float width) {
  return w.begin_ns + double(x - x0) / double(width) * w.width();
}

std::vector<double> time_ticks(const TimeWindow& w, int max_ticks) {
  std::vector<double> t;
  if (!(w.width() > 0) || max_ticks < 1) return t;
  const double raw = w.width() / max_ticks, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
  for (double k = std::ceil(std::max(0.0, w.begin_ns) / step); k * step <= w.end_ns; k += 1) t.push_back(k * step);
  return t;
}

std::string format_us(double ns, double resolution_ns) {
  const double res_us = std::max(resolution_ns, 1.0) / 1000.0;
  const int decimals = std::clamp(int(std::ceil(-std::log10(res_us) - 1e-9)), 0, 3);
  char b[48];
  std::snprintf(b, sizeof b, "%.*f \xC2\xB5s", decimals, ns / 1000.0);
  return b;
}

std::string group_title(const Timeline& t) {
  std::string s = t.label.empty() ? "(no label)" : t.label;
  if (!t.variant.empty()) s += "  \xC2\xB7  " + t.variant;
  if (!t.device.empty()) s += "  \xC2\xB7  " + t.device;
  return s;
}

// The names the Trace Event file gives its processes and threads (model/timeline.cpp writes them as metadata).
std::string block_name(const Timeline& t, std::uint32_t block) {
  return (t.is_ring() ? "rank " : "block ") + std::to_string(block);
}

std::string role_name(const Timeline& t, std::uint32_t wg) {
  if (t.is_ring()) return wg == 0 ? "compute" : wg == 1 ? "communication" : "stream " + std::to_string(wg);
  return std::string(wg < t.producer_warpgroups ? "producer" : "consumer") + " WG" + std::to_string(wg);
}

std::string lane_name(const Timeline& t, std::uint32_t block, std::uint32_t warpgroup) {
  return block_name(t, block) + " " + role_name(t, warpgroup);
}

LaneLayout layout_lanes(const std::vector<const Timeline*>& timelines, const LaneMetrics& m) {
  LaneLayout out;
  float y = 0;
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    const Timeline* t = timelines[i];
    if (!t) continue;
    if (!out.groups.empty()) y += m.group_gap;
    out.groups.push_back({.timeline = int(i), .y0 = y, .title = group_title(*t)});
    y += m.title_height;
    const auto lanes = lanes_of(*t);
    for (std::size_t k = 0; k < lanes.size(); ++k) {
      if (k > 0 && lanes[k].first != lanes[k - 1].first) y += m.block_gap;
      out.lanes.push_back({.timeline = int(i), .block = lanes[k].first, .warpgroup = lanes[k].second, .y0 = y,
                           .y1 = y + m.lane_height, .name = lane_name(*t, lanes[k].first, lanes[k].second)});
      y += m.lane_height + m.lane_gap;
    }
  }
  out.height = y;
  return out;
}

LaneMetrics fit_lanes(const std::vector<const Timeline*>& timelines, float height, float min_h, float max_h) {
  LaneMetrics m;
  float fixed = 0;
  int lanes = 0, groups = 0;
  for (const Timeline* t : timelines) {
    if (!t) continue;
    const auto l = lanes_of(*t);
    fixed += m.title_height + (groups ? m.group_gap : 0) + float(blocks_of(l) - 1) * m.block_gap + float(l.size()) * m.lane_gap;
    lanes += int(l.size());
    ++groups;
  }
  if (lanes > 0) m.lane_height = std::clamp((height - fixed) / float(lanes), min_h, max_h);
  return m;
}

std::optional<Hit> hit_test(const LaneLayout& layout, const std::vector<const Timeline*>& timelines, const TimeWindow& w,
                            float x, float y, float width, float instant_px) {
  if (width <= 0 || x < 0 || x > width) return std::nullopt;
  const Lane* lane = nullptr;
  for (const Lane& l : layout.lanes)
    if (y >= l.y0 && y < l.y1) lane = &l;
  if (!lane || lane->timeline < 0 || std::size_t(lane->timeline) >= timelines.size() || !timelines[std::size_t(lane->timeline)])
    return std::nullopt;
  const Timeline& t = *timelines[std::size_t(lane->timeline)];
  const double at = t_of(w, x, 0, width), tol = double(instant_px) / double(width) * w.width();
  const double t0 = double(t.start_ns());
  std::optional<Hit> best_instant, best_span;
  double best_distance = 0, best_length = 0;
  for (std::size_t k = 0; k < t.spans.size(); ++k) {
    const TimelineSpan& s = t.spans[k];
    if (s.block != lane->block || s.warpgroup != lane->warpgroup) continue;
    const double b = double(s.begin_ns) - t0, e = double(s.end_ns) - t0;
    if (!is_span(s.event)) {
      const double d = std::fabs(at - b);
      if (d <= tol && (!best_instant || d < best_distance)) best_instant = Hit{lane->timeline, k}, best_distance = d;
      continue;
    }
    const double mid = (b + e) / 2, half = std::max((e - b) / 2, tol);
    if (std::fabs(at - mid) <= half && (!best_span || e - b < best_length)) best_span = Hit{lane->timeline, k}, best_length = e - b;
  }
  return best_instant ? best_instant : best_span;
}

std::string hover_text(const Timeline& t, std::size_t k) {
  const TimelineSpan& s = t.spans.at(k);
  const double b = double(s.begin_ns - t.start_ns());
  std::string text = std::string(to_string(s.event)) + "\n" + lane_name(t, s.block, s.warpgroup) + "\n";
  if (is_span(s.event))
    text += "start " + format_us(b) + ", duration " + format_us(double(s.end_ns - s.begin_ns));
  else
    text += "at " + format_us(b) + " (instant)";
  if (s.step >= 0) text += "\nring step " + std::to_string(s.step);
  return text;
}

int palette_index(PipelineEvent e) {
  switch (e) {
    case PipelineEvent::TmaIssue: return 1;     // blue
    case PipelineEvent::TmaLanded: return 7;    // cyan
    case PipelineEvent::WgmmaIssue: return 2;   // green
    case PipelineEvent::WgmmaWait: return 10;   // olive
    case PipelineEvent::Softmax: return 8;      // orange
    case PipelineEvent::BarrierWait: return 5;  // grey
    case PipelineEvent::Epilogue: return 3;     // purple
    case PipelineEvent::RingCompute: return 4;  // yellow
    case PipelineEvent::RingSendRecv: return 9; // pink
    case PipelineEvent::RingMerge: return 11;   // pale lavender
    case PipelineEvent::Count: break;  // not a kind (-Wswitch asks for a case of every new kind above)
  }
  return 5;
}

bool is_ring_event(PipelineEvent e) {
  return e == PipelineEvent::RingCompute || e == PipelineEvent::RingSendRecv || e == PipelineEvent::RingMerge;
}

std::vector<PipelineEvent> kinds_in(const std::vector<const Timeline*>& timelines) {
  bool seen[kPipelineEventCount] = {};
  for (const Timeline* t : timelines)
    if (t)
      for (const TimelineSpan& s : t->spans) seen[static_cast<int>(s.event)] = true;
  std::vector<PipelineEvent> kinds;
  for (int k = 0; k < kPipelineEventCount; ++k)
    if (seen[k]) kinds.push_back(static_cast<PipelineEvent>(k));
  return kinds;
}

Timeline synthetic_timeline(const SyntheticPipeline& p) {
  // Made-up costs (ns), chosen only so the picture shows the pipeline's shape.
  constexpr std::uint64_t kOrigin = 1'700'000'000'000'000'000ull;  // a %globaltimer-like origin
  constexpr std::uint64_t kWgmma = 420, kSoftmax = 380, kEpilogue = 600, kIssue = 30, kBlockOffset = 250;
  Timeline t{.device = "none (synthetic)", .variant = "cuda-fa3-ws (model)", .label = "synthetic: " + p.label,
             .producer_warpgroups = 1, .spans = {}};
  auto add = [&](std::uint32_t b, std::uint32_t wg, PipelineEvent e, std::uint64_t t0, std::uint64_t t1) {
    t.spans.push_back({.block = b, .warpgroup = wg, .event = e, .begin_ns = kOrigin + t0, .end_ns = kOrigin + t1});
  };
  const std::uint32_t consumers = std::max(1u, p.consumers), stages = std::max(1u, p.stages);
  for (std::uint32_t b = 0; b < p.blocks; ++b) {
    std::uint64_t producer = b * kBlockOffset, tensor_core_free = 0;
    std::vector<std::uint64_t> now(consumers, b * kBlockOffset + 100), stage_free(p.kv_tiles, 0);
    for (std::uint32_t j = 0; j < p.kv_tiles; ++j) {
      // Producer: wait for the stage to be empty, issue the TMA load; it lands after a latency.
      if (j >= stages && stage_free[j - stages] > producer) {
        add(b, 0, PipelineEvent::BarrierWait, producer, stage_free[j - stages]);
        producer = stage_free[j - stages];
      }
      add(b, 0, PipelineEvent::TmaIssue, producer, producer);
      const std::uint64_t landed = producer + 800 + 60 * ((j * 7 + b * 3) % 5);
      producer += kIssue;
      // Consumers: S = Q K^T, softmax, O += P V. Without overlap they share the tensor cores at the
      // same time (each wgmma takes `consumers` times longer); with it they take turns.
      const std::uint64_t wgmma = p.overlap ? kWgmma : kWgmma * consumers;
      for (int phase = 0; phase < 2; ++phase)
        for (std::uint32_t c = 0; c < consumers; ++c) {
          const std::uint32_t wg = 1 + c;
          std::uint64_t at = now[c];
          if (phase == 0) {
            if (landed > at) add(b, wg, PipelineEvent::BarrierWait, at, landed), at = landed;
            add(b, wg, PipelineEvent::TmaLanded, at, at);
          }
          if (p.overlap && tensor_core_free > at) add(b, wg, PipelineEvent::BarrierWait, at, tensor_core_free), at = tensor_core_free;
          add(b, wg, PipelineEvent::WgmmaIssue, at, at);
          at += wgmma;
          add(b, wg, PipelineEvent::WgmmaWait, at, at);
          tensor_core_free = at;
          if (phase == 0) add(b, wg, PipelineEvent::Softmax, at, at + kSoftmax), at += kSoftmax;
          now[c] = at;
        }
      stage_free[j] = *std::max_element(now.begin(), now.end());
    }
    for (std::uint32_t c = 0; c < consumers; ++c) add(b, 1 + c, PipelineEvent::Epilogue, now[c], now[c] + kEpilogue);
  }
  std::stable_sort(t.spans.begin(), t.spans.end(), [](const TimelineSpan& a, const TimelineSpan& b) {
    return std::tie(a.block, a.warpgroup, a.begin_ns) < std::tie(b.block, b.warpgroup, b.begin_ns);
  });
  return t;
}

}  // namespace flashlab::viz
