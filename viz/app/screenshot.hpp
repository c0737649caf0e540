#pragma once
// Saves the current OpenGL framebuffer (the whole window) as a PNG with stb_image_write.
#include <string>

namespace flashlab::viz {

// Reads the back buffer (call after rendering, before swapping). Throws InputError when the file
// cannot be written.
void save_framebuffer_png(const std::string& path, int width, int height);

}  // namespace flashlab::viz
