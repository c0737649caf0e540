// Ring: ring attention over P ranks (sequence parallelism), the three layouts side by side. For each
// layout, the ranks as boxes: the query tokens a rank keeps (Q), the K/V share it holds at this step
// (KV, in the colour of the rank it started on) and its (Q range, K range) pairs of the step as a
// small grid (full, diagonal under the causal mask, skipped). The shares travel one hop along the
// ring at the end of each step. Under the boxes, each rank's time line: per step its work (solid, in
// the colour of the share it computes on) and its idle time (hatched) until the slowest rank is done,
// with the model's transfer of the share as a white line. The ring follows the app's transport
// (ring_view.hpp: its P steps laid over the stream). Everything is read from logic/ring_view.hpp,
// which reads the ring's one schedule and cost model; times are the model's or a measured file's.
// With a measured ring timeline the panel shows that run instead: the model of its problem (assumed rates, or
// the run's own) above what the GPUs did, per rank its compute and link lanes on one time axis, the stretches
// where a hop was not hidden marked red, and per step the model's time against the measured one.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/palette.hpp"
#include "app/panels.hpp"
#include "app/tile_grid.hpp"
#include "logic/format.hpp"
#include "logic/pipeline_view.hpp"  // time_ticks, format_us: the time axis
#include "logic/ring_view.hpp"

