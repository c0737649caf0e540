#pragma once
// Everything the panels share: the scenario on screen, its recorded trace(s) and their replay, the
// transport, the background sweeps and UI options. Panels read and change it; only apply_scenario
// (re)records traces, always through the library's loop nest.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "logic/bench_results.hpp"
#include "logic/fp8_study.hpp"
#include "logic/gpu_sweep.hpp"
#include "logic/replay.hpp"
#include "logic/softmax_trace.hpp"
#include "logic/sweep.hpp"

namespace flashlab::viz {

struct AppState {
  AppState() = default;
  AppState(const AppState&) = delete;
  AppState& operator=(const AppState&) = delete;
  // The workers write into members: stop them before any member goes.
  ~AppState() { cancel_work(); }
  void cancel_work() {
    for (Job* job : jobs()) job->cancel();
  }
  // Every background job, for waiting on them all and stopping them all.
  std::vector<Job*> jobs() { return {&sweep_job, &timing_job, &gpu_job, &note_job, &bench_job}; }

  Scenario scenario;  // what is shown
  Scenario edit;      // what the Controls panel edits; applied when it changes
  std::string error;  // the last InputError (one sentence), shown in Controls in red

  std::unique_ptr<Trace> trace, compare_trace;
  std::unique_ptr<Replay> replay, compare_replay;
  std::int64_t trace_footprint_bytes = 0;
  SoftmaxTrace softmax;

  // Transport: `step` events applied; `phase` in [0, 1) animates the transfer in flight.
  bool playing = false;
  double speed = 20;  // events per second
  double phase = 0;

  // Everything that takes longer than a frame runs on a worker (Job), and the panels draw what is done so
  // far: the first frame comes at once, and the window answers while the model works.
  //
  // Plots: the count-only sweep restarts whenever the scenario's tiling parameters change; CPU timing on request.
  Job sweep_job, timing_job;
  TrafficSweep sweep;  // guarded by sweep_job.mutex
  CpuTiming timing;    // guarded by timing_job.mutex
  // The GPU level: the variant's kernels against N and the counters recorded on the GPU (Plots), and
  // what the L2 model says of the scenario's own problem (memory chart).
  Job gpu_job;
  GpuSweep gpu_sweep;         // guarded by gpu_job.mutex
  std::string gpu_sweep_key;  // what gpu_sweep is (being) computed for
  Job note_job;
  std::string gpu_note;       // guarded by note_job.mutex; empty while it is modeled
  // Sweeps finished in this process, by what they were computed for: coming back to one shows it at once.
  std::map<std::string, TrafficSweep> traffic_sweeps_done;  // guarded by sweep_job.mutex
  std::map<std::string, GpuSweep> gpu_sweeps_done;          // guarded by gpu_job.mutex
  std::string bench_dir;  // where bench/results is: measured points, recorded counters
  BenchResults bench;  // bench/results/*.json (read at start: small files)
  Job bench_job;       // models each measured point's FLOPs and bytes through its variant's loop nest
  // Per point: modeled FLOP/byte and FLOPs (0: not modeled, N beyond kSweepMaxLength); guarded by bench_job.mutex.
  std::vector<double> bench_intensity, bench_flops;
  Fp8Sweep fp8_sweep;    // the FP8 panel's: bench/results/cpu-fp8-outlier-sweep_*.json, the newest (read at start)
  int fp8_head_dim = 0;  // the head dim the FP8 panel shows; 0: the scenario's (or the nearest in the sweep)

  std::vector<bool> visible;  // per registered panel
  bool heat = true;           // heat bars on tiles
  bool follow_block = true;   // Online softmax: follow the current query block
  int softmax_row = 0;
  std::string status;         // Export panel's last message
  std::string screenshot_request;  // a path: main saves the next frame there (Export's PNG button, F12)
  int screenshots_saved = 0;       // how many main saved in this process, the last one's path
  std::string last_screenshot;
};

// Records the trace(s) for `s` and restarts the sweep. On InputError sets state.error, keeps what
// was shown and returns false.
bool apply_scenario(AppState&, const Scenario& s);
void seek(AppState&, std::int64_t step);  // clamps; keeps the compare replay in lock-step
void advance(AppState&, double dt_seconds);  // plays
void start_sweep(AppState&);
// True while any worker runs.
bool working(AppState&);
// What the workers are computing now ("replaying cuda-fa2 on the h100's L2 at N = 32k"); empty when idle.
std::string busy_with(AppState&);
// Starts the GPU level's sweep unless one for the scenario's variant, GPU, head dim and mask (and bench_dir)
// is under way or done: the Plots panel asks for it when drawn.
void ensure_gpu_sweep(AppState&);
void start_cpu_timing(AppState&);
void set_visible_from(AppState&, const Scenario&);  // the scenario's panel list (empty: all)
// Reads bench/results (and the FP8 panel's sweep there), and starts modeling each point's FLOPs and HBM bytes (its
// variant's loop nest) on a worker.
void load_bench(AppState&, const std::string& directory);

}  // namespace flashlab::viz
