// Pipeline: what each warpgroup of a warp-specialized kernel did over time, from a Chrome Trace
// Event file (`flashlab bench --timeline FILE.json`, or the synthetic examples in viz/timelines/), or
// what each rank of a ring did on its compute and communication streams (a ring timeline; the Ring
// panel sets it beside the model). One lane per (block, warpgroup) or (rank, stream); spans coloured by kind, instants as ticks; a second file stacked
// below for comparison. Mouse wheel zooms around the cursor, dragging pans, double-click or "fit"
// shows everything; hovering names the event. A bad file shows its one sentence instead.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/palette.hpp"
#include "app/panels.hpp"
#include "logic/pipeline_view.hpp"

namespace flashlab::viz {

namespace {

constexpr float kLabelWidth = 190.f;  // lane names, left of the plot
constexpr float kAxisHeight = 20.f;
constexpr float kZoomPerNotch = 0.8f;
constexpr ImU32 kText = IM_COL32(215, 218, 226, 255);
constexpr ImU32 kDim = IM_COL32(150, 155, 168, 255);
constexpr ImU32 kGrid = IM_COL32(60, 64, 74, 255);
constexpr ImU32 kLaneBg = IM_COL32(32, 34, 41, 255);
constexpr ImU32 kTitle = IM_COL32(255, 214, 120, 255);
constexpr ImU32 kError = IM_COL32(255, 110, 100, 255);

struct PanelState {
  std::string loaded_a, loaded_b;  // the paths now loaded
  bool loaded = false;
  LoadedTimeline a, b;
  char edit_a[512] = "", edit_b[512] = "";
  TimeWindow window;
  bool user_window = false;  // zoomed or panned: keep the window when the panel resizes
};
PanelState& state() {
  static PanelState s;
  return s;
}

ImU32 colour(PipelineEvent e, int alpha = 255) {
  const palette::Rgb c = palette::kSeries[palette_index(e)];
  return IM_COL32(c.r, c.g, c.b, alpha);
}

void load(PanelState& ps, const std::string& a, const std::string& b) {
  ps.a = a.empty() ? LoadedTimeline{} : load_timeline(a);
  ps.b = b.empty() ? LoadedTimeline{} : load_timeline(b);
  ps.loaded_a = a, ps.loaded_b = b, ps.loaded = true;
  std::snprintf(ps.edit_a, sizeof ps.edit_a, "%s", a.c_str());
  std::snprintf(ps.edit_b, sizeof ps.edit_b, "%s", b.c_str());
  ps.user_window = false;
}

// The kinds the loaded timelines hold (a Hopper kernel's, a ring's, or both).
void legend(ImDrawList* dl, const std::vector<const Timeline*>& ts) {
  const float lh = ImGui::GetTextLineHeight();
  ImVec2 p = ImGui::GetCursorScreenPos();
  const float x_end = p.x + ImGui::GetContentRegionAvail().x;
  const std::vector<PipelineEvent> kinds = kinds_in(ts);
  for (const PipelineEvent e : kinds) {
    const char* name = to_string(e);
    const float w = 22 + ImGui::CalcTextSize(name).x + 14;
    if (p.x + w > x_end) p = ImVec2(ImGui::GetCursorScreenPos().x, p.y + lh + 4);
    if (is_span(e)) dl->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + 16, p.y + lh - 2), colour(e));
    else {
      dl->AddLine(ImVec2(p.x + 8, p.y), ImVec2(p.x + 8, p.y + lh), colour(e), 2.f);
      dl->AddTriangleFilled(ImVec2(p.x + 3, p.y), ImVec2(p.x + 13, p.y), ImVec2(p.x + 8, p.y + 6), colour(e));
    }
    dl->AddText(ImVec2(p.x + 22, p.y), kText, name);
    p.x += w;
  }
  if (std::find(kinds.begin(), kinds.end(), PipelineEvent::WgmmaIssue) != kinds.end()) {
    const char* band = "wgmma in flight (issue to wait)";
    dl->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + 16, p.y + lh - 2), colour(PipelineEvent::WgmmaIssue, 70));
    dl->AddText(ImVec2(p.x + 22, p.y), kText, band);
  }
  ImGui::Dummy(ImVec2(x_end - ImGui::GetCursorScreenPos().x, p.y + lh + 4 - ImGui::GetCursorScreenPos().y));
}

}  // namespace

