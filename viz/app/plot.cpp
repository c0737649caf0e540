#include "plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>

namespace flashlab::viz {

namespace {

struct View {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // in axis space (log10 of the value on log axes)
  bool user = false;                      // zoomed or panned: stop following the data
};
std::unordered_map<ImGuiID, View>& views() {
  static std::unordered_map<ImGuiID, View> v;
  return v;
}

constexpr float kMarginLeft = 58.f, kMarginRight = 10.f, kMarginTop = 22.f, kMarginBottom = 34.f;
constexpr float kHoverRadius = 12.f;
constexpr float kZoomPerNotch = 0.85f;
constexpr ImU32 kFrame = IM_COL32(70, 74, 84, 255);
constexpr ImU32 kGrid = IM_COL32(70, 74, 84, 255);
constexpr ImU32 kText = IM_COL32(210, 212, 220, 255);

double to_axis(double v, bool log) { return log ? std::log10(v) : v; }
double from_axis(double a, bool log) { return log ? std::pow(10.0, a) : a; }
bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

std::string default_format(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// Tick positions in axis space: decades (and 2, 5 within a decade when zoomed in) on log axes,
// 1-2-5 steps on linear ones.
std::vector<double> ticks(double a0, double a1, bool log, double min_step = 0) {
  std::vector<double> t;
  if (log) {
    const bool fine = a1 - a0 < 2.5;
    for (double d = std::floor(a0); d <= a1 + 1e-9; d += 1.0) {
      for (double m : {1.0, 2.0, 5.0}) {
        if (m != 1.0 && !fine) continue;
        const double a = d + std::log10(m);
        if (a >= a0 - 1e-9 && a <= a1 + 1e-9) t.push_back(a);
      }
    }
    if (t.size() > 12) {  // many decades: every other one
      std::vector<double> s;
      for (std::size_t k = 0; k < t.size(); k += 2) s.push_back(t[k]);
      t = s;
    }
    return t;
  }
  const double range = a1 - a0;
  if (!(range > 0)) return t;
  const double raw = range / 5.0, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = std::max(min_step, raw / mag < 2 ? mag : raw / mag < 5 ? 2 * mag : 5 * mag);
  for (double a = std::ceil(a0 / step) * step; a <= a1 + 1e-9 * range; a += step) t.push_back(a);
  return t;
}

}  // namespace

ImU32 to_imu32(unsigned char r, unsigned char g, unsigned char b, unsigned char a) { return IM_COL32(r, g, b, a); }

void plot(const PlotSpec& spec, const std::vector<PlotSeries>& series, ImVec2 size) {
  ImGui::PushID(spec.id);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = avail.x;
  if (size.y <= 0) size.y = avail.y;
  size.x = std::max(size.x, 120.f);
  size.y = std::max(size.y, 90.f);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("##plot", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImGuiID id = ImGui::GetID("##plot");
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const auto fx = spec.format_x ? spec.format_x : default_format;
  const auto fy = spec.format_y ? spec.format_y : default_format;

  // Data range, in axis space.
  double dx0 = std::numeric_limits<double>::infinity(), dx1 = -dx0, dy0 = dx0, dy1 = -dx0;
  for (const PlotSeries& s : series)
    for (std::size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) {
      if (!usable(s.x[k], spec.log_x) || !usable(s.y[k], spec.log_y)) continue;
      const double ax = to_axis(s.x[k], spec.log_x), ay = to_axis(s.y[k], spec.log_y);
      dx0 = std::min(dx0, ax), dx1 = std::max(dx1, ax), dy0 = std::min(dy0, ay), dy1 = std::max(dy1, ay);
    }
  const bool has_data = dx0 <= dx1;
  View fit;
  if (has_data) {
    const double px = std::max(dx1 - dx0, spec.log_x ? 0.5 : 1e-9) * 0.05;
    const double py = std::max(dy1 - dy0, spec.log_y ? 0.5 : std::max(1e-9, std::fabs(dy1) * 0.1)) * 0.08;
    fit = {dx0 - px, dx1 + px, dy0 - py, dy1 + py};
  }
  View& v = views()[id];
  if (hovered && ImGui::IsMouseDoubleClicked(0)) v.user = false;
  if (!v.user) v = fit;

  const ImVec2 a0(p0.x + kMarginLeft, p0.y + kMarginTop), a1(p0.x + size.x - kMarginRight, p0.y + size.y - kMarginBottom);
  const float aw = a1.x - a0.x, ah = a1.y - a0.y;
  auto sx = [&](double ax) { return a0.x + float((ax - v.x0) / (v.x1 - v.x0)) * aw; };
  auto sy = [&](double ay) { return a1.y - float((ay - v.y0) / (v.y1 - v.y0)) * ah; };

  // Zoom around the cursor with the wheel; pan by dragging.
  const ImGuiIO& io = ImGui::GetIO();
  if (hovered && io.MouseWheel != 0) {
    const double f = std::pow(kZoomPerNotch, io.MouseWheel);
    const double cx = v.x0 + (io.MousePos.x - a0.x) / aw * (v.x1 - v.x0);
    const double cy = v.y0 + (a1.y - io.MousePos.y) / ah * (v.y1 - v.y0);
    v = {cx + (v.x0 - cx) * f, cx + (v.x1 - cx) * f, cy + (v.y0 - cy) * f, cy + (v.y1 - cy) * f, true};
  }
  if (ImGui::IsItemActive() && ImGui::IsMouseDragging(0)) {
    const double ddx = io.MouseDelta.x / aw * (v.x1 - v.x0), ddy = io.MouseDelta.y / ah * (v.y1 - v.y0);
    v.x0 -= ddx, v.x1 -= ddx, v.y0 += ddy, v.y1 += ddy;
    v.user = true;
  }

  dl->AddRect(a0, a1, kFrame);  // an outline: a filled frame would cost the software renderer a full layer
  if (!spec.title.empty()) {  // clipped to the plot: a long title must not run into the next one
    dl->PushClipRect(ImVec2(p0.x, p0.y), ImVec2(p0.x + size.x, p0.y + kMarginTop), true);
    dl->AddText(ImVec2(p0.x + 4, p0.y + 2), kText, spec.title.c_str());
    dl->PopClipRect();
  }
  if (!has_data) {
    dl->AddText(ImVec2(a0.x + 8, a0.y + 8), kText, "no data yet");
    ImGui::PopID();
    return;
  }

  // Grid, ticks, labels.
  float label_end = -1e9f;  // labels that would overlap the previous one are left out
  for (double t : ticks(v.x0, v.x1, spec.log_x, spec.integer_x ? 1.0 : 0.0)) {
    const float x = sx(t);
    dl->AddLine(ImVec2(x, a0.y), ImVec2(x, a1.y), kGrid);
    const std::string label = fx(from_axis(t, spec.log_x));
    const float w = ImGui::CalcTextSize(label.c_str()).x;
    if (x - w / 2 < label_end + 6) continue;
    dl->AddText(ImVec2(x - w / 2, a1.y + 2), kText, label.c_str());
    label_end = x + w / 2;
  }
  float label_top = 1e9f;
  for (double t : ticks(v.y0, v.y1, spec.log_y)) {
    const float y = sy(t);
    dl->AddLine(ImVec2(a0.x, y), ImVec2(a1.x, y), kGrid);
    const std::string label = fy(from_axis(t, spec.log_y));
    const ImVec2 ts = ImGui::CalcTextSize(label.c_str());
    if (y + ts.y / 2 > label_top - 2) continue;
    dl->AddText(ImVec2(a0.x - ts.x - 4, y - ts.y / 2), kText, label.c_str());
    label_top = y - ts.y / 2;
  }
  if (!spec.x_label.empty()) {
    const float w = ImGui::CalcTextSize(spec.x_label.c_str()).x;
    dl->AddText(ImVec2((a0.x + a1.x - w) / 2, a1.y + 17), kText, spec.x_label.c_str());
  }
  // Series.
  dl->PushClipRect(a0, a1, true);
  const PlotSeries* near_series = nullptr;
  std::size_t near_k = 0;
  float near_d2 = kHoverRadius * kHoverRadius;
  std::vector<ImVec2> pts;
  for (const PlotSeries& s : series) {
    pts.clear();
    for (std::size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) {
      if (!usable(s.x[k], spec.log_x) || !usable(s.y[k], spec.log_y)) continue;
      const ImVec2 p(sx(to_axis(s.x[k], spec.log_x)), sy(to_axis(s.y[k], spec.log_y)));
      pts.push_back(p);
      if (hovered && s.markers) {
        const float ddx = p.x - io.MousePos.x, ddy = p.y - io.MousePos.y;
        if (ddx * ddx + ddy * ddy < near_d2) near_d2 = ddx * ddx + ddy * ddy, near_series = &s, near_k = k;
      }
    }
    if (s.line && pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), s.colour, 0, s.thickness);
    if (s.markers)
      for (const ImVec2& p : pts) s.line ? dl->AddCircleFilled(p, 2.5f, s.colour, 6) : dl->AddCircle(p, 4.f, s.colour, 8, 1.5f);
  }
  dl->PopClipRect();

  // Legend inside the plot area, in the corner that hides the fewest points.
  // At most half the plot's height of entries; the rest are counted in a last line.
  const float lh = ImGui::GetTextLineHeight();
  const int fits = std::max(1, int(ah * 0.5f / lh));
  float lw = 0;
  int named = 0, all_named = 0;
  for (const PlotSeries& s : series) {
    if (s.name.empty()) continue;
    ++all_named;
    if (named < fits) lw = std::max(lw, ImGui::CalcTextSize(s.name.c_str()).x), ++named;
  }
  const int left_out = all_named - named;
  char more_text[32];
  std::snprintf(more_text, sizeof more_text, "+%d more", left_out);
  const std::string more = more_text;
  if (left_out > 0) lw = std::max(lw, ImGui::CalcTextSize(more.c_str()).x), ++named;
  lw = std::min(lw, aw - 40);
  if (named) {
    const ImVec2 box(lw + 30, lh * float(named) + 4);
    const ImVec2 corners[] = {ImVec2(a0.x + 4, a0.y + 4), ImVec2(a1.x - box.x - 4, a0.y + 4),
                              ImVec2(a1.x - box.x - 4, a1.y - box.y - 4), ImVec2(a0.x + 4, a1.y - box.y - 4)};
    int best = 0, best_hidden = -1;
    for (int c = 0; c < 4; ++c) {
      int hidden = 0;
      for (const PlotSeries& s : series)
        for (std::size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) {
          if (!usable(s.x[k], spec.log_x) || !usable(s.y[k], spec.log_y)) continue;
          const float px = sx(to_axis(s.x[k], spec.log_x)), py = sy(to_axis(s.y[k], spec.log_y));
          hidden += px >= corners[c].x && px <= corners[c].x + box.x && py >= corners[c].y && py <= corners[c].y + box.y;
        }
      if (best_hidden < 0 || hidden < best_hidden) best = c, best_hidden = hidden;
    }
    const ImVec2 o = corners[best];
    dl->AddRectFilled(o, ImVec2(o.x + box.x, o.y + box.y), IM_COL32(20, 22, 26, 220));
    dl->PushClipRect(a0, a1, true);
    float ly = o.y + 2;
    int drawn = 0;
    for (const PlotSeries& s : series) {
      if (s.name.empty()) continue;
      if (left_out > 0 && drawn++ == named - 1) break;
      const float cy = ly + lh / 2;
      if (s.line) dl->AddLine(ImVec2(o.x + 4, cy), ImVec2(o.x + 18, cy), s.colour, 2.f);
      else dl->AddCircle(ImVec2(o.x + 11, cy), 4.f, s.colour, 0, 2.f);
      dl->AddText(ImVec2(o.x + 24, ly), kText, s.name.c_str());
      ly += lh;
    }
    if (left_out > 0) dl->AddText(ImVec2(o.x + 24, ly), kText, more.c_str());
    dl->PopClipRect();
  }

  if (near_series) {
    const double x = near_series->x[near_k], y = near_series->y[near_k];
    dl->AddCircle(ImVec2(sx(to_axis(x, spec.log_x)), sy(to_axis(y, spec.log_y))), 6.f, IM_COL32(255, 255, 255, 255), 0, 1.5f);
    ImGui::SetTooltip("%s\n%s: %s\n%s: %s", near_series->name.c_str(), spec.x_label.c_str(), fx(x).c_str(),
                      spec.y_label.c_str(), fy(y).c_str());
  }
  ImGui::PopID();
}

}  // namespace flashlab::viz
