#include "probe.hpp"

#include <map>
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
}  // namespace

void clear() { entries().clear(); }

void tile(const std::string& key, float x0, float y0, float x1, float y1, TileState s) {
  entries()[key] = {x0, y0, x1, y1, s};
}

std::string json() {
  nlohmann::json j;
  j["tiles"] = nlohmann::json::object();
  for (const auto& [key, e] : entries())
    j["tiles"][key] = {{"rect", {e.x0, e.y0, e.x1, e.y1}}, {"state", to_string(e.state)}};
  return j.dump(1);
}

}  // namespace flashlab::viz::probe
