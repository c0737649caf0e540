// flashlab-viz: the window loop and the command line, nothing else. The panels (app/panels/*.cpp,
// listed in app/panels.cpp) draw; the logic (viz/logic) replays the library's own loop nest.
//   flashlab-viz                                     interactive
//   flashlab-viz --scenario F.json --screenshot out.png [--step K] [--size WxH]   render and exit
//   flashlab-viz --algorithm fa1 --seq 256 --head-dim 64 --sram-bytes 16384 --causal top-left ...
//   flashlab-viz --bench-frames 300                  frame times (plots shown, animation playing)
//   flashlab-viz --scenario F.json --state-file s.json   interactive, the state rewritten as it changes (tests)
#include <CLI/CLI.hpp>
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <numeric>
#include <set>
#include <thread>

#include "app/panels.hpp"
#include "app/probe.hpp"
#include "app/screenshot.hpp"
#include "app/state_dump.hpp"
#include "logic/csv.hpp"

namespace {

using namespace flashlab;
using namespace flashlab::viz;

constexpr int kExitBadInput = 2;
constexpr int kExitNoDisplay = 3;
constexpr double kSweepWaitSeconds = 60;  // headless: wait this long at most for the plots' sweep
constexpr int kSettleFrames = 3;          // ImGui lays windows out over the first frames
constexpr int kInteractiveCompression = 1;  // zlib level of the PNGs saved in the window (F12, Export): see save_shot
constexpr auto kHeadlessFrameInterval = std::chrono::milliseconds(200);  // headless, while the workers work
constexpr const char* kFontPath = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
constexpr float kFontSize = 15.f;
constexpr float kBackground[3] = {0.085f, 0.09f, 0.105f};  // the panels' background (see setup_style)

std::string glfw_error;
void on_glfw_error(int, const char* text) { glfw_error = text; }

struct Flags {
  std::string scenario_file, algorithm, pass, causal, dtype, compare, screenshot, dump_layout, size, panels, state_file;
  std::string bench_dir = std::string(FLASHLAB_SOURCE_DIR) + "/bench/results";
  int seq = 0, head_dim = 0, br = -1, bc = -1, bench_frames = 0;
  std::int64_t sram_bytes = 0, step = -2;
  bool causal_flag = false, png_palette = false, no_wait = false;
};

// The scenario: the file (if any), then every flag given on top of it.
Scenario scenario_from(const Flags& f) {
  Scenario s = f.scenario_file.empty() ? Scenario{} : load_scenario_file(f.scenario_file);
  if (!f.algorithm.empty()) s.algorithm = parse_algorithm(f.algorithm);
  if (!f.pass.empty()) {
    if (f.pass != "forward" && f.pass != "backward") throw InputError("--pass must be forward or backward, got '" + f.pass + "'");
    s.pass = f.pass == "forward" ? Pass::Forward : Pass::Backward;
  }
  if (f.seq) s.seq_q = s.seq_k = f.seq;
  if (f.head_dim) s.head_dim = f.head_dim;
  if (f.sram_bytes) s.sram_bytes = f.sram_bytes;
  if (f.br >= 0) s.br = f.br;
  if (f.bc >= 0) s.bc = f.bc;
  if (f.causal_flag) s.causal = CausalAlign::TopLeft;
  if (!f.causal.empty()) s.causal = parse_causal(f.causal);
  if (!f.dtype.empty()) s.dtype = parse_dtype(f.dtype);
  if (!f.compare.empty()) s.compare = parse_algorithm(f.compare);
  if (f.step != -2) s.step = f.step;
  if (!f.panels.empty()) {
    std::string rest = f.panels + ",";
    std::string json = "{\"panels\": [";
    for (std::size_t at; (at = rest.find(',')) != std::string::npos; rest.erase(0, at + 1))
      if (at > 0) json += std::string(json.back() == '[' ? "" : ",") + "\"" + rest.substr(0, at) + "\"";
    s.panels = parse_scenario(json + "]}", "--panels").panels;
  }
  if (!f.size.empty()) {
    int w = 0, h = 0;
    if (std::sscanf(f.size.c_str(), "%dx%d", &w, &h) != 2 || w < 320 || h < 320 || w > 8192 || h > 8192)
      throw InputError("--size must be WIDTHxHEIGHT with sides in [320, 8192], got '" + f.size + "'");
    s.width = w, s.height = h;
  }
  validate(s);
  return s;
}

GLFWwindow* open_window(const Scenario& s, bool visible, const char** glsl) {
  glfwWindowHint(GLFW_VISIBLE, visible ? GLFW_TRUE : GLFW_FALSE);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  *glsl = "#version 330 core";
  GLFWwindow* w = glfwCreateWindow(s.width, s.height, "FlashLab: where the bytes go", nullptr, nullptr);
  if (!w) {  // an older GL: let the driver pick, and use GLSL 1.30
    glfwDefaultWindowHints();
    glfwWindowHint(GLFW_VISIBLE, visible ? GLFW_TRUE : GLFW_FALSE);
    *glsl = "#version 130";
    w = glfwCreateWindow(s.width, s.height, "FlashLab: where the bytes go", nullptr, nullptr);
  }
  return w;
}

void setup_style() {
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the layout is computed, nothing to remember
  if (std::filesystem::exists(kFontPath)) io.Fonts->AddFontFromFileTTF(kFontPath, kFontSize);
  ImGui::StyleColorsDark();
  ImGuiStyle& st = ImGui::GetStyle();
  st.WindowRounding = 0;
  st.WindowBorderSize = 1;
  st.FrameRounding = 3;
  // Crisp edges: anti-aliased fills add a fringe of blended colours around every tile, which the
  // eye does not need on axis-aligned rectangles and which doubles the size of a PNG.
  st.AntiAliasedFill = false;
  st.WindowPadding = ImVec2(8, 6);
  st.ItemSpacing = ImVec2(6, 4);
  // The panels tile the whole window, so their background is the clear colour: a transparent
  // WindowBg is not drawn at all, which saves the software renderer a blended full-screen layer.
  st.Colors[ImGuiCol_WindowBg] = ImVec4(0, 0, 0, 0);
  st.Colors[ImGuiCol_TitleBg] = st.Colors[ImGuiCol_TitleBgActive] = ImVec4(0.14f, 0.16f, 0.22f, 1.0f);
}

// Draw commands in the last frame (each is one glDrawElements).
int draw_calls() {
  const ImDrawData* d = ImGui::GetDrawData();
  int n = 0;
  for (int k = 0; d && k < d->CmdListsCount; ++k) n += d->CmdLists[k]->CmdBuffer.Size;
  return n;
}

// The window's key, character and mouse-button events, handed to ImGui in order and at most one transition of a
// key or button per frame. ImGui 1.86 reads which keys are down when a frame starts, not the events: a tap whose
// press and release both arrive within one frame (xdotool, a remote desktop, a quick finger during a slow
// software-rendered frame) would never be seen as pressed, and a quick click would wait for the next frame's
// event. Queued, the release comes in the next frame, and the loop draws that frame at once.
struct InputEvent {
  enum Kind { Key, Char, Mouse } kind;
  int code, scancode, action, mods;  // Char: code is the character
};
struct InputQueue {
  GLFWkeyfun imgui_key = nullptr;
  GLFWcharfun imgui_char = nullptr;
  GLFWmousebuttonfun imgui_mouse = nullptr;
  std::deque<InputEvent> pending;
} input;

void on_key(GLFWwindow*, int key, int scancode, int action, int mods) {
  input.pending.push_back({InputEvent::Key, key, scancode, action, mods});
}
void on_char(GLFWwindow*, unsigned int c) { input.pending.push_back({InputEvent::Char, int(c), 0, 0, 0}); }
void on_mouse(GLFWwindow*, int button, int action, int mods) {
  input.pending.push_back({InputEvent::Mouse, button, 0, action, mods});
}

// Installs the queue in front of ImGui's callbacks (call after ImGui_ImplGlfw_InitForOpenGL).
void queue_input(GLFWwindow* w) {
  input.imgui_key = glfwSetKeyCallback(w, on_key);
  input.imgui_char = glfwSetCharCallback(w, on_char);
  input.imgui_mouse = glfwSetMouseButtonCallback(w, on_mouse);
}

// F12: the window as the next free flashlab-viz-NNN.png in the current directory.
std::string next_screenshot_path() {
  char name[32];
  for (int k = 1;; ++k) {
    std::snprintf(name, sizeof name, "flashlab-viz-%03d.png", k);
    if (!std::filesystem::exists(name) || k >= 999) return name;
  }
}

// Hands ImGui this frame's share of the queue: events in order, until the next one would be
//   - a second transition of a key or button in this frame (the press must be seen before the release),
//   - a change of shift, ctrl, alt or super after a key press or click in this frame (xdotool's shift+Right
//     releases shift before Right: the press must be seen with the modifiers it came with), or
//   - a character after a key press, or a key press after a character (ImGui takes a frame's characters before
//     its keys: a Backspace and the letters around it stay in order).
void deliver_input(GLFWwindow* w, AppState& st) {
  std::set<int> changed;  // keys; buttons as -1 - button
  bool pressed = false, typed = false;
  while (!input.pending.empty()) {
    const InputEvent e = input.pending.front();
    const bool modifier = e.kind == InputEvent::Key && e.code >= GLFW_KEY_LEFT_SHIFT && e.code <= GLFW_KEY_RIGHT_SUPER;
    if (e.kind == InputEvent::Char) {
      if (pressed) break;
      typed = true;
    } else if (e.action != GLFW_REPEAT) {
      if (!changed.insert(e.kind == InputEvent::Key ? e.code : -1 - e.code).second) break;
      if (modifier && pressed) break;
      if (!modifier && e.action == GLFW_PRESS) {
        if (typed) break;
        pressed = true;
      }
    }
    input.pending.pop_front();
    if (e.kind == InputEvent::Key && e.code == GLFW_KEY_F12 && e.action == GLFW_PRESS)
      st.screenshot_request = next_screenshot_path();  // whoever has the keyboard
    if (e.kind == InputEvent::Key && input.imgui_key) input.imgui_key(w, e.code, e.scancode, e.action, e.mods);
    if (e.kind == InputEvent::Char && input.imgui_char) input.imgui_char(w, static_cast<unsigned int>(e.code));
    if (e.kind == InputEvent::Mouse && input.imgui_mouse) input.imgui_mouse(w, e.code, e.action, e.mods);
  }
}

// --state-file: rewritten after each frame whose state differs from the last one written.
struct StateFile {
  std::string path, written;
  bool said = false;
  // False when the file cannot be written (said once on stderr).
  bool update(GLFWwindow* w, const AppState& st) {
    if (path.empty()) return true;
    WindowState ws;
    glfwGetWindowSize(w, &ws.width, &ws.height);
    ws.focused = glfwGetWindowAttrib(w, GLFW_FOCUSED) != 0;
    ws.text_input = ImGui::GetIO().WantTextInput;
    std::string text = state_json(st, ws);
    if (text == written) return true;
    try {
      write_file_atomically(path, text);
      written = std::move(text);
      return true;
    } catch (const InputError& e) {
      if (!said) std::fprintf(stderr, "flashlab-viz: --state-file: %s\n", e.what());
      said = true;
      return false;
    }
  }
};

void render_frame(GLFWwindow* w, AppState& st) {
  glfwPollEvents();
  deliver_input(w, st);
  ImGui_ImplOpenGL3_NewFrame();
  ImGui_ImplGlfw_NewFrame();
  ImGui::NewFrame();
  probe::clear();
  advance(st, ImGui::GetIO().DeltaTime);
  draw_panels(st);
  ImGui::Render();
  int fw, fh;
  glfwGetFramebufferSize(w, &fw, &fh);
  glViewport(0, 0, fw, fh);
  glClearColor(kBackground[0], kBackground[1], kBackground[2], 1.0f);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
}

// compression_level: 9 for --screenshot's files, which are kept (figures); a low one in the window, where the
// frame waits for it (at 1400x860 level 9 held the frame about 0.3 s longer than level 1, for files 2% smaller).
void save_shot(GLFWwindow* w, AppState& st, const std::string& path, const std::string& layout_path,
               const std::string& comment, bool palette = false, int compression_level = 9) {
  int fw, fh;
  glfwGetFramebufferSize(w, &fw, &fh);
  save_framebuffer_png(path, fw, fh, comment, palette, compression_level);
  if (!layout_path.empty()) write_text_file(layout_path, probe::json());
  st.status = "saved " + path;
  st.last_screenshot = path;
  ++st.screenshots_saved;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"flashlab-viz: replays the tile traffic of FlashLab's tiled loop nest (HBM <-> SRAM)."};
  Flags f;
  cli.add_option("--scenario", f.scenario_file, "scenario JSON (viz/scenarios/*.json); flags given too override it");
  cli.add_option("--algorithm", f.algorithm, "standard | fa1 | fa2");
  cli.add_option("--pass", f.pass, "forward | backward");
  cli.add_option("--seq", f.seq, "sequence length N (seq_q = seq_k)");
  cli.add_option("--head-dim", f.head_dim, "head dimension d (1..256)");
  cli.add_option("--sram-bytes", f.sram_bytes, "SRAM size M in bytes (default: 228 KiB, one H100 SM)");
  cli.add_option("--br", f.br, "query block rows Br (0: from M)");
  cli.add_option("--bc", f.bc, "key block columns Bc (0: from M)");
  cli.add_flag("--causal", f.causal_flag, "causal mask, top-left aligned");
  cli.add_option("--causal-align", f.causal, "none | top-left | bottom-right");
  cli.add_option("--dtype", f.dtype, "f64 | f32 | f16 | bf16 (bytes per element moved)");
  cli.add_option("--compare", f.compare, "second algorithm for the Compare panel");
  cli.add_option("--panels", f.panels, "comma-separated panel ids to show (default: all)");
  cli.add_option("--step", f.step, "events applied (default: all)");
  cli.add_option("--screenshot", f.screenshot, "render, save the window as PNG, exit");
  cli.add_option("--dump-layout", f.dump_layout, "with --screenshot: write the tiles' screen rectangles as JSON");
  cli.add_flag("--no-wait", f.no_wait, "with --screenshot: save the first frame, without waiting for the panels' workers");
  cli.add_flag("--png-palette", f.png_palette, "write the screenshot with 256 colours (small files for docs)");
  cli.add_option("--size", f.size, "window size WIDTHxHEIGHT (default 1600x1000)");
  cli.add_option("--bench-frames", f.bench_frames, "render this many frames (plots shown, playing), print frame times, exit");
  cli.add_option("--bench-dir", f.bench_dir, "measured GPU results (default: bench/results)");
  cli.add_option("--state-file", f.state_file,
                 "after each frame in which it changed, rewrite FILE (FILE.tmp, then renamed) with the state as JSON: "
                 "step, events, algorithm, pass, N, d, compare, panels shown, playing, window size, focus, screenshots "
                 "saved, and the rectangles of the Controls panel's combo boxes (and their open lists' entries) and "
                 "Panels checkboxes; for tests that drive the window (viz/tests/drive_test.sh)");
  cli.footer(
      "Keys in the window, whichever panels are shown: space plays or pauses, left/right step one event (with shift: "
      "one percent), home/end jump to either end; not while a text field has the keyboard (Enter, Escape or a click "
      "elsewhere gives it back). F12 saves the window as the next free flashlab-viz-NNN.png in the current "
      "directory.");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "flashlab-viz: %s (see --help)\n", e.what());
    return kExitBadInput;
  }

  const auto started = std::chrono::steady_clock::now();
  std::string command_line = "flashlab-viz";  // written into each screenshot's PNG comment
  for (int k = 1; k < argc; ++k) command_line += std::string(" ") + argv[k];
  AppState st;
  Scenario s;
  try {
    s = scenario_from(f);
  } catch (const InputError& e) {
    std::fprintf(stderr, "flashlab-viz: %s\n", e.what());
    return kExitBadInput;
  }
  set_visible_from(st, s);
  if (!apply_scenario(st, s)) {
    std::fprintf(stderr, "flashlab-viz: %s\n", st.error.c_str());
    return kExitBadInput;
  }
  load_bench(st, f.bench_dir);

  const bool headless = !f.screenshot.empty() || f.bench_frames > 0;
  // Mesa's software renderer reallocates its vertex and index buffers every frame. With glibc's
  // default, blocks over 128 KiB are fresh mmaps, so every frame page-faults them in again (a third
  // of a frame's time under llvmpipe); from the heap they are reused.
  constexpr int kMmapThreshold = 64 << 20;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, 2 * kMmapThreshold);
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr,
                 "flashlab-viz: no display is available (%s), so no window can open; run it under xvfb-run -a for "
                 "--screenshot, or use `flashlab trace` in a terminal.\n",
                 glfw_error.empty() ? "GLFW could not start" : glfw_error.c_str());
    return kExitNoDisplay;
  }
  const char* glsl = nullptr;
  GLFWwindow* window = open_window(s, !headless, &glsl);
  if (!window) {
    std::fprintf(stderr, "flashlab-viz: could not open an OpenGL 3 window (%s).\n", glfw_error.c_str());
    glfwTerminate();
    return kExitNoDisplay;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  setup_style();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init(glsl);
  queue_input(window);
  StateFile state_file{f.state_file, "", false};

  int rc = 0;
  if (headless) {
    // The panels' workers (sweeps, the GPU level, the measured points' model) finish before a screenshot, so
    // every screenshot shows the same thing; frames are drawn meanwhile, as in the window. --no-wait takes the
    // first frame as it is.
    const auto t0 = std::chrono::steady_clock::now();
    const auto seconds_since = [](auto t) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(); };
    render_frame(window, st);  // a drawn Plots panel starts the GPU level's sweep
    glfwSwapBuffers(window);
    if (f.no_wait) std::fprintf(stderr, "flashlab-viz: first frame drawn %.2f s after start\n", seconds_since(started));
    bool said = false;
    while (!f.no_wait && working(st) && seconds_since(t0) < kSweepWaitSeconds) {
      if (!said && seconds_since(t0) > 1.0) {
        std::fprintf(stderr, "flashlab-viz: waiting for the panels' workers before the screenshot (%s)\n", busy_with(st).c_str());
        said = true;
      }
      render_frame(window, st);
      glfwSwapBuffers(window);
      // Nobody watches these frames: draw few, and leave the cores (a software renderer's too) to the workers.
      std::this_thread::sleep_for(kHeadlessFrameInterval);
    }
    if (said) std::fprintf(stderr, "flashlab-viz: the workers finished after %.1f s\n", seconds_since(t0));
    if (working(st) && !f.no_wait)
      std::fprintf(stderr, "flashlab-viz: %s still running after %.0f s; the screenshot shows what is done so far\n",
                   busy_with(st).c_str(), seconds_since(t0));
    for (int k = 0; k < (f.no_wait ? 0 : kSettleFrames); ++k) {
      render_frame(window, st);
      glfwSwapBuffers(window);
    }
    if (f.bench_frames > 0) {
      st.playing = true;
      std::vector<double> ms;
      for (int k = 0; k < f.bench_frames; ++k) {
        const auto a = std::chrono::steady_clock::now();
        render_frame(window, st);
        glFinish();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
        glfwSwapBuffers(window);
        if (!st.playing) seek(st, 0), st.playing = true;
      }
      std::sort(ms.begin(), ms.end());
      const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / double(ms.size());
      std::printf("bench-frames: %d frames at %dx%d, N=%d d=%d %s (%s events): mean %.2f ms, median %.2f ms, "
                  "p95 %.2f ms, max %.2f ms; %d vertices, %d draw calls a frame; renderer: %s\n",
                  f.bench_frames, s.width, s.height, s.seq_q, s.head_dim, to_string(s.algorithm),
                  std::to_string(st.replay->size()).c_str(), mean, ms[ms.size() / 2], ms[ms.size() * 95 / 100],
                  ms.back(), ImGui::GetIO().MetricsRenderVertices, draw_calls(), reinterpret_cast<const char*>(glGetString(GL_RENDERER)));
    }
    if (!f.screenshot.empty()) {
      st.playing = false;
      seek(st, start_event(s, st.replay->size()));
      render_frame(window, st);
      try {
        save_shot(window, st, f.screenshot, f.dump_layout, command_line, f.png_palette);
        std::printf("flashlab-viz: wrote %s\n", f.screenshot.c_str());
        if (!state_file.update(window, st)) rc = kExitBadInput;
      } catch (const InputError& e) {
        std::fprintf(stderr, "flashlab-viz: %s\n", e.what());
        rc = kExitBadInput;
      }
    }
  } else {
    bool first = true;
    while (!glfwWindowShouldClose(window)) {
      // Idle (nothing playing or computing, no input queued): sleep until an event, so the app costs nothing at rest.
      if (!st.playing && !working(st) && input.pending.empty()) glfwWaitEventsTimeout(0.25);
      render_frame(window, st);
      if (!st.screenshot_request.empty()) {
        try {
          const std::string comment = "flashlab-viz (in the window): " + to_json(st.scenario);
          save_shot(window, st, st.screenshot_request, "", comment, false, kInteractiveCompression);
        } catch (const InputError& e) {
          st.status = e.what();
        }
        st.screenshot_request.clear();
      }
      glfwSwapBuffers(window);
      if (!state_file.update(window, st) && first) {  // a path that cannot be written: say so at once, and stop
        rc = kExitBadInput;
        break;
      }
      first = false;
    }
  }
  st.cancel_work();
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return rc;
}