namespace flashlab::viz {

namespace {

static_assert(palette::kRankCount >= kMaxPanelRanks, "one colour per rank the panel draws");

constexpr ImU32 kText = IM_COL32(215, 218, 226, 255);
constexpr ImU32 kDim = IM_COL32(150, 155, 168, 255);
constexpr ImU32 kTitle = IM_COL32(255, 214, 120, 255);
constexpr ImU32 kBox = IM_COL32(38, 41, 50, 255);
constexpr ImU32 kBoxEdge = IM_COL32(95, 100, 115, 255);
constexpr ImU32 kStrip = IM_COL32(24, 26, 31, 255);
constexpr ImU32 kLaneBg = IM_COL32(30, 32, 39, 255);
constexpr ImU32 kHatch = IM_COL32(120, 124, 136, 255);
constexpr ImU32 kLink = IM_COL32(245, 245, 250, 255);
constexpr ImU32 kCursor = IM_COL32(255, 214, 120, 255);
constexpr ImU32 kFuture = IM_COL32(14, 15, 18, 90);
constexpr ImU32 kVisible = IM_COL32(205, 208, 218, 255);
constexpr ImU32 kError = IM_COL32(255, 110, 100, 255);
constexpr float kBoxGap = 16.f;    // between two rank boxes: room for the arrow
constexpr float kColumnGap = 22.f;
constexpr float kLabelWidth = 26.f;  // "r3" left of each time line

struct PanelState {
  bool built = false;
  RingSettings shown;  // what `columns` were built for
  std::vector<RingColumn> columns;
  std::string error;   // why the settings (or the measured file) could not be shown
  char measured_path[512] = "";
  bool shared_scale = true;  // one time axis for the three layouts, so their lengths compare
  // A measured ring timeline (settings.timeline): the run beside the model of its problem.
  std::string timeline_shown;  // the path `timeline` was loaded from
  LoadedRingTimeline timeline;
  bool measured_rates = false;  // the model row at the measured rates, else at the model's assumed ones
};
PanelState& state() {
  static PanelState s;
  return s;
}

ImU32 rank_colour(int rank, int alpha = 255) {
  const palette::Rgb& c = palette::kRanks[rank % palette::kRankCount];
  return IM_COL32(c.r, c.g, c.b, alpha);
}

// Builds the three columns for the scenario's settings. A measured file fixes the problem: its
// settings replace the scenario's (ring_view.hpp).
void rebuild(PanelState& ps, AppState& st) {
  ps.error.clear();
  ps.columns.clear();
  RingSettings settings = st.scenario.ring;
  std::optional<MeasuredRing> measured;
  if (!settings.measured.empty()) {
    try {
      measured = load_measured_ring(settings.measured);
      const int step = settings.step;
      settings = measured->settings;
      settings.step = step;
      st.scenario.ring = st.edit.ring = settings;
    } catch (const InputError& e) {
      ps.error = e.what();
    }
  }
  try {
    ps.columns = ring_columns(settings, RingMachine{}, measured ? &*measured : nullptr);
  } catch (const InputError& e) {
    ps.error = e.what();
  }
  ps.shown = st.scenario.ring;
  ps.built = true;
  std::snprintf(ps.measured_path, sizeof ps.measured_path, "%s", settings.measured.c_str());
}


// The file field, its "load" and a button back to the model alone; true when `r` changed. One field for both
// kinds of file: a Trace Event file is a ring timeline, anything else a measured-times file.
bool file_row(PanelState& ps, RingSettings& r, const char* hint, const char* model_label) {
  ImGui::InputTextWithHint("##ring_file", hint, ps.measured_path, sizeof ps.measured_path);
  ImGui::SameLine();
  bool changed = false;
  if (ImGui::Button("load")) {
    const std::string path = ps.measured_path;
    const bool timeline = is_trace_event_file(path);
    (timeline ? r.timeline : r.measured) = path;
    (timeline ? r.measured : r.timeline).clear();
    changed = true;
  }
  ImGui::SameLine();
  if (ImGui::Button(model_label)) r.measured.clear(), r.timeline.clear(), changed = true;
  return changed;
}

// The panel's own controls: the ring's problem. Any change drops a measured file (it fixed the problem).
void controls(PanelState& ps, AppState& st) {
  RingSettings r = st.scenario.ring;
  bool changed = false;
  ImGui::PushItemWidth(90);
  int ranks = r.ranks, seq = r.seq, heads = r.heads, d = r.head_dim;
  if (ImGui::InputInt("P", &ranks, 1, 1)) r.ranks = std::clamp(ranks, 1, kMaxPanelRanks), changed = true;
  ImGui::SameLine();
  if (ImGui::InputInt("N", &seq, 0, 0, ImGuiInputTextFlags_EnterReturnsTrue)) r.seq = seq, changed = true;
  ImGui::SameLine();
  if (ImGui::InputInt("heads", &heads, 0, 0, ImGuiInputTextFlags_EnterReturnsTrue)) r.heads = heads, changed = true;
  ImGui::SameLine();
  if (ImGui::InputInt("d", &d, 0, 0, ImGuiInputTextFlags_EnterReturnsTrue)) r.head_dim = d, changed = true;
  ImGui::PopItemWidth();
  ImGui::SameLine();
  if (ImGui::Checkbox("causal", &r.causal)) changed = true;
  ImGui::SameLine();
  bool backward = r.pass == Pass::Backward;
  if (ImGui::Checkbox("backward", &backward)) r.pass = backward ? Pass::Backward : Pass::Forward, changed = true;
  ImGui::SameLine();
  ImGui::Checkbox("one time scale", &ps.shared_scale);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(std::max(120.f, ImGui::GetContentRegionAvail().x - 130));
  if (file_row(ps, r, "measured times or a ring timeline (JSON, ring_view.hpp)", "model")) changed = true;
  if (!changed) return;
  if (r.measured == st.scenario.ring.measured &&
      (r.ranks != st.scenario.ring.ranks || r.seq != st.scenario.ring.seq || r.heads != st.scenario.ring.heads ||
       r.head_dim != st.scenario.ring.head_dim || r.causal != st.scenario.ring.causal || r.pass != st.scenario.ring.pass))
    r.measured.clear();
  if (r.step >= r.ranks) r.step = r.ranks - 1;
  try {
    ring_shape(r);
    st.scenario.ring = st.edit.ring = r;
  } catch (const InputError& e) {
    ps.error = e.what();
  }
}

// A strip standing for the whole sequence, [x0, x1) wide, with the tokens of `ranges` marked. A
// strided range (striped) is drawn as a comb of evenly spaced ticks, never closer than 3 pixels.
void token_strip(ImDrawList* dl, float x0, float y0, float x1, float y1, const std::vector<TokenRange>& ranges,
                 int length, ImU32 colour) {
  dl->AddRectFilled(ImVec2(x0, y0), ImVec2(x1, y1), kStrip);
  const float w = x1 - x0;
  const auto x_of = [&](double token) { return x0 + float(token / length) * w; };
  for (const TokenRange& t : ranges) {
    if (t.stride == 1) {
      dl->AddRectFilled(ImVec2(x_of(t.first), y0), ImVec2(std::max(x_of(t.first + t.count), x_of(t.first) + 1), y1), colour);
      continue;
    }
    const int every = std::max(1, int(std::ceil(t.count / std::max(1.f, w / 3.f))));
    for (int a = 0; a < t.count; a += every) {
      const float x = x_of(t.token(a));
      dl->AddRectFilled(ImVec2(x, y0), ImVec2(x + 1, y1), colour);
    }
  }
}

// The rank's pairs at a step as a grid: a row per query range, a column per key range of the share.
void pair_grid(ImDrawList* dl, ImVec2 p, float cell, const RingSchedule& ring, int step, int rank) {
  const RankStep& rs = ring.steps[step][rank];
  const int cols = int(ring.kv_ranges[rs.kv_origin].size());
  for (std::size_t k = 0; k < rs.pairs.size(); ++k) {
    const float x = p.x + float(int(k) % cols) * (cell + 2), y = p.y + float(int(k) / cols) * (cell + 2);
    const ImVec2 a(x, y), b(x + cell, y + cell);
    dl->AddRectFilled(a, b, rgb(palette::kSkipped));
    switch (rs.pairs[k].visibility) {
      case Visibility::Full: dl->AddRectFilled(a, b, kVisible); break;
      case Visibility::Diagonal: dl->AddTriangleFilled(a, ImVec2(x, y + cell), b, kVisible); break;
      case Visibility::Skipped: break;
    }
    dl->AddRect(a, b, kBoxEdge);
  }
}

// Diagonal hatching over a rectangle: idle time.
void hatch(ImDrawList* dl, ImVec2 a, ImVec2 b) {
  if (b.x - a.x < 1) return;
  dl->PushClipRect(a, b, true);
  const float h = b.y - a.y;
  for (float x = a.x - h; x < b.x; x += 5) dl->AddLine(ImVec2(x, b.y), ImVec2(x + h, a.y), kHatch);
  dl->PopClipRect();
}

std::string ms(double seconds) { return format_seconds(seconds); }

// "rank 3", "s1": a label and a number (formatted, not concatenated: GCC 12 warns on a short literal + string).
std::string numbered(const char* label, int k) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%d", label, k);
  return buf;
}

// One layout's column in [p0, p0 + size).
void draw_column(ImDrawList* dl, const RingColumn& column, ImVec2 p0, ImVec2 size, RingPosition now, double t_max) {
  const float lh = ImGui::GetTextLineHeight();
  const float x1 = p0.x + size.x;
  float y = p0.y;
  dl->AddText(ImVec2(p0.x, y), kTitle, to_string(column.layout));
  if (!column.view) {
    dl->PushClipRect(p0, ImVec2(x1, p0.y + size.y), true);
    dl->AddText(nullptr, 0.f, ImVec2(p0.x, y + lh + 4), kError, column.error.c_str(), nullptr, size.x);
    dl->PopClipRect();
    return;
  }
  const RingView& v = *column.view;
  const RingSchedule& ring = v.schedule;
  const int P = ring.ranks;
  char head[160];
  std::snprintf(head, sizeof head, "   %s, imbalance %.2f, ranks busy %.0f%%", ms(v.seconds).c_str(), v.imbalance,
                100 * v.busy);
  dl->AddText(ImVec2(p0.x + ImGui::CalcTextSize(to_string(column.layout)).x, y), kText, head);
  y += lh + 2;
  dl->AddText(ImVec2(p0.x, y), v.measured ? kTitle : kDim, v.measured ? v.source.c_str() : "times: the model");
  y += lh + 8;

  // The ranks: boxes in ring order, rank P-1 sending back to rank 0 along the line under them.
  const float box_w = (size.x - kBoxGap * float(P - 1)) / float(P), pitch = box_w + kBoxGap;
  const bool compact = box_w < 100;  // narrow boxes (P > 4): short names, no strip labels (Q above, K/V below)
  const float cell = compact ? 9.f : 13.f, strip_h = 13.f, strip_x = compact ? 6.f : 30.f;
  const float box_h = lh + 2 * (strip_h + 9) + 10;
  const double hop = sends_after(v, now.step) ? hop_fraction(now.progress) : 0.0;
  const float q_y = y + lh + 8, kv_y = q_y + strip_h + 9;  // the strips' tops, inside the box
  for (int r = 0; r < P; ++r) {
    const float bx = p0.x + float(r) * pitch;
    dl->AddRectFilled(ImVec2(bx, y), ImVec2(bx + box_w, y + box_h), kBox, 3.f);
    dl->AddRect(ImVec2(bx, y), ImVec2(bx + box_w, y + box_h), kBoxEdge, 3.f);
    const std::string name = numbered(compact ? "r" : "rank ", r);
    dl->AddText(ImVec2(bx + 5, y + 3), rank_colour(r), name.c_str());
    const float grid_x = bx + box_w - 5 - float(ring.steps[now.step][r].pairs.size() / ring.q_ranges[r].size()) * (cell + 2);
    if (grid_x > bx + 10 + ImGui::CalcTextSize(name.c_str()).x) pair_grid(dl, ImVec2(grid_x, y + 4), cell, ring, now.step, r);
    if (!compact) {
      dl->AddText(ImVec2(bx + 6, q_y + (strip_h - lh) / 2), kDim, "Q");
    }
    token_strip(dl, bx + strip_x, q_y, bx + box_w - 6, q_y + strip_h, ring.q_ranges[r], ring.seq_q, rank_colour(r));
    if (r + 1 < P) {  // the hop to the next rank
      const float ax = bx + box_w + 3, ay = kv_y + strip_h / 2;
      dl->AddTriangleFilled(ImVec2(ax, ay - 5), ImVec2(ax + kBoxGap - 6, ay), ImVec2(ax, ay + 5), kBoxEdge);
    }
  }
  // The shares, each at its holder (sliding to the next rank during the hop; the one leaving the last
  // rank comes in again on the left).
  dl->PushClipRect(ImVec2(p0.x, y), ImVec2(x1, y + box_h + 16), true);
  for (int r = 0; r < P; ++r) {
    const int origin = ring.steps[now.step][r].kv_origin;
    const int to = ring.steps[now.step][r].send_to;
    const float from_x = p0.x + float(r) * pitch;
    const float shift = float(hop) * pitch;
    for (const float bx : {from_x + shift, to < r ? from_x + shift - float(P) * pitch : -1e9f})
      if (bx > -1e8f)
        token_strip(dl, bx + strip_x, kv_y, bx + box_w - 6, kv_y + strip_h, ring.kv_ranges[origin], ring.seq_k,
                    rank_colour(origin));
  }
  dl->PopClipRect();
  for (int r = 0; r < P && !compact; ++r)  // over a share passing by
    dl->AddText(ImVec2(p0.x + float(r) * pitch + 6, kv_y + (strip_h - lh) / 2), kDim, "KV");
  y += box_h;
  const float wrap_y = y + 7;  // rank P-1 -> rank 0
  if (P > 1) {
    const float xl = p0.x + box_w / 2, xr = p0.x + float(P - 1) * pitch + box_w / 2;
    dl->AddLine(ImVec2(xr, y), ImVec2(xr, wrap_y), kBoxEdge, 1.5f);
    dl->AddLine(ImVec2(xr, wrap_y), ImVec2(xl, wrap_y), kBoxEdge, 1.5f);
    dl->AddLine(ImVec2(xl, wrap_y), ImVec2(xl, y + 1), kBoxEdge, 1.5f);
    dl->AddTriangleFilled(ImVec2(xl - 5, y + 7), ImVec2(xl + 5, y + 7), ImVec2(xl, y + 1), kBoxEdge);
  }
  y = wrap_y + 10;

  // The time lines: a row per rank, time to the right on the scale shared by the three columns.
  const float plot_x0 = p0.x + kLabelWidth, plot_w = size.x - kLabelWidth;
  const auto x_of = [&](double t) { return plot_x0 + float(t / t_max) * plot_w; };
  for (int s = 0; s < P; ++s) {  // step labels over their columns
    const RingStepView& step = v.steps[s];
    const std::string label = numbered("s", s);
    const float xa = x_of(step.start_seconds), xb = x_of(step.start_seconds + step.seconds);
    if (xb - xa > ImGui::CalcTextSize(label.c_str()).x + 2)
      dl->AddText(ImVec2((xa + xb - ImGui::CalcTextSize(label.c_str()).x) / 2, y), s == now.step ? kTitle : kDim,
                  label.c_str());
  }
  y += lh + 2;
  const float rows_h = p0.y + size.y - y - 2 * lh - 10;
  const float row_h = std::clamp((rows_h - float(P - 1) * 3) / float(P), 10.f, 96.f);
  const float rows_y0 = y;
  for (int r = 0; r < P; ++r) {
    const float ry = y + float(r) * (row_h + 3);
    dl->AddText(ImVec2(p0.x, ry + (row_h - lh) / 2), rank_colour(r), numbered("r", r).c_str());
    dl->AddRectFilled(ImVec2(plot_x0, ry), ImVec2(x_of(v.seconds), ry + row_h), kLaneBg);
    for (int s = 0; s < P; ++s) {
      const RingStepView& step = v.steps[s];
      const RankStepTime& t = step.ranks[r];
      const float xs = x_of(step.start_seconds), xw = x_of(step.start_seconds + t.work_seconds),
                  xe = x_of(step.start_seconds + step.seconds);
      const int origin = ring.steps[s][r].kv_origin;
      if (xw > xs) dl->AddRectFilled(ImVec2(xs, ry), ImVec2(std::max(xw, xs + 1), ry + row_h), rank_colour(origin));
      hatch(dl, ImVec2(xw, ry), ImVec2(xe, ry + row_h));
      if (t.transfer_seconds > 0) {
        const float xt = x_of(step.start_seconds + t.transfer_seconds);
        dl->AddLine(ImVec2(xs, ry + row_h - 2), ImVec2(std::max(xt, xs + 1), ry + row_h - 2), kLink, 2.f);
      }
      dl->AddLine(ImVec2(xe, ry), ImVec2(xe, ry + row_h), IM_COL32(14, 15, 18, 255));  // step boundary
    }
  }
  const float rows_y1 = y + float(P) * (row_h + 3) - 3;
  // Now: the transport's position; what is still to come is dimmed.
  const RingStepView& cur = v.steps[now.step];
  const float xc = x_of(cur.start_seconds + now.progress * cur.seconds);
  dl->AddRectFilled(ImVec2(xc, rows_y0), ImVec2(x_of(v.seconds), rows_y1), kFuture);
  dl->AddLine(ImVec2(xc, rows_y0 - 2), ImVec2(xc, rows_y1 + 2), kCursor, 2.f);
  y = rows_y1 + 4;
  const std::string end = ms(v.seconds);  // where this layout's ring ends on the shared scale
  const float end_w = ImGui::CalcTextSize(end.c_str()).x;
  dl->AddText(ImVec2(plot_x0, y), kDim, "0");
  dl->AddText(ImVec2(std::max(plot_x0 + 20, x_of(v.seconds) - end_w), y), kText, end.c_str());
  y += lh + 2;
  std::string work = "work per rank:";
  for (int r = 0; r < P; ++r) work += (r ? ", " : " ") + ms(v.work_per_rank[r]);
  dl->PushClipRect(ImVec2(p0.x, y), ImVec2(x1, y + lh + 2), true);
  dl->AddText(ImVec2(p0.x, y), kDim, work.c_str());
  dl->PopClipRect();
}

// A legend: items (a swatch and its text) laid left to right from the cursor, wrapping at the panel's edge; the
// cursor moves below the last row when it goes.
class LegendRow {
 public:
  explicit LegendRow(ImDrawList* dl)
      : dl_(dl), lh_(ImGui::GetTextLineHeight()), p_(ImGui::GetCursorScreenPos()),
        x_end_(p_.x + ImGui::GetContentRegionAvail().x) {}
  ~LegendRow() { ImGui::Dummy(ImVec2(x_end_ - ImGui::GetCursorScreenPos().x, p_.y + lh_ + 4 - ImGui::GetCursorScreenPos().y)); }
  LegendRow(const LegendRow&) = delete;
  LegendRow& operator=(const LegendRow&) = delete;

