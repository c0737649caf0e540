#include "probe.hpp"

#include <imgui.h>

#include <nlohmann/json.hpp>

namespace flashlab::viz::probe {

namespace {
struct Entry {
  float x0, y0, x1, y1;
  TileState state;
};
std::map<std::string, Entry>& entries() {
  static std::map<std::string, Entry> e;
  return e;
}
std::map<std::string, Rect>& widget_entries() {
  static std::map<std::string, Rect> w;
  return w;
}
}  // namespace

void clear() {
  entries().clear();
  widget_entries().clear();
}

void tile(const std::string& key, float x0, float y0, float x1, float y1, TileState s) {
  entries()[key] = {x0, y0, x1, y1, s};
}

void widget(const std::string& name) {
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  widget_entries()[name] = {a.x, a.y, b.x, b.y};
}

void widget(const std::string& name, Rect r) { widget_entries()[name] = r; }

const std::map<std::string, Rect>& widgets() { return widget_entries(); }

std::string json() {
  nlohmann::json j;
  j["tiles"] = nlohmann::json::object();
  for (const auto& [key, e] : entries())
    j["tiles"][key] = {{"rect", {e.x0, e.y0, e.x1, e.y1}}, {"state", to_string(e.state)}};
  j["widgets"] = nlohmann::json::object();
  for (const auto& [name, r] : widgets()) j["widgets"][name] = {r.x0, r.y0, r.x1, r.y1};
  return j.dump(1);
}

}  // namespace flashlab::viz::probe
