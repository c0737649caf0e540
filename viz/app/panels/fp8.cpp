// FP8 error against outliers: how far emulated FP8 attention (cpu_reference/fp8.hpp) lands from attention in
// double as 4 channels of Q and K grow, without and with the Hadamard rotation of lesson 10, from the sweep that
// tools/fp8_error_study.cpp --sweep wrote to bench/results (logic/fp8_study.hpp). Left: the error of the scores
// tau Q K^T that the e4m3 Q and K stand for, the quantity the rotation acts on. Right: the error of O, beside
// bf16's. One head dim at a time: the scenario's, or the nearest the sweep holds; the buttons pick another.
#include <imgui.h>

#include <cstdio>
#include <string>

#include "app/palette.hpp"
#include "app/panels.hpp"
#include "app/plot.hpp"

namespace flashlab::viz {

namespace {

ImU32 colour(int k) {
  const auto& c = palette::kSeries[k % palette::kSeriesCount];
  return IM_COL32(c.r, c.g, c.b, 255);
}
// The series' colours: FP8 as standard attention's red, FP8 + rotation as FA2's green, bf16 as FA1's blue.
constexpr int kFp8 = 0, kBf16 = 1, kRotated = 2;

std::string axis_factor(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%gx", f);
  return b;
}
std::string axis_error(double e) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", e);
  return b;
}

PlotSeries series(const char* name, int colour_index, float thickness = 2.5f) {
  PlotSeries s{name, {}, {}, colour(colour_index)};
  s.thickness = thickness;
  return s;
}

}  // namespace

void draw_fp8(AppState& st) {
  const Fp8Sweep& sweep = st.fp8_sweep;
  if (!sweep.error.empty()) {
    ImGui::TextWrapped("%s", sweep.error.c_str());
    return;
  }
  if (st.fp8_head_dim == 0) st.fp8_head_dim = fp8_sweep_head_dim_for(sweep, st.scenario.head_dim);
  ImGui::TextWrapped("Emulated FP8 (e4m3) attention against attention in double on the same inputs: B = 1, H = 4, "
                     "N = 1024, 4 channels of Q and K multiplied by the factor, then Q and K scaled to unit rms. "
                     "Per-head scales; rotation = x -> H D x / sqrt(d) applied to Q and K.");
  ImGui::TextDisabled("%s (%s, %s)", sweep.file.c_str(), sweep.device.c_str(), sweep.date.c_str());
  for (int d : fp8_sweep_head_dims(sweep)) {
    ImGui::SameLine();
    const std::string label = "d = " + std::to_string(d);
    if (ImGui::RadioButton(label.c_str(), st.fp8_head_dim == d)) st.fp8_head_dim = d;
  }

  PlotSeries s_fp8 = series("FP8", kFp8), s_rot = series("FP8 + rotation", kRotated);
  PlotSeries o_bf16 = series("bf16", kBf16), o_fp8 = series("FP8", kFp8), o_rot = series("FP8 + rotation", kRotated);
  for (const Fp8SweepRow& r : sweep.rows) {
    if (r.head_dim != st.fp8_head_dim) continue;
    const double x = r.outlier_factor;
    s_fp8.x.push_back(x), s_fp8.y.push_back(r.score_rmse_fp8);
    s_rot.x.push_back(x), s_rot.y.push_back(r.score_rmse_fp8_rotated);
    o_bf16.x.push_back(x), o_bf16.y.push_back(r.rmse_bf16);
    o_fp8.x.push_back(x), o_fp8.y.push_back(r.rmse_fp8);
    o_rot.x.push_back(x), o_rot.y.push_back(r.rmse_fp8_rotated);
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 cell(avail.x / 2 - 4, avail.y);
  const std::string d = "d = " + std::to_string(st.fp8_head_dim);
  PlotSpec scores{"fp8_scores", "RMS error of the scores tau Q K^T from e4m3 Q, K (" + d + ")",
                  "outlier channels' size", "RMS error", true, true, axis_factor, axis_error};
  plot(scores, {s_fp8, s_rot}, cell);
  ImGui::SameLine();
  PlotSpec out{"fp8_o", "RMSE of O against attention in double (" + d + ")", "outlier channels' size", "RMSE",
               true, true, axis_factor, axis_error};
  plot(out, {o_bf16, o_fp8, o_rot}, cell);
}

}  // namespace flashlab::viz