  // swatch(a, b) draws in the box from a to b, 20 px wide and a line high.
  template <class Swatch>
  void item(const char* text, Swatch&& swatch) {
    const float w = 26 + ImGui::CalcTextSize(text).x + 16;
    if (p_.x + w > x_end_) p_ = ImVec2(ImGui::GetCursorScreenPos().x, p_.y + lh_ + 4);
    swatch(ImVec2(p_.x, p_.y + 2), ImVec2(p_.x + 20, p_.y + lh_ - 2));
    dl_->AddText(ImVec2(p_.x + 26, p_.y), kText, text);
    p_.x += w;
  }

 private:
  ImDrawList* dl_;
  float lh_;
  ImVec2 p_;
  float x_end_;
};

void legend(ImDrawList* dl, const RingSettings& settings) {
  LegendRow row(dl);
  const auto item = [&](const char* text, auto&& swatch) { row.item(text, swatch); };
  item("work on the K/V share of that colour", [&](ImVec2 a, ImVec2 b) {
    for (int r = 0; r < 4; ++r)
      dl->AddRectFilled(ImVec2(a.x + float(r) * 5, a.y), ImVec2(a.x + float(r + 1) * 5, b.y), rank_colour(r));
  });
  item("idle: waiting for the slowest rank (or the link)", [&](ImVec2 a, ImVec2 b) {
    dl->AddRectFilled(a, b, kLaneBg);
    hatch(dl, a, b);
  });
  item(settings.pass == Pass::Backward ? "link: K/V and dK/dV partials to the next rank (model)"
                                       : "link: the K/V share to the next rank (model)",
       [&](ImVec2 a, ImVec2 b) { dl->AddLine(ImVec2(a.x, b.y - 2), ImVec2(b.x, b.y - 2), kLink, 2.f); });
  item("pairs: full", [&](ImVec2 a, ImVec2) { dl->AddRectFilled(a, ImVec2(a.x + 10, a.y + 10), kVisible); });
  item("diagonal", [&](ImVec2 a, ImVec2) {
    dl->AddRectFilled(a, ImVec2(a.x + 10, a.y + 10), rgb(palette::kSkipped));
    dl->AddTriangleFilled(a, ImVec2(a.x, a.y + 10), ImVec2(a.x + 10, a.y + 10), kVisible);
  });
  item("skipped (causal mask)", [&](ImVec2 a, ImVec2) {
    dl->AddRectFilled(a, ImVec2(a.x + 10, a.y + 10), rgb(palette::kSkipped));
    dl->AddRect(a, ImVec2(a.x + 10, a.y + 10), kBoxEdge);
  });
}

// --- A measured ring timeline beside the model (ring_view.hpp: RingTimelineView).

constexpr ImU32 kMerge = IM_COL32(210, 210, 240, 255);
constexpr ImU32 kExposed = IM_COL32(255, 90, 80, 255);
constexpr ImU32 kStepLine = IM_COL32(255, 214, 120, 110);
constexpr ImU32 kGrid = IM_COL32(60, 64, 74, 255);
constexpr float kLaneLabel = 92.f;  // "r0 compute" left of each lane

void timeline_controls(PanelState& ps, AppState& st) {
  RingSettings r = st.scenario.ring;
  ImGui::SetNextItemWidth(std::max(160.f, ImGui::GetContentRegionAvail().x - 470));
  const bool changed = file_row(ps, r, "a ring timeline (Trace Event JSON) or measured times", "model only");
  ImGui::SameLine();
  ImGui::Checkbox("model at the measured rates", &ps.measured_rates);
  if (changed) st.scenario.ring = st.edit.ring = r;
}

std::string percent(double f) {
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", 100 * f);
  return b;
}

std::string whole(double x) {  // "148"
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", x);
  return b;
}

// One Gantt: a title line, then per rank its compute lane and its link lane, on [0, t_max] over [x0, x0 + w).
// Returns the bottom. `hover` gets the bar under the mouse.
float draw_gantt(ImDrawList* dl, const RingGantt& g, int ranks, float x0, float y, float w, float lane_h, double t_max,
                 const RingBar** hover) {
  const float lh = ImGui::GetTextLineHeight();
  const float plot_x0 = x0 + kLaneLabel, plot_w = w - kLaneLabel;
  const auto x_of = [&](double t) { return plot_x0 + float(t / t_max) * plot_w; };
  dl->AddText(ImVec2(x0, y), kTitle, g.title.c_str());
  y += lh + 1;
  // Step labels, each centred over its step.
  for (std::size_t s = 0; s < g.step_begin_seconds.size(); ++s) {
    const std::string label = numbered("s", int(s));
    const float xa = x_of(g.step_begin_seconds[s]), xb = x_of(g.step_end_seconds[s]);
    const float tw = ImGui::CalcTextSize(label.c_str()).x;
    if (xb - xa > tw + 2) dl->AddText(ImVec2((xa + xb - tw) / 2, y), kDim, label.c_str());
  }
  y += lh + 2;
  const float top = y;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  for (int r = 0; r < ranks; ++r)
    for (int lane = 0; lane < 2; ++lane) {
      const float ly = y + float(2 * r + lane) * (lane_h + 2) + float(r) * 5;
      const float ly1 = ly + lane_h;
      dl->AddText(ImVec2(x0, ly + (lane_h - lh) / 2), lane == 0 ? rank_colour(r) : kDim,
                  lane == 0 ? numbered("r", r).append(" compute").c_str() : "   link");
      dl->ChannelsSetCurrent(0);  // under the time grid (draw_timeline splits the list in three)
      dl->AddRectFilled(ImVec2(plot_x0, ly), ImVec2(plot_x0 + plot_w, ly1), kLaneBg);
      dl->ChannelsSetCurrent(2);
      for (const RingBar& b : g.bars) {
        if (b.rank != r || b.lane != lane) continue;
        const float xb = x_of(b.begin_seconds), xe = std::max(x_of(b.end_seconds), xb + 1);
        switch (b.kind) {
          case RingBarKind::Compute: dl->AddRectFilled(ImVec2(xb, ly), ImVec2(xe, ly1), rank_colour(b.share)); break;
          case RingBarKind::Merge: dl->AddRectFilled(ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2), kMerge); break;
          case RingBarKind::KV:
            dl->AddRectFilled(ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2), rank_colour(b.share, 150));
            dl->AddRect(ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2), rank_colour(b.share));
            break;
          case RingBarKind::Partials:
            dl->AddRectFilled(ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2), rank_colour(b.share, 60));
            hatch(dl, ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2));
            dl->AddRect(ImVec2(xb, ly + 2), ImVec2(xe, ly1 - 2), rank_colour(b.share));
            break;
        }
        for (const auto& [eb, ee] : b.exposed)  // the ring waited on the link here
          dl->AddRectFilled(ImVec2(x_of(eb), ly1 - 4), ImVec2(std::max(x_of(ee), x_of(eb) + 1), ly1), kExposed);
      }
      if (mouse.y >= ly && mouse.y < ly1 && mouse.x >= plot_x0 && mouse.x <= plot_x0 + plot_w) {
        const double at = double(mouse.x - plot_x0) / plot_w * t_max, tol = 3.0 / plot_w * t_max;
        const int k = bar_at(g, r, lane, at, tol);
        if (k >= 0) *hover = &g.bars[std::size_t(k)];
      }
    }
  const float bottom = y + float(2 * ranks) * (lane_h + 2) + float(ranks - 1) * 5;
  for (std::size_t s = 0; s < g.step_begin_seconds.size(); ++s) {
    const float xa = x_of(g.step_begin_seconds[s]);
    dl->AddLine(ImVec2(xa, top - 2), ImVec2(xa, bottom), kStepLine, 1.5f);
  }
  if (!g.step_end_seconds.empty()) {
    const float xe = x_of(g.step_end_seconds.back());
    dl->AddLine(ImVec2(xe, top - 2), ImVec2(xe, bottom), kStepLine, 1.5f);
  }
  return bottom;
}

