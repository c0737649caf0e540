#pragma once
// The tile picture shared by the Tiles and Compare panels: the K and V strips on top, the Q strip
// left, the O strip right, and the Tr x Tc score grid in the middle, each tile filled with its state's
// colour and, when `heat` is on, a bar at its foot coloured by how often it was read from HBM.
// Large grids are drawn in groups of tiles (one cell per group) so a frame stays cheap at N = 128k.
#include <imgui.h>

#include "logic/replay.hpp"
#include "palette.hpp"

namespace flashlab::viz {

constexpr int kMaxCellsPerSide = 64;

ImU32 state_colour(TileState);
ImU32 rgb(const palette::Rgb&, unsigned char alpha = 255);

// Draws into the rectangle [p0, p0 + size). probe_prefix: record tile rectangles for the render test
// under this prefix ("" records "Q/0", "score/1,2"; nullptr records nothing).
void draw_tile_picture(ImDrawList*, const Replay&, ImVec2 p0, ImVec2 size, bool heat, const char* probe_prefix);

// The state legend (swatches) on one line at the cursor.
void tile_legend(bool heat);

}  // namespace flashlab::viz
