#pragma once
// Saves the current OpenGL framebuffer (the whole window) as a PNG (libpng).
#include <string>

namespace flashlab::viz {

// Reads the back buffer (call after rendering, before swapping) and writes it with `comment` in a
// tEXt chunk (keyword "Comment": the command that made the image). Throws InputError when the file
// cannot be written.
// palette: write an 8-bit indexed PNG of the 256 most frequent colours (each other pixel takes its
// nearest), several times smaller for committed figures; the big flat areas keep their exact colour.
// compression_level: zlib's 0-9; 9 (the default) for files that are kept, a low one where a person waits.
void save_framebuffer_png(const std::string& path, int width, int height, const std::string& comment,
                          bool palette = false, int compression_level = 9);

}  // namespace flashlab::viz