void timeline_legend(ImDrawList* dl) {
  LegendRow row(dl);
  const auto item = [&](const char* text, auto&& swatch) { row.item(text, swatch); };
  item("compute on the K/V share of that colour", [&](ImVec2 a, ImVec2 b) {
    for (int r = 0; r < 4; ++r)
      dl->AddRectFilled(ImVec2(a.x + float(r) * 5, a.y), ImVec2(a.x + float(r + 1) * 5, b.y), rank_colour(r));
  });
  item("merge / add", [&](ImVec2 a, ImVec2 b) { dl->AddRectFilled(a, b, kMerge); });
  item("K/V hop (the share it sends on)", [&](ImVec2 a, ImVec2 b) {
    dl->AddRectFilled(a, b, rank_colour(0, 150));
    dl->AddRect(a, b, rank_colour(0));
  });
  item("dK/dV partials hop", [&](ImVec2 a, ImVec2 b) {
    dl->AddRectFilled(a, b, rank_colour(0, 60));
    hatch(dl, a, b);
    dl->AddRect(a, b, rank_colour(0));
  });
  item("not hidden: the rank's compute stream idle", [&](ImVec2 a, ImVec2 b) {
    dl->AddRectFilled(ImVec2(a.x, b.y - 4), b, kExposed);
  });
  item("step starts", [&](ImVec2 a, ImVec2 b) {
    dl->AddLine(ImVec2((a.x + b.x) / 2, a.y), ImVec2((a.x + b.x) / 2, b.y), kStepLine, 1.5f);
  });
}

