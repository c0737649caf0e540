#include "screenshot.hpp"

#include <GLFW/glfw3.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <unordered_map>
#include <vector>

#include "core/problem.hpp"

namespace flashlab::viz {

namespace {

// An RGB image reduced to its most frequent colours: each pixel becomes an index into `colours`.
// The big flat areas of a UI keep their exact colour; the rare anti-aliased pixels take the nearest.
struct Indexed {
  std::vector<png_color> colours;      // at most 256
  std::vector<unsigned char> indices;  // (height, width)
};

Indexed reduce_to_palette(const std::vector<unsigned char>& rgb, int width, int height) {
  constexpr std::size_t kColours = 256;
  const std::size_t n = std::size_t(width) * height;
  auto key = [&](std::size_t k) { return std::uint32_t(rgb[3 * k]) << 16 | std::uint32_t(rgb[3 * k + 1]) << 8 | rgb[3 * k + 2]; };
  std::unordered_map<std::uint32_t, std::size_t> count;
  for (std::size_t k = 0; k < n; ++k) ++count[key(k)];
  std::vector<std::pair<std::size_t, std::uint32_t>> byfreq;
  for (const auto& [c, m] : count) byfreq.push_back({m, c});
  std::sort(byfreq.rbegin(), byfreq.rend());
  byfreq.resize(std::min(byfreq.size(), kColours));
  std::unordered_map<std::uint32_t, unsigned char> index;
  for (const auto& [c, m] : count) {
    int best = 0;
    long best_d = -1;
    for (std::size_t p = 0; p < byfreq.size(); ++p) {
      const std::uint32_t q = byfreq[p].second;
      const long dr = long(c >> 16) - long(q >> 16), dg = long((c >> 8) & 255) - long((q >> 8) & 255),
                 db = long(c & 255) - long(q & 255);
      const long d = dr * dr + dg * dg + db * db;
      if (best_d < 0 || d < best_d) best = int(p), best_d = d;
      if (d == 0) break;
    }
    index[c] = static_cast<unsigned char>(best);
  }
  Indexed out;
  for (const auto& [m, c] : byfreq)
    out.colours.push_back(png_color{png_byte(c >> 16), png_byte((c >> 8) & 255), png_byte(c & 255)});
  out.indices.resize(n);
  for (std::size_t k = 0; k < n; ++k) out.indices[k] = index[key(k)];
  return out;
}

// Writes rows of `pixels` (RGB, or palette indices when `palette` is non-null) with libpng at the
// strongest compression (the figures are committed, so size matters), `comment` in a tEXt chunk.
// Returns false on any libpng or file error.
bool write_png(const char* path, int width, int height, const unsigned char* pixels, int bytes_per_pixel,
               const std::vector<png_color>* palette, const std::string& comment, int compression_level) {
  std::FILE* file = std::fopen(path, "wb");
  if (!file) return false;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  // Every C++ object this function owns exists before setjmp, so libpng's longjmp skips no destructor.
  std::vector<png_bytep> rows(static_cast<std::size_t>(height));
  std::string key = "Comment", text = comment;
  png_text chunk{};
  volatile bool ok = false;  // volatile: set after setjmp, read after a possible longjmp
  if (png && info && setjmp(png_jmpbuf(png)) == 0) {
    png_init_io(png, file);
    png_set_compression_level(png, std::clamp(compression_level, 0, 9));
    png_set_IHDR(png, info, png_uint_32(width), png_uint_32(height), 8,
                 palette ? PNG_COLOR_TYPE_PALETTE : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (palette) png_set_PLTE(png, info, palette->data(), int(palette->size()));
    chunk.compression = PNG_TEXT_COMPRESSION_NONE;
    chunk.key = key.data();
    chunk.text = text.data();
    png_set_text(png, info, &chunk, 1);
    for (int y = 0; y < height; ++y)
      rows[std::size_t(y)] = const_cast<png_bytep>(pixels + std::size_t(y) * width * bytes_per_pixel);
    png_write_info(png, info);
    png_write_image(png, rows.data());
    png_write_end(png, nullptr);
    ok = true;
  }
  png_destroy_write_struct(png ? &png : nullptr, info ? &info : nullptr);
  return std::fclose(file) == 0 && ok;
}

}  // namespace

void save_framebuffer_png(const std::string& path, int width, int height, const std::string& comment, bool palette,
                          int compression_level) {
  constexpr int kChannels = 3;  // RGB: the window is opaque, and PNGs stay smaller without alpha
  std::vector<unsigned char> pixels(std::size_t(width) * height * kChannels);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, width, height, GL_RGB, GL_UNSIGNED_BYTE, pixels.data());
  // OpenGL's first row is the bottom one; PNG's is the top.
  const std::size_t row = std::size_t(width) * kChannels;
  std::vector<unsigned char> tmp(row);
  for (int y = 0; y < height / 2; ++y) {
    unsigned char* a = pixels.data() + std::size_t(y) * row;
    unsigned char* b = pixels.data() + std::size_t(height - 1 - y) * row;
    std::copy(a, a + row, tmp.data());
    std::copy(b, b + row, a);
    std::copy(tmp.data(), tmp.data() + row, b);
  }
  bool written;
  if (palette) {
    const Indexed image = reduce_to_palette(pixels, width, height);
    written = write_png(path.c_str(), width, height, image.indices.data(), 1, &image.colours, comment,
                        compression_level);
  } else {
    written = write_png(path.c_str(), width, height, pixels.data(), kChannels, nullptr, comment, compression_level);
  }
  if (!written) throw InputError("cannot write the screenshot '" + path + "'");
}

}  // namespace flashlab::viz
