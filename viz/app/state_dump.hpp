#pragma once
// --state-file: what the window shows, as a small JSON file that a test reads after driving the window with
// real key and mouse events (viz/tests/drive_test.sh). One key a line, one widget a line, so that a shell
// script can read a field with sed:
//   {
//    "step": 190,
//    "algorithm": "fa2",
//    "panels": ["controls", "loop_nest", "softmax", "tiles"],
//    ...
//    "widgets": {
//     "controls/algorithm": [188, 64, 338, 84],
//     ...
//    }
//   }
#include <string>

#include "app_state.hpp"

namespace flashlab::viz {

// What the window system knows and the AppState does not.
struct WindowState {
  int width = 0, height = 0;  // the window's size in pixels
  bool focused = false;       // it has the keyboard focus
  bool text_input = false;    // keys go to a text field (ImGui's WantTextInput), not to the transport
};

// The state as JSON (see above): the step (events applied) and the stream's length, the scenario shown
// (algorithm, pass, N, d, M, causal, dtype, compare), the panels shown, whether it plays, the window, the
// last error, the screenshots saved, and the named widgets' rectangles this frame (probe::widgets()).
std::string state_json(const AppState&, const WindowState&);

// Writes `text` to PATH.tmp, then renames it over `path`: a reader sees the old file or the new one, never a
// part of one. Throws InputError when it cannot.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace flashlab::viz