void step_table(const RingTimelineView& v) {
  const int P = v.measured.run.ranks;
  if (!ImGui::BeginTable("##ring_steps", 7, ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp))
    return;
  for (const char* h : {"step", "model, assumed rates", "model, measured rates", "measured (start to next start)",
                        "measured-rate model vs measured", "slowest compute", "transfer hidden behind compute"})
    ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  const auto cell = [](const std::string& text) {
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(text.c_str());
  };
  const auto signed_percent = [](double f) {
    char b[16];
    std::snprintf(b, sizeof b, "%+.0f%%", 100 * f);
    return std::string(b);
  };
  for (int s = 0; s < P; ++s) {
    const RingStepCompare& c = v.steps[std::size_t(s)];
    ImGui::TableNextRow();
    cell(numbered("s", s));
    cell(ms(c.model_seconds));
    cell(ms(c.replay_seconds));
    cell(ms(c.measured_seconds));
    cell(signed_percent(c.replay_error()));
    cell(ms(c.slowest_compute_seconds) + " (" + numbered("r", c.slowest_rank) + ")");
    cell(c.hidden_fraction ? percent(*c.hidden_fraction) : std::string("no transfer"));
  }
  ImGui::TableNextRow();
  cell("ring");
  cell(ms(v.assumed_cost.seconds));
  cell(ms(v.replay_cost.seconds));
  cell(ms(v.measured.seconds) + " (first stamp to last)");
  cell(signed_percent(v.measured.seconds > 0 ? v.replay_cost.seconds / v.measured.seconds - 1 : 0));
  cell("");
  cell(v.measured.hidden_fraction ? percent(*v.measured.hidden_fraction) + " of all transfer time" : std::string("-"));
  ImGui::EndTable();
}

