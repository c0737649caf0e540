// The app driven frame by frame as its window loop drives it, without a window: ImGui lays out and draws
// every panel into its lists, and nothing is rendered. What it proves: a frame never waits for the panels'
// workers (the first frame is drawn while the Plots panel's GPU-level sweep is still running), what the
// workers finish equals what the logic computes directly, and a sweep is computed once per set of
// parameters in a process.
#include <doctest/doctest.h>
#include <imgui.h>

#include <chrono>
#include <string>
#include <thread>

#include "app/app_state.hpp"
#include "app/panels.hpp"
#include "logic/gpu_sweep.hpp"
#include "logic/sweep.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

const std::string kScenarios = std::string(FLASHLAB_SOURCE_DIR) + "/viz/scenarios/";
const std::string kBenchDir = std::string(FLASHLAB_SOURCE_DIR) + "/bench/results";
constexpr double kWorkLimitSeconds = 600;  // a hang guard: the sweeps take seconds

// An ImGui context with a built font atlas and a window-sized display: what NewFrame needs, no renderer.
struct HeadlessImGui {
  HeadlessImGui() {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(1600, 1000);
    io.DeltaTime = 1.f / 60.f;
    io.BackendFlags |= ImGuiBackendFlags_RendererHasVtxOffset;  // as the OpenGL3 renderer says: big lists are fine
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
  }
  ~HeadlessImGui() { ImGui::DestroyContext(); }
  HeadlessImGui(const HeadlessImGui&) = delete;
  HeadlessImGui& operator=(const HeadlessImGui&) = delete;
};

// One frame as main.cpp's render_frame draws it, less the GL.
void draw_frame(AppState& st) {
  ImGui::NewFrame();
  advance(st, ImGui::GetIO().DeltaTime);
  draw_panels(st);
  ImGui::Render();
}

// Draws frames until the workers finish; returns how many it drew.
int draw_until_idle(AppState& st) {
  const auto t0 = std::chrono::steady_clock::now();
  int frames = 0;
  while (working(st) && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < kWorkLimitSeconds) {
    draw_frame(st);
    ++frames;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE_FALSE(working(st));
  draw_frame(st);  // the finished results, drawn
  return frames + 1;
}

GpuSweep gpu_sweep_of(AppState& st) {
  std::lock_guard lock(st.gpu_job.mutex);
  return st.gpu_sweep;
}

}  // namespace

TEST_CASE("the first frame is drawn while the GPU level's sweep runs, and the finished sweep equals the model's points") {
  HeadlessImGui imgui;
  AppState st;
  const Scenario s = load_scenario_file(kScenarios + "readme-overview.json");
  set_visible_from(st, s);
  REQUIRE(apply_scenario(st, s));
  load_bench(st, kBenchDir);

  draw_frame(st);  // the Plots panel, drawn, starts the GPU level's sweep
  INFO("busy with: ", busy_with(st));
  CHECK(st.gpu_job.running());  // the frame came back without waiting for it
  CHECK(!busy_with(st).empty());  // and the panels can say what is being computed
  CHECK(draw_until_idle(st) > 1);  // frames went on while the workers worked
  {
    std::lock_guard lock(st.gpu_job.mutex);
    CHECK(st.gpu_job.error.empty());
  }

  const GpuSweep done = gpu_sweep_of(st);
  REQUIRE_FALSE(done.points.empty());
  CHECK(done.points.front().n == 1024);
  for (const GpuLevelPoint& p : done.points) {  // each point as the model computes it, on this thread
    CAPTURE(p.n);
    const GpuLevelPoint direct = model_point(st.scenario, p.n);
    CHECK(p.two_level_read == direct.two_level_read);
    CHECK(p.dram_read == direct.dram_read);
    CHECK(p.compulsory_read == direct.compulsory_read);
    CHECK(p.dram_written == direct.dram_written);
    CHECK(p.dirty_at_end == direct.dirty_at_end);
  }
  GpuSweep measured;
  read_measured(st.scenario, kBenchDir, measured);
  REQUIRE(done.measured.size() == measured.measured.size());
  for (std::size_t k = 0; k < measured.measured.size(); ++k) {
    CHECK(done.measured[k].n == measured.measured[k].n);
    CHECK(done.measured[k].dram_read == measured.measured[k].dram_read);
  }

  // The count-only sweep and the memory chart's note, finished on their workers, equal the direct calls.
  TrafficSweep sweep;
  {
    std::lock_guard lock(st.sweep_job.mutex);
    sweep = st.sweep;
  }
  REQUIRE(sweep.algorithms.size() == sweep.points.size());
  for (std::size_t a = 0; a < sweep.algorithms.size(); ++a) {
    REQUIRE(sweep.points[a].size() == sweep_lengths(256, 131072).size());
    for (const SweepPoint& p : sweep.points[a]) {
      const SweepPoint direct = count_point(st.scenario, sweep.algorithms[a], p.n);
      CHECK(p.hbm_bytes == direct.hbm_bytes);
      CHECK(p.footprint_bytes == direct.footprint_bytes);
    }
  }
  {
    std::lock_guard lock(st.note_job.mutex);
    CHECK(st.gpu_note == gpu_note(st.scenario));
  }
}

TEST_CASE("a GPU-level sweep is computed once per set of parameters: coming back to a head dim shows it at once") {
  HeadlessImGui imgui;
  AppState st;
  Scenario s = load_scenario_file(kScenarios + "readme-overview.json");
  s.panels = {"plots"};
  set_visible_from(st, s);
  REQUIRE(apply_scenario(st, s));
  load_bench(st, kBenchDir);
  draw_frame(st);
  draw_until_idle(st);
  const GpuSweep first = gpu_sweep_of(st);
  REQUIRE_FALSE(first.points.empty());

  Scenario other = s;
  other.head_dim = 128;
  REQUIRE(apply_scenario(st, other));
  draw_frame(st);
  CHECK(st.gpu_job.running());  // a new set of parameters: computed
  draw_until_idle(st);
  CHECK(gpu_sweep_of(st).head_dim == 128);

  REQUIRE(apply_scenario(st, s));
  draw_frame(st);
  CHECK_FALSE(st.gpu_job.running());  // back to d = 64: kept from the first time
  const GpuSweep again = gpu_sweep_of(st);
  CHECK(again.head_dim == 64);
  REQUIRE(again.points.size() == first.points.size());
  for (std::size_t k = 0; k < first.points.size(); ++k) CHECK(again.points[k].dram_read == first.points[k].dram_read);
}
