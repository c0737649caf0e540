#pragma once
// Where things were drawn this frame, for the headless render test: the Tiles panel records each
// tile's screen rectangle and state; `--dump-layout FILE` writes them as JSON next to the screenshot.
#include <string>

#include "logic/replay.hpp"

namespace flashlab::viz::probe {

void clear();  // at the start of each frame
void tile(const std::string& key, float x0, float y0, float x1, float y1, TileState);  // "score/1,2", "K/3"
std::string json();  // {"tiles": {"K/3": {"rect": [x0, y0, x1, y1], "state": "in_sram"}, ...}}

}  // namespace flashlab::viz::probe
