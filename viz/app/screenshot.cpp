#include "screenshot.hpp"

#include <GLFW/glfw3.h>

#include <cstdint>
#include <fstream>
#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/problem.hpp"

#include <zlib.h>

#include <cstdlib>

// stb_image_write's own deflate is small but weak; zlib at level 9 makes the figures about a third
// smaller (they are committed, so size matters).
static unsigned char* zlib_deflate(unsigned char* data, int length, int* out_length, int /*quality*/) {
  uLongf bound = compressBound(uLong(length));
  auto* out = static_cast<unsigned char*>(std::malloc(bound));
  if (!out || compress2(out, &bound, data, uLong(length), Z_BEST_COMPRESSION) != Z_OK) {
    std::free(out);
    return nullptr;
  }
  *out_length = int(bound);
  return out;
}
#define STBIW_ZLIB_COMPRESS zlib_deflate
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

namespace flashlab::viz {

namespace {

// CRC-32 as PNG chunks need it (ISO 3309, the zlib polynomial).
std::uint32_t crc32(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xffffffffu;
  for (std::size_t k = 0; k < n; ++k) {
    c ^= p[k];
    for (int b = 0; b < 8; ++b) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

void put_u32(std::vector<unsigned char>& v, std::uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<unsigned char>(x >> s));
}

// PNG chunk: length, type, data, CRC over type and data.
void put_chunk(std::vector<unsigned char>& png, const char* type, const std::vector<unsigned char>& data) {
  put_u32(png, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = png.size();
  for (int k = 0; k < 4; ++k) png.push_back(static_cast<unsigned char>(type[k]));
  for (unsigned char c : data) png.push_back(c);
  put_u32(png, crc32(png.data() + start, png.size() - start));
}

// A tEXt chunk (keyword NUL text) as bytes, ready to splice into a PNG.
std::vector<unsigned char> text_chunk(const std::string& keyword, const std::string& text) {
  std::vector<unsigned char> data;
  for (char ch : keyword) data.push_back(static_cast<unsigned char>(ch));
  data.push_back(0);
  for (char ch : text) data.push_back(static_cast<unsigned char>(ch));
  std::vector<unsigned char> chunk;
  put_chunk(chunk, "tEXt", data);
  return chunk;
}

// An indexed-colour PNG (colour type 3, 8 bits) of the most frequent colours of an RGB image.
std::vector<unsigned char> palette_png(const std::vector<unsigned char>& rgb, int width, int height,
                                       const std::string& comment) {
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
  std::vector<unsigned char> raw;  // each row: filter byte 0, then indices
  raw.reserve(n + std::size_t(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    for (int x = 0; x < width; ++x) raw.push_back(index[key(std::size_t(y) * width + x)]);
  }
  uLongf zlen = compressBound(uLong(raw.size()));
  std::vector<unsigned char> z(zlen);
  compress2(z.data(), &zlen, raw.data(), uLong(raw.size()), Z_BEST_COMPRESSION);
  z.resize(zlen);

  std::vector<unsigned char> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<unsigned char> ihdr;
  put_u32(ihdr, std::uint32_t(width));
  put_u32(ihdr, std::uint32_t(height));
  ihdr.insert(ihdr.end(), {8, 3, 0, 0, 0});  // 8 bits, indexed colour, deflate, adaptive filter, no interlace
  put_chunk(png, "IHDR", ihdr);
  const std::vector<unsigned char> text = text_chunk("Comment", comment);
  png.insert(png.end(), text.begin(), text.end());
  std::vector<unsigned char> plte;
  for (const auto& [m, c] : byfreq) plte.insert(plte.end(), {(unsigned char)(c >> 16), (unsigned char)(c >> 8), (unsigned char)c});
  put_chunk(png, "PLTE", plte);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", {});
  return png;
}

}  // namespace

void save_framebuffer_png(const std::string& path, int width, int height, const std::string& comment, bool palette) {
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
  if (palette) {
    const std::vector<unsigned char> png = palette_png(pixels, width, height, comment);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
    if (!out) throw InputError("cannot write the screenshot '" + path + "'");
    return;
  }
  stbi_write_png_compression_level = 9;
  int size = 0;
  unsigned char* png = stbi_write_png_to_mem(pixels.data(), int(row), width, height, kChannels, &size);
  if (!png) throw InputError("cannot encode the screenshot '" + path + "'");
  // The signature (8 bytes) and IHDR (25 bytes) come first; the comment goes right after them.
  constexpr int kAfterHeader = 8 + 25;
  const std::vector<unsigned char> chunk = text_chunk("Comment", comment);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(png), kAfterHeader);
  out.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(chunk.size()));
  out.write(reinterpret_cast<const char*>(png) + kAfterHeader, size - kAfterHeader);
  std::free(png);
  if (!out) throw InputError("cannot write the screenshot '" + path + "'");
}

}  // namespace flashlab::viz