void draw_timeline(PanelState& ps, AppState& st) {
  const std::string& path = st.scenario.ring.timeline;
  if (ps.timeline_shown != path) {
    ps.timeline = load_ring_timeline(path);
    ps.timeline_shown = path;
    std::snprintf(ps.measured_path, sizeof ps.measured_path, "%s", path.c_str());
  }
  timeline_controls(ps, st);
  if (!ps.timeline.view) {
    ImGui::PushStyleColor(ImGuiCol_Text, kError);
    ImGui::TextWrapped("%s", ps.timeline.error.c_str());
    ImGui::PopStyleColor();
    return;
  }
  const RingTimelineView& v = *ps.timeline.view;
  const RingMeasurement& m = v.measured;
  ImGui::PushStyleColor(ImGuiCol_Text, kTitle);
  ImGui::TextWrapped("%s  \xC2\xB7  %s", v.label.empty() ? "(no label)" : v.label.c_str(), v.device.c_str());
  ImGui::PopStyleColor();
  ImGui::TextUnformatted(v.problem.c_str());
  std::string link = "no link (one rank)";
  if (m.median_bytes_per_second)
    link = "link " + whole(*m.median_bytes_per_second / 1e9) + " GB/s median, " +
           whole(*m.best_bytes_per_second / 1e9) + " GB/s best over " + std::to_string(m.transfers.size()) +
           " transfers (bytes / span, waits included)";
  ImGui::Text("measured: ring %s; compute %s TFLOP/s per rank (the schedule's FLOPs / compute time); %s; %s of the "
              "transfer time hidden behind compute",
              ms(m.seconds).c_str(), whole(m.flops_per_second / 1e12).c_str(), link.c_str(),
              m.hidden_fraction ? percent(*m.hidden_fraction).c_str() : "none");
  ImDrawList* dl = ImGui::GetWindowDrawList();
  timeline_legend(dl);

  const int P = m.run.ranks;
  const float lh = ImGui::GetTextLineHeight();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float table_h = float(P + 2) * (lh + 6) + 8;
  const float axis_h = lh + 4;
  const float gantt_fixed = 2 * (2 * lh + 3) + 2 * (float(2 * P) * 2 + float(P - 1) * 5) + 12;
  const float lane_h = std::clamp((avail.y - table_h - axis_h - gantt_fixed) / float(4 * P), 8.f, 26.f);
  const double t_max = v.seconds_max * 1.01;
  const float plot_x0 = p0.x + kLaneLabel, plot_w = avail.x - kLaneLabel;

  // The time axis, shared by the model and the run.
  const TimeWindow window{.begin_ns = 0, .end_ns = t_max * 1e9};
  const std::vector<double> ticks = time_ticks(window, std::max(2, int(plot_w / 110)));
  const double tick_step = ticks.size() > 1 ? ticks[1] - ticks[0] : window.width();
  float y = p0.y;
  const RingBar* hover = nullptr;
  const RingGantt& model = ps.measured_rates ? v.model_replayed : v.model_assumed;
  dl->ChannelsSplit(3);  // lanes (0), the time grid (1), bars and text (2)
  dl->ChannelsSetCurrent(2);
  const float y_mid = draw_gantt(dl, model, P, p0.x, y + axis_h, avail.x, lane_h, t_max, &hover) + 10;
  const float y_end = draw_gantt(dl, v.gantt, P, p0.x, y_mid, avail.x, lane_h, t_max, &hover);
  dl->ChannelsSetCurrent(1);
  for (double t : ticks) {
    const float x = plot_x0 + float(t / window.end_ns) * plot_w;
    dl->AddLine(ImVec2(x, y + axis_h - 3), ImVec2(x, y_end), kGrid);
    const std::string label = format_us(t, tick_step);
    const float tw = ImGui::CalcTextSize(label.c_str()).x;
    dl->AddText(ImVec2(std::min(x - tw / 2, plot_x0 + plot_w - tw), y), kDim, label.c_str());
  }
  dl->ChannelsMerge();
  ImGui::Dummy(ImVec2(avail.x, y_end - p0.y + 8));
  if (hover) {
    ImGui::BeginTooltip();
    const char* kind = hover->kind == RingBarKind::Compute ? "compute"
                       : hover->kind == RingBarKind::Merge ? "merge / add"
                       : hover->kind == RingBarKind::KV    ? "K/V hop"
                                                           : "dK/dV partials hop";
    ImGui::Text("%s, rank %d, step s%d, share of rank %d", kind, hover->rank, hover->step, hover->share);
    ImGui::Text("from %s for %s", ms(hover->begin_seconds).c_str(), ms(hover->end_seconds - hover->begin_seconds).c_str());
    if (hover->lane == 1) {
      double exposed = 0;
      for (const auto& [b, e] : hover->exposed) exposed += e - b;
      const double d = hover->end_seconds - hover->begin_seconds;
      ImGui::Text("hidden behind compute: %s", percent(d > 0 ? 1 - exposed / d : 1).c_str());
    }
    ImGui::EndTooltip();
  }
  step_table(v);
}

}  // namespace