void draw_pipeline(AppState& st) {
  PanelState& ps = state();
  if (!ps.loaded || ps.loaded_a != st.scenario.timeline || ps.loaded_b != st.scenario.timeline_compare)
    load(ps, st.scenario.timeline, st.scenario.timeline_compare);

  // Files: two paths and a load button; "fit" shows everything.
  const float field_w = std::max(120.f, (ImGui::GetContentRegionAvail().x - 170) / 2);
  ImGui::SetNextItemWidth(field_w);
  ImGui::InputTextWithHint("##a", "timeline (Trace Event JSON)", ps.edit_a, sizeof ps.edit_a);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(field_w);
  ImGui::InputTextWithHint("##b", "compare with (optional)", ps.edit_b, sizeof ps.edit_b);
  ImGui::SameLine();
  if (ImGui::Button("load")) {
    st.scenario.timeline = ps.edit_a, st.scenario.timeline_compare = ps.edit_b;
    st.edit.timeline = ps.edit_a, st.edit.timeline_compare = ps.edit_b;
    load(ps, ps.edit_a, ps.edit_b);
  }
  ImGui::SameLine();
  if (ImGui::Button("fit")) ps.user_window = false;

  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (const LoadedTimeline* l : {&ps.a, &ps.b})
    if (!l->error.empty()) {
      ImGui::PushStyleColor(ImGuiCol_Text, kError);
      ImGui::TextWrapped("%s", l->error.c_str());
      ImGui::PopStyleColor();
    }
  const std::vector<const Timeline*> ts = {ps.a.timeline ? &*ps.a.timeline : nullptr, ps.b.timeline ? &*ps.b.timeline : nullptr};
  if (!ts[0] && !ts[1]) {
    if (ps.a.error.empty() && ps.b.error.empty())
      ImGui::TextWrapped("No timeline loaded. `flashlab bench --variant cuda-fa3-ws --timeline run.json` writes one "
                         "(Chrome Trace Event Format, also opened by Perfetto); viz/timelines/ holds synthetic examples.");
    return;
  }
  legend(dl, ts);

  double data_end = 0;
  for (const Timeline* t : ts)
    if (t) data_end = std::max(data_end, double(t->end_ns() - t->start_ns()));
  if (!ps.user_window) ps.window = fit_all(data_end);

  // Geometry: lane names on the left, the time axis on top, lanes filling the rest.
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 size(std::max(avail.x, 300.f), std::max(avail.y, 120.f));
  const float plot_x0 = p0.x + kLabelWidth, plot_w = size.x - kLabelWidth - 6;
  const float lanes_y0 = p0.y + kAxisHeight;
  const LaneMetrics metrics = fit_lanes(ts, size.y - kAxisHeight - 4, 12, 44);
  const LaneLayout layout = layout_lanes(ts, metrics);

  ImGui::InvisibleButton("##pipeline", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImGuiIO& io = ImGui::GetIO();
  const bool over_plot = hovered && io.MousePos.x >= plot_x0 && io.MousePos.x <= plot_x0 + plot_w;
  if (over_plot && io.MouseWheel != 0) {
    const double at = t_of(ps.window, io.MousePos.x, plot_x0, plot_w);
    ps.window = zoom(ps.window, at, std::pow(kZoomPerNotch, io.MouseWheel), data_end);
    ps.user_window = true;
  }
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(0) && io.MouseDelta.x != 0) {
    ps.window = pan(ps.window, -double(io.MouseDelta.x) / plot_w * ps.window.width(), data_end);
    ps.user_window = true;
  }
  if (hovered && ImGui::IsMouseDoubleClicked(0)) ps.user_window = false;

  // Axis: ticks in microseconds from each timeline's first stamp.
  const int max_ticks = std::max(2, int(plot_w / 90));
  const std::vector<double> ticks = time_ticks(ps.window, max_ticks);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : ps.window.width();
  dl->PushClipRect(ImVec2(plot_x0 - 40, p0.y), ImVec2(plot_x0 + plot_w + 40, p0.y + size.y), true);
  for (double t : ticks) {
    const float x = x_of(ps.window, t, plot_x0, plot_w);
    dl->AddLine(ImVec2(x, lanes_y0 - 4), ImVec2(x, lanes_y0 + layout.height), kGrid);
    const std::string label = format_us(t, step);
    const float w = ImGui::CalcTextSize(label.c_str()).x;
    dl->AddText(ImVec2(x - w / 2, p0.y + 1), kDim, label.c_str());
  }
  dl->PopClipRect();

  // Group titles (label, variant, device) and lanes.
  for (const LaneGroup& g : layout.groups)
    dl->AddText(ImVec2(p0.x + 2, lanes_y0 + g.y0 + 1), kTitle, g.title.c_str());
  const float lh = ImGui::GetTextLineHeight();
  for (std::size_t k = 0; k < layout.lanes.size(); ++k) {
    const Lane& lane = layout.lanes[k];
    const float y0 = lanes_y0 + lane.y0, y1 = lanes_y0 + lane.y1;
    dl->AddRectFilled(ImVec2(plot_x0, y0), ImVec2(plot_x0 + plot_w, y1), kLaneBg);
    const bool first_of_block = k == 0 || layout.lanes[k - 1].block != lane.block || layout.lanes[k - 1].timeline != lane.timeline;
    const Timeline& t = *ts[std::size_t(lane.timeline)];
    const float ty = (y0 + y1 - lh) / 2;
    if (first_of_block) dl->AddText(ImVec2(p0.x + 10, ty), kText, block_name(t, lane.block).c_str());
    dl->AddText(ImVec2(p0.x + 72, ty), kDim, role_name(t, lane.warpgroup).c_str());
  }

  // Spans, then instants on top. Spans narrower than a pixel are drawn a pixel wide.
  dl->PushClipRect(ImVec2(plot_x0, lanes_y0), ImVec2(plot_x0 + plot_w, lanes_y0 + layout.height), true);
  for (int pass = 0; pass < 2; ++pass)
    for (const Lane& lane : layout.lanes) {
      const Timeline& t = *ts[std::size_t(lane.timeline)];
      const double t0 = double(t.start_ns());
      const float y0 = lanes_y0 + lane.y0, y1 = lanes_y0 + lane.y1, pad = std::min(3.f, (y1 - y0) * 0.12f);
      double wgmma_issued = -1;  // a faint band from each wgmma issue to its wait: the tensor cores at work
      for (const TimelineSpan& s : t.spans) {
        if (s.block != lane.block || s.warpgroup != lane.warpgroup) continue;
        if (pass == 0 && s.event == PipelineEvent::WgmmaIssue) wgmma_issued = double(s.begin_ns) - t0;
        if (pass == 0 && s.event == PipelineEvent::WgmmaWait && wgmma_issued >= 0) {
          const float xb = x_of(ps.window, wgmma_issued, plot_x0, plot_w), xe = x_of(ps.window, double(s.begin_ns) - t0, plot_x0, plot_w);
          dl->AddRectFilled(ImVec2(xb, y0 + pad), ImVec2(std::max(xe, xb + 1), y1 - pad), colour(PipelineEvent::WgmmaIssue, 70));
          wgmma_issued = -1;
        }
        if (is_span(s.event) != (pass == 0)) continue;
        const double b = double(s.begin_ns) - t0, e = double(s.end_ns) - t0;
        if (e < ps.window.begin_ns || b > ps.window.end_ns) continue;
        const float xb = x_of(ps.window, b, plot_x0, plot_w), xe = x_of(ps.window, e, plot_x0, plot_w);
        if (pass == 0) {
          // Barrier waits are thin: idle time, not work.
          const bool wait = s.event == PipelineEvent::BarrierWait;
          const float sy0 = wait ? (y0 + y1) / 2 - 2 : y0 + pad, sy1 = wait ? (y0 + y1) / 2 + 2 : y1 - pad;
          dl->AddRectFilled(ImVec2(xb, sy0), ImVec2(std::max(xe, xb + 1), sy1), colour(s.event));
        } else {
          dl->AddLine(ImVec2(xb, y0 + 1), ImVec2(xb, y1 - 1), colour(s.event), 2.f);
          dl->AddTriangleFilled(ImVec2(xb - 4, y0), ImVec2(xb + 4, y0), ImVec2(xb, y0 + 6), colour(s.event));
        }
      }
    }
  dl->PopClipRect();

  // Hover: the event under the mouse.
  if (over_plot && !ImGui::IsItemActive()) {
    if (const auto hit = hit_test(layout, ts, ps.window, io.MousePos.x - plot_x0, io.MousePos.y - lanes_y0, plot_w)) {
      const Timeline& t = *ts[std::size_t(hit->timeline)];
      ImGui::BeginTooltip();
      ImGui::TextUnformatted(hover_text(t, hit->span).c_str());
      ImGui::EndTooltip();
    }
  }
}

}  // namespace flashlab::viz
