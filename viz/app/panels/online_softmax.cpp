// Online softmax: for the rows of the current query block, the running max m, the running sum l and
// the rescale factor exp(m_old - m_new) after the visits so far, with real values (random inputs)
// for N <= 1024; a plot of one row's m and l visit by visit; and the errors against a direct softmax
// and against the LSE of the library's own tiled_forward.
#include <imgui.h>

#include <cmath>

#include "app/panels.hpp"
#include "app/plot.hpp"

namespace flashlab::viz {

namespace {
constexpr int kRowsShown = 8;
}

void draw_online_softmax(AppState& st) {
  const SoftmaxTrace& s = st.softmax;
  if (!s.available) {
    ImGui::TextWrapped("Not shown: %s.", s.why_not.c_str());
    return;
  }
  const std::int64_t step = st.replay ? st.replay->step() : 0;
  const TileEvent* e = st.replay ? st.replay->current() : nullptr;
  if (st.follow_block && e && e->i >= 0) st.softmax_row = std::min(s.seq_q - 1, e->i * s.Br);
  ImGui::Checkbox("follow the current block", &st.follow_block);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(120);
  if (ImGui::SliderInt("row", &st.softmax_row, 0, s.seq_q - 1)) st.follow_block = false;
  ImGui::Text("max |O_online - O_direct| = %.2e   max |m + log l - LSE(tiled_forward)| = %.2e", s.max_err_o,
              s.max_err_lse_library);

  const int block = st.softmax_row / s.Br;
  const int r0 = block * s.Br, r1 = std::min(s.seq_q, r0 + s.Br);
  const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchSame;
  if (ImGui::BeginTable("##rows", 6, flags)) {
    for (const char* h : {"row", "m_i", "l_i", "rescale", "visits", "direct m / l"}) ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (int r = r0; r < std::min(r1, r0 + kRowsShown); ++r) {
      const SoftmaxRow row = row_state(s, r, step);
      ImGui::TableNextRow();
      if (r == st.softmax_row) ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, IM_COL32(90, 70, 20, 255));
      ImGui::TableNextColumn();
      ImGui::Text("%d", r);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", row.m);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", row.l);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", row.rescale);
      ImGui::TableNextColumn();
      ImGui::Text("%d", row.visits);
      ImGui::TableNextColumn();
      ImGui::Text("%.3f / %.3f", s.direct_m[std::size_t(r)], s.direct_l[std::size_t(r)]);
    }
    ImGui::EndTable();
  }
  if (r1 - r0 > kRowsShown) ImGui::TextDisabled("(%d more rows in this block)", r1 - r0 - kRowsShown);

  // Row trajectory: m and l after each visit so far.
  PlotSeries m{"m (running max)", {}, {}, IM_COL32(255, 176, 32, 255)};
  PlotSeries l{"l (running sum)", {}, {}, IM_COL32(90, 160, 240, 255)};
  PlotSeries a{"rescale exp(m_old - m_new)", {}, {}, IM_COL32(120, 210, 110, 255)};
  for (std::size_t v = 0; v < s.visits.size() && s.visits[v].event < step; ++v) {
    if (s.visits[v].i != block) continue;
    const SoftmaxRow& row = s.after[v][std::size_t(st.softmax_row - r0)];
    if (!std::isfinite(row.m)) continue;
    const double x = row.visits;
    m.x.push_back(x), m.y.push_back(row.m);
    l.x.push_back(x), l.y.push_back(row.l);
    a.x.push_back(x), a.y.push_back(row.rescale);
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 half(avail.x / 2 - 4, std::max(150.f, avail.y));
  PlotSpec left;
  left.id = "softmax_m";
  left.title = "row " + std::to_string(st.softmax_row) + ": m_i and the rescale factor";
  left.x_label = "key blocks seen";
  left.y_label = "value";
  left.log_x = left.log_y = false;
  left.integer_x = true;
  plot(left, {m, a}, half);
  ImGui::SameLine();
  PlotSpec right = left;
  right.id = "softmax_l";
  right.title = "row " + std::to_string(st.softmax_row) + ": l_i (running sum)";
  plot(right, {l}, half);
}

}  // namespace flashlab::viz
