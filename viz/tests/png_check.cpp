// Checks a screenshot of flashlab-viz: that it is not trivial (many distinct colours, not one flat
// fill) and that named tiles show the expected state's colour. The tile rectangles come from the app's
// --dump-layout JSON; the expected states come from the command line (what the test asserts), and the
// colours from viz/app/palette.hpp (what the Tiles panel fills them with).
//   viz_png_check shot.png layout.json [--min-colours N] [tile=state ...]   e.g. score/0,1=in_sram
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>

#include "app/palette.hpp"

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "viz_png_check: FAIL: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: viz_png_check shot.png layout.json [--min-colours N] [tile=state ...]");
  int w = 0, h = 0, n = 0;
  unsigned char* px = stbi_load(argv[1], &w, &h, &n, 4);
  if (!px) return fail(std::string("cannot read PNG ") + argv[1]);
  std::ifstream in(argv[2]);
  nlohmann::json layout;
  try {
    in >> layout;
  } catch (const std::exception& e) {
    return fail(std::string("cannot read layout JSON ") + argv[2] + ": " + e.what());
  }
  int min_colours = 200;
  int checked = 0, failures = 0;
  std::set<unsigned> colours;
  for (int k = 0; k < w * h; ++k)
    colours.insert(unsigned(px[4 * k]) << 16 | unsigned(px[4 * k + 1]) << 8 | px[4 * k + 2]);
  for (int a = 3; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--min-colours" && a + 1 < argc) {
      min_colours = std::atoi(argv[++a]);
      continue;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos) return fail("bad expectation '" + arg + "' (want tile=state)");
    const std::string tile = arg.substr(0, eq), state = arg.substr(eq + 1);
    const auto want = flashlab::viz::palette::state_colour(state.c_str());
    if (!want) return fail("unknown state '" + state + "'");
    if (!layout.contains("tiles") || !layout["tiles"].contains(tile)) {
      std::fprintf(stderr, "viz_png_check: FAIL: tile %s is not in the layout (not drawn)\n", tile.c_str());
      ++failures;
      continue;
    }
    const auto r = layout["tiles"][tile]["rect"];
    const int cx = int((r[0].get<double>() + r[2].get<double>()) / 2);
    const int cy = int((r[1].get<double>() + r[3].get<double>()) / 2);
    if (cx < 0 || cy < 0 || cx >= w || cy >= h) return fail("tile " + tile + " lies outside the image");
    const unsigned char* p = px + 4 * (std::size_t(cy) * w + cx);
    const int dr = std::abs(int(p[0]) - int(want->r)), dg = std::abs(int(p[1]) - int(want->g)),
              db = std::abs(int(p[2]) - int(want->b));
    constexpr int kSlack = 6;  // rasterizer rounding; the state colours are far further apart than this
    ++checked;
    if (dr > kSlack || dg > kSlack || db > kSlack) {
      std::fprintf(stderr, "viz_png_check: FAIL: tile %s at (%d, %d) is rgb(%d, %d, %d), want %s rgb(%d, %d, %d)\n",
                   tile.c_str(), cx, cy, p[0], p[1], p[2], state.c_str(), want->r, want->g, want->b);
      ++failures;
    }
  }
  stbi_image_free(px);
  if (int(colours.size()) < min_colours) {
    std::fprintf(stderr, "viz_png_check: FAIL: only %zu distinct colours (want >= %d): blank or trivial image\n",
                 colours.size(), min_colours);
    ++failures;
  }
  std::printf("viz_png_check: %s: %dx%d, %zu colours, %d tiles checked, %d failures\n", argv[1], w, h,
              colours.size(), checked, failures);
  return failures == 0 ? 0 : 1;
}
