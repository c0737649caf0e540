#include "app_state.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/flops.hpp"
#include "logic/format.hpp"
#include "registry/variants.hpp"
#include "panels.hpp"

namespace flashlab::viz {

namespace {
// Playing the whole stream takes about this long at the default speed.
constexpr double kDefaultPlaySeconds = 30.0;

// What the count-only sweep depends on: the scenario less its length, step and view.
std::string traffic_sweep_key(const Scenario& s) {
  return std::to_string(s.head_dim) + " " + std::to_string(s.sram_bytes) + " " + to_string(s.causal) + " " +
         to_string(s.dtype) + " " + std::to_string(int(s.pass)) + " " + std::to_string(s.br) + " " + std::to_string(s.bc);
}

// The memory chart's note replays one head of the scenario's problem through the L2 model: up to a second or two.
void start_gpu_note(AppState& st) {
  st.note_job.cancel();
  {
    std::lock_guard lock(st.note_job.mutex);
    st.gpu_note.clear();
  }
  const Scenario s = st.scenario;
  st.note_job.start([&st, s](Job& job) {
    job.set_activity("modeling this problem on the " + s.gpu + "'s L2");
    std::string note = gpu_note(s);
    std::lock_guard lock(job.mutex);
    st.gpu_note = std::move(note);
  });
}

}  // namespace

bool apply_scenario(AppState& st, const Scenario& s) {
  try {
    validate(s);
    auto trace = std::make_unique<Trace>(record_trace(s, s.algorithm));
    std::unique_ptr<Trace> other;
    if (s.compare) other = std::make_unique<Trace>(record_trace(s, *s.compare));
    FootprintCounter fc(trace->Tr, trace->Tc);
    for (const TileEvent& e : trace->events) fc.on_event(e);
    SoftmaxTrace softmax = trace_online_softmax(*trace, s.seed);

    st.replay.reset();
    st.compare_replay.reset();
    st.trace = std::move(trace);
    st.compare_trace = std::move(other);
    st.replay = std::make_unique<Replay>(*st.trace);
    if (st.compare_trace) st.compare_replay = std::make_unique<Replay>(*st.compare_trace);
    st.trace_footprint_bytes = fc.footprint_bytes();
    st.softmax = std::move(softmax);
    const bool sweep_changed = s.head_dim != st.scenario.head_dim || s.sram_bytes != st.scenario.sram_bytes ||
                               s.causal != st.scenario.causal || s.dtype != st.scenario.dtype ||
                               s.pass != st.scenario.pass || s.br != st.scenario.br || s.bc != st.scenario.bc ||
                               st.sweep.points.empty();
    st.scenario = s;
    st.edit = s;
    st.error.clear();
    st.speed = std::max(1.0, double(st.replay->size()) / kDefaultPlaySeconds);
    seek(st, start_event(s, st.replay->size()));
    if (sweep_changed) start_sweep(st);
    start_gpu_note(st);
    return true;
  } catch (const InputError& e) {
    st.error = e.what();
    st.edit = s;
    return false;
  }
}

void seek(AppState& st, std::int64_t step) {
  if (!st.replay) return;
  st.replay->seek(step);
  if (st.compare_replay)
    st.compare_replay->seek(lockstep(st.replay->step(), st.replay->size(), st.compare_replay->size()));
}

void advance(AppState& st, double dt) {
  if (!st.playing || !st.replay) return;
  st.phase += dt * st.speed;
  const auto whole = static_cast<std::int64_t>(std::floor(st.phase));
  st.phase -= double(whole);
  if (whole > 0) seek(st, st.replay->step() + whole);
  if (st.replay->step() >= st.replay->size()) {
    st.playing = false;
    st.phase = 0;
  }
}

void start_sweep(AppState& st) {
  st.sweep_job.cancel();
  const Scenario s = st.scenario;
  const std::string key = traffic_sweep_key(s);
  {
    std::lock_guard lock(st.sweep_job.mutex);
    if (const auto done = st.traffic_sweeps_done.find(key); done != st.traffic_sweeps_done.end()) {
      st.sweep = done->second;
      return;
    }
  }
  st.sweep_job.start([&st, s, key](Job& job) {
    run_traffic_sweep(job, s, st.sweep);
    std::lock_guard lock(job.mutex);
    if (!job.stop_requested()) st.traffic_sweeps_done[key] = st.sweep;
  });
}

void ensure_gpu_sweep(AppState& st) {
  const Scenario& s = st.scenario;
  const std::string key = gpu_variant_of(s) + " " + s.gpu + " " + std::to_string(s.head_dim) + " " + to_string(s.causal) +
                          " " + st.bench_dir;
  if (key == st.gpu_sweep_key) return;
  st.gpu_sweep_key = key;
  st.gpu_job.cancel();
  {
    std::lock_guard lock(st.gpu_job.mutex);
    if (const auto done = st.gpu_sweeps_done.find(key); done != st.gpu_sweeps_done.end()) {
      st.gpu_sweep = done->second;
      return;
    }
    st.gpu_sweep = GpuSweep{};
  }
  const std::string dir = st.bench_dir;
  st.gpu_job.start([&st, s, dir, key](Job& job) {
    run_gpu_sweep(job, s, dir, st.gpu_sweep);
    std::lock_guard lock(job.mutex);
    if (!job.stop_requested() && job.error.empty()) st.gpu_sweeps_done[key] = st.gpu_sweep;
  });
}

bool working(AppState& st) {
  for (Job* job : st.jobs())
    if (job->running()) return true;
  return false;
}

std::string busy_with(AppState& st) {
  std::string what;
  for (Job* job : st.jobs())
    if (job->running()) {
      const std::string a = job->activity();
      if (!a.empty()) what += (what.empty() ? "" : "; ") + a;
    }
  return what;
}

void start_cpu_timing(AppState& st) {
  st.timing_job.cancel();
  const Scenario s = st.scenario;
  st.timing_job.start([&st, s](Job& job) { run_cpu_timing(job, s, st.timing); });
}

void set_visible_from(AppState& st, const Scenario& s) {
  const auto& reg = panels();
  st.visible.assign(reg.size(), s.panels.empty());
  for (std::size_t k = 0; k < reg.size(); ++k)
    if (std::find(s.panels.begin(), s.panels.end(), reg[k].id) != s.panels.end()) st.visible[k] = true;
    else if (s.panels.empty() && s.timeline.empty() && std::string(reg[k].id) == "pipeline") st.visible[k] = false;  // shown when asked for
    else if (s.panels.empty() && std::string(reg[k].id) == "ring") st.visible[k] = false;  // its own problem: shown when asked for
    else if (s.panels.empty() && std::string(reg[k].id) == "fp8") st.visible[k] = false;  // a recorded study: shown when asked for
}

void load_bench(AppState& st, const std::string& directory) {
  st.bench_dir = directory;  // the recorded DRAM counters too (ensure_gpu_sweep)
  st.bench_job.cancel();
  st.bench = read_bench_results(directory);
  st.fp8_sweep = read_fp8_sweep(directory);
  {
    std::lock_guard lock(st.bench_job.mutex);
    st.bench_intensity.assign(st.bench.points.size(), 0.0);
    st.bench_flops.assign(st.bench.points.size(), 0.0);
  }
  // The points are fixed while the job runs (bench is only replaced here, after cancel()). Thousands of points
  // share a few dozen shapes: each shape's loop nest is counted once.
  st.bench_job.start([&st, base = st.scenario](Job& job) {
    const std::vector<BenchPoint>& points = st.bench.points;
    std::map<std::tuple<int, int, bool, int>, std::pair<double, double>> counted;  // (algorithm, d, causal, N)
    for (std::size_t k = 0; k < points.size() && !job.stop_requested(); ++k) {
      job.set_progress(int(k), int(points.size()));
      const BenchPoint& p = points[k];
      // Longer runs (the 256k and 1M long-sequence results) have billions of tile events: not modeled here.
      if (p.seq <= 0 || p.head_dim <= 0 || p.seq > kSweepMaxLength) continue;
      double flops = 0, intensity = 0;
      if (p.modeled_bytes > 0 && p.tflops > 0) {  // the bench modeled its own bytes: FLOPs = rate * time
        flops = p.tflops * 1e12 * p.forward_ms * 1e-3;
        intensity = flops / p.modeled_bytes;
      } else {
        Scenario s = base;
        s.head_dim = p.head_dim;
        s.causal = p.causal ? CausalAlign::TopLeft : CausalAlign::None;
        s.pass = Pass::Forward;
        Algorithm alg = Algorithm::FA2;
        try {
          alg = find_variant(p.variant).algorithm;
        } catch (const InputError&) {
          // a peer (PyTorch, cuDNN): model it as FA2
        }
        const auto key = std::tuple(int(alg), p.head_dim, p.causal, p.seq);
        if (const auto done = counted.find(key); done != counted.end()) {
          std::tie(flops, intensity) = done->second;
        } else {
          job.set_activity("modeling the measured points' bytes (" + std::string(to_string(alg)) + ", d = " +
                           std::to_string(p.head_dim) + ", N = " + format_length(p.seq) + ")");
          try {
            const SweepPoint pt = count_point(s, alg, p.seq, &job);
            flops = pt.flops;
            intensity = pt.flops / std::max(1.0, pt.hbm_bytes);
          } catch (const InputError&) {
            continue;
          }
          counted[key] = {flops, intensity};
        }
      }
      std::lock_guard lock(job.mutex);
      st.bench_flops[k] = flops;
      st.bench_intensity[k] = intensity;
    }
  });
}

}  // namespace flashlab::viz
