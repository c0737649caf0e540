#pragma once
// The app's colours, in one place: the Tiles panel fills tiles with them and the render test
// (viz/tests/png_check.cpp) reads them back from screenshots.
#include <cstdint>
#include <cstring>
#include <optional>

namespace flashlab::viz::palette {

struct Rgb {
  std::uint8_t r, g, b;
};

// Tile states: distinct at a glance and far apart in RGB (the render test tells them apart).
constexpr Rgb kPending{58, 62, 74};     // slate: not touched yet
constexpr Rgb kInSram{255, 176, 32};    // amber: on chip now
constexpr Rgb kDone{46, 160, 110};      // green: finished, back in HBM
constexpr Rgb kSkipped{28, 28, 32};     // near black: skipped by the causal mask
constexpr Rgb kOver{220, 50, 47};       // red: SRAM over capacity

// Series colours for plots: 0-2 standard, FA1, FA2; 3 the L2 curve; 5 hardware limits (grey);
// 6 on: measured variants.
constexpr Rgb kSeries[] = {{230, 97, 80},   {90, 160, 240},  {120, 210, 110}, {200, 140, 230},
                           {240, 200, 90},  {150, 150, 150}, {250, 200, 60},  {80, 210, 210},
                           {250, 130, 40},  {240, 110, 190}, {170, 200, 90},  {210, 210, 240}};
constexpr int kSeriesCount = sizeof(kSeries) / sizeof(kSeries[0]);

// The Ring panel: one colour per rank, and so per K/V share (the share that starts on rank r), far
// apart in hue so that a share can be followed round the ring. As many as the panel draws ranks.
constexpr Rgb kRanks[] = {{90, 160, 240}, {250, 130, 40}, {120, 210, 110}, {240, 110, 190},
                          {240, 200, 90}, {80, 210, 210},  {200, 140, 230}, {230, 97, 80}};
constexpr int kRankCount = sizeof(kRanks) / sizeof(kRanks[0]);

inline std::optional<Rgb> state_colour(const char* name) {
  if (!std::strcmp(name, "pending")) return kPending;
  if (!std::strcmp(name, "in_sram")) return kInSram;
  if (!std::strcmp(name, "done")) return kDone;
  if (!std::strcmp(name, "skipped")) return kSkipped;
  return std::nullopt;
}

}  // namespace flashlab::viz::palette
