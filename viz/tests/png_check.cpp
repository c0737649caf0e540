// Checks a screenshot of flashlab-viz: that it is not trivial (many distinct colours, not one flat
// fill) and that named tiles show the expected state's colour. The tile rectangles come from the app's
// --dump-layout JSON; the expected states come from the command line (what the test asserts), and the
// colours from viz/app/palette.hpp (what the Tiles panel fills them with).
//   viz_png_check shot.png layout.json [--min-colours N] [tile=state ...]   e.g. score/0,1=in_sram
// A second mode tells whether two screenshots show different pictures (their pixels, not their files: the PNG
// comment names the scenario), for the test that drives the window (drive_test.sh):
//   viz_png_check --differ before.png after.png    0: they differ; 1: the same picture, or unreadable
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

// --differ A B: the number of pixels that differ, on stdout; exit 0 when there is any.
int differ(const char* a_path, const char* b_path) {
  int aw = 0, ah = 0, bw = 0, bh = 0, n = 0;
  unsigned char* a = stbi_load(a_path, &aw, &ah, &n, 4);
  if (!a) return fail(std::string("cannot read PNG ") + a_path);
  unsigned char* b = stbi_load(b_path, &bw, &bh, &n, 4);
  if (!b) {
    stbi_image_free(a);
    return fail(std::string("cannot read PNG ") + b_path);
  }
  long long changed = -1;  // the sizes differ
  if (aw == bw && ah == bh) {
    changed = 0;
    for (std::size_t k = 0; k < std::size_t(aw) * ah; ++k)
      changed += a[4 * k] != b[4 * k] || a[4 * k + 1] != b[4 * k + 1] || a[4 * k + 2] != b[4 * k + 2];
  }
  stbi_image_free(a);
  stbi_image_free(b);
  if (changed == 0) return fail(std::string(b_path) + " shows the same picture as " + a_path);
  if (changed < 0)
    std::printf("viz_png_check: %s is %dx%d, %s %dx%d\n", b_path, bw, bh, a_path, aw, ah);
  else
    std::printf("viz_png_check: %s: %dx%d, %lld pixels differ from %s\n", b_path, bw, bh, changed, a_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--differ") return differ(argv[2], argv[3]);
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
