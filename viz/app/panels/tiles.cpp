// Tiles: the Q, K, V and O tiles and the Tr x Tc score grid, each pending / in SRAM / done / skipped by
// the causal mask, with a heat bar of how often each tile was read from HBM (FA1 re-reads O_i once per
// key block; FA2 reads it never). The tile rectangles go to the probe for the render test.
#include <imgui.h>

#include "app/panels.hpp"
#include "app/tile_grid.hpp"

namespace flashlab::viz {

void draw_tiles(AppState& st) {
  if (!st.replay) return;
  const Trace& t = *st.trace;
  ImGui::Text("N = %d, d = %d, Br = %d, Bc = %d: Tr x Tc = %d x %d tiles", t.problem.shape.seq_q,
              t.problem.shape.head_dim, t.tiling.Br, t.tiling.Bc, t.Tr, t.Tc);
  ImGui::SameLine();
  ImGui::Checkbox("heat", &st.heat);
  tile_legend(st.heat);
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  const ImVec2 size = ImGui::GetContentRegionAvail();
  draw_tile_picture(ImGui::GetWindowDrawList(), *st.replay, p0, size, st.heat, "");
  ImGui::Dummy(size);
}

}  // namespace flashlab::viz
