#include "screenshot.hpp"

#include <GLFW/glfw3.h>

#include <vector>

#include "core/problem.hpp"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>

namespace flashlab::viz {

void save_framebuffer_png(const std::string& path, int width, int height) {
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
  stbi_write_png_compression_level = 9;
  if (!stbi_write_png(path.c_str(), width, height, kChannels, pixels.data(), int(row)))
    throw InputError("cannot write the screenshot '" + path + "'");
}

}  // namespace flashlab::viz