void draw_ring(AppState& st) {
  PanelState& ps = state();
  if (!st.scenario.ring.timeline.empty()) {
    draw_timeline(ps, st);
    return;
  }
  controls(ps, st);
  if (!ps.built || ps.shown != st.scenario.ring) rebuild(ps, st);
  const RingSettings& settings = st.scenario.ring;
  const RingPosition now =
      st.replay ? ring_position(st.replay->step(), st.replay->size(), settings.ranks) : RingPosition{};

  ImGui::Text("P = %d ranks, N = %d tokens (%d per rank), batch %d, %d heads, d = %d, %s, %s pass;  now: step s%d of "
              "s0-s%d%s",
              settings.ranks, settings.seq, settings.seq / settings.ranks, settings.batch, settings.heads,
              settings.head_dim, settings.causal ? "causal" : "no mask",
              settings.pass == Pass::Forward ? "forward" : "backward", now.step, settings.ranks - 1,
              hop_fraction(now.progress) > 0 ? ", the shares in flight to the next rank" : "");
  const RingMachine machine;
  ImGui::TextDisabled("model times: ring_cost at %g TFLOP/s per rank and %g GB/s per link (assumed rates, not "
                      "measurements); a step lasts as long as its slowest compute or link",
                      machine.flops_per_second / 1e12, machine.link_bytes_per_second / 1e9);
  if (!ps.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, kError);
    ImGui::TextWrapped("%s", ps.error.c_str());
    ImGui::PopStyleColor();
  }
  if (ps.columns.empty()) return;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  legend(dl, settings);

  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float n = float(ps.columns.size());
  const float col_w = (avail.x - kColumnGap * (n - 1)) / n;
  double shared_max = 0;
  for (const RingColumn& c : ps.columns)
    if (c.view) shared_max = std::max(shared_max, c.view->seconds);
  for (std::size_t k = 0; k < ps.columns.size(); ++k) {
    const RingColumn& c = ps.columns[k];
    const double t_max = ps.shared_scale || !c.view ? shared_max : c.view->seconds;
    draw_column(dl, c, ImVec2(p0.x + float(k) * (col_w + kColumnGap), p0.y), ImVec2(col_w, avail.y - 4), now,
                t_max > 0 ? t_max : 1.0);
  }
  ImGui::Dummy(avail);
}

}  // namespace flashlab::viz
