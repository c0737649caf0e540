#pragma once
// Where things were drawn this frame, for the tests that look at the window: the Tiles panel records each
// tile's screen rectangle and state (`--dump-layout FILE` writes them as JSON next to the screenshot), and a
// few named widgets record theirs (the Controls panel's combo boxes, their open lists' entries, the Panels
// checkboxes), which `--state-file` writes so that a test can click them where they are.
#include <map>
#include <string>

#include "logic/replay.hpp"

namespace flashlab::viz::probe {

struct Rect {
  float x0, y0, x1, y1;  // window pixels, from the top-left corner
};

void clear();  // at the start of each frame
void tile(const std::string& key, float x0, float y0, float x1, float y1, TileState);  // "score/1,2", "K/3"
// The last ImGui item's rectangle, or the one given: "controls/algorithm", "controls/panel/compare".
void widget(const std::string& name);
void widget(const std::string& name, Rect);
const std::map<std::string, Rect>& widgets();  // those recorded this frame
std::string json();  // {"tiles": {"K/3": {"rect": [x0, y0, x1, y1], "state": "in_sram"}, ...}, "widgets": {...}}

}  // namespace flashlab::viz::probe
