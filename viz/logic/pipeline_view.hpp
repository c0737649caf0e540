#pragma once
// The Pipeline panel's logic, without a window (a Hopper kernel's warpgroups, or a ring's ranks and streams): which time window is visible (zoom around a point,
// pan, clamped to the data, fit-all), where each lane sits (one per (block, warpgroup), two timelines
// stacked one above the other as two groups with a title each), time <-> pixel mapping, ticks, what
// lies under the mouse, and a colour per event kind. Times here are nanoseconds since each
// timeline's own earliest stamp, so two runs line up at 0.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/timeline.hpp"

namespace flashlab::viz {

// A timeline file as the panel holds it: the timeline, or the one sentence saying why not.
struct LoadedTimeline {
  std::string path;
  std::optional<Timeline> timeline;
  std::string error;
};
LoadedTimeline load_timeline(const std::string& path);  // never throws for a bad file

// --- The visible time window.
struct TimeWindow {
  double begin_ns = 0, end_ns = 1;
  double width() const { return end_ns - begin_ns; }
  bool operator==(const TimeWindow&) const = default;
};
constexpr double kMinWindowNs = 50;  // zoomed in no further (about %globaltimer's resolution)

// The whole data [0, data_end_ns] with a small margin each side.
TimeWindow fit_all(double data_end_ns);
// Keeps the window within the fitted range: no wider than it, no narrower than kMinWindowNs,
// shifted back inside when it runs over an edge.
TimeWindow clamp_window(TimeWindow, double data_end_ns);
// factor < 1 zooms in; the time at_ns stays under the same pixel (then clamped).
TimeWindow zoom(TimeWindow, double at_ns, double factor, double data_end_ns);
TimeWindow pan(TimeWindow, double delta_ns, double data_end_ns);  // positive: later times come into view
// Time <-> x pixel for a plot area starting at x0, width pixels wide.
float x_of(const TimeWindow&, double t_ns, float x0, float width);
double t_of(const TimeWindow&, float x, float x0, float width);
// Tick times at 1-2-5 steps, at most about max_ticks of them, inside the window.
std::vector<double> time_ticks(const TimeWindow&, int max_ticks);
// "12.345 µs": microseconds with as many decimals as resolution_ns needs (1 ns: 3, 200 ns: 1, 1 µs: 0).
std::string format_us(double ns, double resolution_ns = 1);

// --- Lanes.
struct Lane {
  int timeline = 0;  // which of the stacked timelines (0: top)
  std::uint32_t block = 0, warpgroup = 0;
  float y0 = 0, y1 = 0;  // pixels from the top of the lane area
  std::string name;      // "block 0 producer WG0"
};
struct LaneGroup {
  int timeline = 0;
  float y0 = 0;  // the title line's top
  std::string title;  // label, variant, device
};
struct LaneLayout {
  std::vector<LaneGroup> groups;
  std::vector<Lane> lanes;  // grouped by timeline, then ordered by block, then warpgroup
  float height = 0;
};
struct LaneMetrics {
  float lane_height = 24, lane_gap = 3, block_gap = 6, title_height = 20, group_gap = 10;
};
// Up to two timelines (null entries are skipped, but keep their index).
LaneLayout layout_lanes(const std::vector<const Timeline*>&, const LaneMetrics&);
// Lane heights that fill `height` pixels (clamped to [min_h, max_h]).
LaneMetrics fit_lanes(const std::vector<const Timeline*>&, float height, float min_h = 12, float max_h = 36);
std::string group_title(const Timeline&);
// A Hopper timeline's lanes are "block 0" / "producer WG0"; a ring's "rank 0" / "compute" or "communication".
std::string block_name(const Timeline&, std::uint32_t block);
std::string role_name(const Timeline&, std::uint32_t warpgroup);
std::string lane_name(const Timeline&, std::uint32_t block, std::uint32_t warpgroup);  // the two, with a space

// --- Under the mouse.
struct Hit {
  int timeline = 0;
  std::size_t span = 0;  // index into that timeline's spans
};
// x, y in pixels: x relative to the plot area's left edge (width pixels wide), y relative to the
// lane area's top. Instants are hit within instant_px of their stamp, spans at least that wide too;
// instants win over spans, the shortest span wins among spans.
std::optional<Hit> hit_test(const LaneLayout&, const std::vector<const Timeline*>&, const TimeWindow&, float x, float y,
                            float width, float instant_px = 4);
// Event, lane, start and duration (us), and a ring span's step.
std::string hover_text(const Timeline&, std::size_t span);

// --- Colours: an index into the app's series palette (app/palette.hpp kSeries), one per kind.
int palette_index(PipelineEvent);
// The ring's kinds (compute, send/recv, merge) against the Hopper kernel's warpgroup kinds.
bool is_ring_event(PipelineEvent);
// The kinds that occur in the timelines (null entries skipped), in enum order: what the legend lists.
std::vector<PipelineEvent> kinds_in(const std::vector<const Timeline*>&);

// --- Made-up data for tests and the demo screenshot: a toy model of a warp-specialized pipeline
// (one producer warpgroup streaming K/V tiles through `stages` buffers, `consumers` warpgroups doing
// wgmma + softmax per tile). `overlap`: consumers take turns (ping-pong) so one's softmax hides under
// the other's wgmma. Nothing here is measured; the label says "synthetic".
struct SyntheticPipeline {
  std::uint32_t blocks = 2, consumers = 2, kv_tiles = 8, stages = 2;
  bool overlap = false;
  std::string label;  // "synthetic: " is put in front
};
Timeline synthetic_timeline(const SyntheticPipeline&);

}  // namespace flashlab::viz
