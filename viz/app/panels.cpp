#include "panels.hpp"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace flashlab::viz {

namespace {
constexpr float kSidebarWidth = 360.f;
}  // namespace

const std::vector<Panel>& panels() {
  // Order: as in scenario::panel_ids(); the grid fills row by row in this order.
  static const std::vector<Panel> registry = {
      {"controls", "Controls", true, 0.f, 1.f, draw_controls},
      {"transport", "Transport", true, 150.f, 1.f, draw_transport},
      {"export", "Export", true, 118.f, 1.f, draw_export},
      {"loop_nest", "Loop nest", false, 0.f, 0.9f, draw_loop_nest},
      {"tiles", "Tiles", false, 0.f, 1.0f, draw_tiles},
      {"memory", "Memory chart", false, 0.f, 1.1f, draw_memory_chart},
      {"softmax", "Online softmax", false, 0.f, 1.1f, draw_online_softmax},
      {"compare", "Compare", false, 0.f, 1.1f, draw_compare},
      {"plots", "Plots vs N", false, 0.f, 1.6f, draw_plots},
      {"pipeline", "Pipeline (warpgroup timeline)", false, 0.f, 1.6f, draw_pipeline},
      {"ring", "Ring attention (sequence parallelism)", false, 0.f, 1.6f, draw_ring},
      {"fp8", "FP8 error against outliers (emulated)", false, 0.f, 1.6f, draw_fp8},
  };
  return registry;
}

bool panel_visible(const AppState& st, const char* id) {
  const auto& reg = panels();
  for (std::size_t k = 0; k < reg.size() && k < st.visible.size(); ++k)
    if (std::string(reg[k].id) == id) return st.visible[k];
  return false;
}

void draw_panels(AppState& st) {
  handle_transport_keys(st);
  const auto& reg = panels();
  const ImVec2 screen = ImGui::GetIO().DisplaySize;
  std::vector<std::size_t> side, main;
  for (std::size_t k = 0; k < reg.size(); ++k) {
    if (k < st.visible.size() && !st.visible[k]) continue;
    (reg[k].sidebar ? side : main).push_back(k);
  }
  const float side_w = side.empty() ? 0.f : (main.empty() ? screen.x : std::min(kSidebarWidth, screen.x * 0.3f));

  // Sidebar: fixed heights stacked at the bottom, the flexible one (Controls) takes the rest.
  float fixed = 0;
  int flexible = 0;
  for (std::size_t k : side) reg[k].sidebar_height > 0 ? fixed += reg[k].sidebar_height : ++flexible;
  const float flex_h = flexible ? std::max(80.f, (screen.y - fixed) / float(flexible)) : 0.f;
  float y = 0;
  std::vector<std::pair<std::size_t, ImVec4>> rects;  // x, y, w, h
  for (std::size_t k : side) {
    float h = reg[k].sidebar_height > 0 ? reg[k].sidebar_height : flex_h;
    if (!flexible && k == side.back()) h = screen.y - y;
    rects.push_back({k, ImVec4(0, y, side_w, h)});
    y += h;
  }

  // Main grid: up to three columns; the last row stretches over the leftover columns.
  const int n = int(main.size());
  if (n > 0) {
    const int cols = n <= 1 ? 1 : n <= 4 ? 2 : 3;
    const int rows = (n + cols - 1) / cols;
    const float x0 = side_w, w = screen.x - side_w, h = screen.y / float(rows);
    for (int r = 0; r < rows; ++r) {
      const int first = r * cols, last = std::min(n, first + cols);
      float total = 0;
      for (int k = first; k < last; ++k) total += reg[main[std::size_t(k)]].weight;
      float x = x0;
      for (int k = first; k < last; ++k) {
        const float cw = w * reg[main[std::size_t(k)]].weight / total;
        rects.push_back({main[std::size_t(k)], ImVec4(x, h * float(r), cw, h)});
        x += cw;
      }
    }
  }

  for (const auto& [k, rc] : rects) {
    ImGui::SetNextWindowPos(ImVec2(rc.x, rc.y), ImGuiCond_Always);
    ImGui::SetNextWindowSize(ImVec2(rc.z, rc.w), ImGuiCond_Always);
    const ImGuiWindowFlags flags =
        ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings;
    if (ImGui::Begin(reg[k].title, nullptr, flags)) reg[k].draw(st);
    ImGui::End();
  }
}

}  // namespace flashlab::viz
