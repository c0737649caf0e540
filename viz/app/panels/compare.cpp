// Compare: the shown algorithm and a second one on the same problem, side by side in lock-step (the
// same fraction of each stream), with the bytes per tensor so far and the differences of the whole
// runs counted in words ("FA1 moved 8x more bytes for O").
#include <imgui.h>

#include "app/panels.hpp"
#include "app/tile_grid.hpp"
#include "logic/format.hpp"

namespace flashlab::viz {

void draw_compare(AppState& st) {
  if (!st.replay) return;
  if (!st.compare_replay) {
    ImGui::TextWrapped("Pick a second algorithm to compare with:");
    for (Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2}) {
      if (a == st.scenario.algorithm) continue;
      ImGui::SameLine();
      if (ImGui::Button(to_string(a))) {
        Scenario s = st.scenario;
        s.compare = a;
        s.step = st.replay->step();
        apply_scenario(st, s);
      }
    }
    return;
  }
  const Replay& A = *st.replay;
  const Replay& B = *st.compare_replay;
  const Trace& ta = A.trace();
  const Trace& tb = B.trace();
  for (const std::string& line : compare_totals(ta, tb)) ImGui::BulletText("%s", line.c_str());
  ImGui::BulletText("events: %s %s, %s %s; peak SRAM %s vs %s", to_string(ta.algorithm),
                    format_count(double(A.size())).c_str(), to_string(tb.algorithm), format_count(double(B.size())).c_str(),
                    format_bytes(double(ta.totals.peak_sram_bytes)).c_str(),
                    format_bytes(double(tb.totals.peak_sram_bytes)).c_str());

  if (ImGui::BeginTable("##cmp", 3, ImGuiTableFlags_Borders | ImGuiTableFlags_SizingStretchSame)) {
    ImGui::TableSetupColumn("so far");
    ImGui::TableSetupColumn(to_string(ta.algorithm));
    ImGui::TableSetupColumn(to_string(tb.algorithm));
    ImGui::TableHeadersRow();
    for (int k = 0; k < static_cast<int>(TensorId::Count); ++k) {
      const auto ra = A.totals().read[k] + A.totals().written[k], rb = B.totals().read[k] + B.totals().written[k];
      if (ta.totals.read[k] + ta.totals.written[k] + tb.totals.read[k] + tb.totals.written[k] == 0) continue;
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(to_string(static_cast<TensorId>(k)));
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(format_bytes(double(ra)).c_str());
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(format_bytes(double(rb)).c_str());
    }
    ImGui::EndTable();
  }

  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float half = avail.x / 2 - 6;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeightWithSpacing();
  const std::string la = std::string(to_string(ta.algorithm)) + "  step " + std::to_string(A.step());
  const std::string lb = std::string(to_string(tb.algorithm)) + "  step " + std::to_string(B.step());
  dl->AddText(p0, IM_COL32(230, 230, 235, 255), la.c_str());
  dl->AddText(ImVec2(p0.x + half + 12, p0.y), IM_COL32(230, 230, 235, 255), lb.c_str());
  draw_tile_picture(dl, A, ImVec2(p0.x, p0.y + lh), ImVec2(half, avail.y - lh), st.heat, nullptr);
  draw_tile_picture(dl, B, ImVec2(p0.x + half + 12, p0.y + lh), ImVec2(half, avail.y - lh), st.heat, "compare/");
  ImGui::Dummy(avail);
}

}  // namespace flashlab::viz
