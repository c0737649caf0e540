// Plots against sequence length, log axes: HBM traffic and HBM footprint (peak memory) from the
// count-only loop nest up to N = 128k; the DRAM reads of a CUDA variant's kernels on a GPU at the model's
// three levels (two-level, L2 model, compulsory) with the counters Nsight Compute recorded there as points;
// time (live CPU runs of the library on a worker thread, measured GPU results from bench/results/*.json with
// their device, and the H100 roofline model); and a roofline with the measured points. One plotting module
// draws all five (app/plot.cpp).
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "app/panels.hpp"
#include "app/palette.hpp"
#include "app/plot.hpp"
#include "logic/format.hpp"

namespace flashlab::viz {

namespace {

ImU32 series_colour(int k) {
  const auto& c = palette::kSeries[k % palette::kSeriesCount];
  return IM_COL32(c.r, c.g, c.b, 255);
}
std::string fmt_intensity(double i) { return axis_count(i); }

}  // namespace

void draw_plots(AppState& st) {
  const GpuPreset& gpu = h100();
  TrafficSweep sweep;
  CpuTiming timing;
  {
    std::lock_guard lock(st.sweep_job.mutex);
    sweep = st.sweep;
  }
  {
    std::lock_guard lock(st.timing_job.mutex);
    timing = st.timing;
  }
  // What the workers are doing, while they work: the panel draws what is done so far.
  for (Job* job : {&st.sweep_job, &st.gpu_job, &st.bench_job})
    if (job->running()) {
      ImGui::ProgressBar(job->progress(), ImVec2(120, 0));
      ImGui::SameLine();
      ImGui::TextDisabled("%s", job->activity().c_str());
      ImGui::SameLine();
    }
  ImGui::Text("d = %d, M = %s, %s%s", st.scenario.head_dim, format_bytes(double(st.scenario.sram_bytes)).c_str(),
              to_string(st.scenario.dtype), st.scenario.causal != CausalAlign::None ? ", causal" : "");
  ImGui::SameLine();
  if (st.timing_job.running()) {
    ImGui::ProgressBar(st.timing_job.progress(), ImVec2(140, 0), "timing CPU");
    ImGui::SameLine();
    if (ImGui::SmallButton("stop")) st.timing_job.cancel();
  } else if (ImGui::SmallButton("time on this CPU")) {
    start_cpu_timing(st);
  }
  std::string gpu_note = st.bench.points.empty() ? "no GPU results in bench/results yet" : "";
  if (!st.bench.points.empty())
    gpu_note = std::to_string(st.bench.points.size()) + " measured points (bench/results): " + st.bench.points[0].device;
  ImGui::SameLine();
  ImGui::TextDisabled("%s", gpu_note.c_str());

  // Curves from the sweep.
  std::vector<PlotSeries> traffic, memory, model_time;
  for (std::size_t a = 0; a < sweep.algorithms.size() && a < sweep.points.size(); ++a) {
    const std::string name = to_string(sweep.algorithms[a]);
    PlotSeries t{name, {}, {}, series_colour(int(a))}, m{name, {}, {}, series_colour(int(a))};
    PlotSeries tm{name, {}, {}, series_colour(int(a))};
    tm.thickness = 1.f;
    for (const SweepPoint& p : sweep.points[a]) {
      t.x.push_back(p.n), t.y.push_back(p.hbm_bytes);
      m.x.push_back(p.n), m.y.push_back(p.footprint_bytes);
      tm.x.push_back(p.n), tm.y.push_back(std::max(p.hbm_bytes / gpu.hbm_bytes_per_s, p.flops / gpu.bf16_flops_per_s));
    }
    traffic.push_back(t);
    memory.push_back(m);
    model_time.push_back(tm);
    if (sweep.algorithms[a] == Algorithm::FA2) {
      PlotSeries c{"fa2, compulsory", {}, {}, series_colour(3)};
      for (const SweepPoint& p : sweep.points[a]) c.x.push_back(p.n), c.y.push_back(p.compulsory_bytes);
      c.thickness = 1.f;
      traffic.push_back(c);
    }
  }
  if (!memory.empty() && !memory[0].x.empty()) {
    PlotSeries cap{"H100: 80 GB", {memory[0].x.front(), memory[0].x.back()}, {80e9, 80e9}, series_colour(5)};
    cap.markers = false;
    cap.thickness = 1.f;
    memory.push_back(cap);
  }
  std::vector<PlotSeries> times = model_time;
  for (std::size_t k = 0; k < timing.series.size(); ++k) {
    PlotSeries s{timing.series[k].name, timing.series[k].x, timing.series[k].y, series_colour(int(k))};
    s.thickness = 2.5f;
    times.push_back(s);
  }
  // Measured GPU points at this head dim, one series per variant, per head (the bench runs batch *
  // heads of them).
  const int head_dim = st.scenario.head_dim;
  std::vector<std::string> variants;
  for (const BenchPoint& p : st.bench.points)
    if (p.head_dim == head_dim && std::find(variants.begin(), variants.end(), p.variant) == variants.end())
      variants.push_back(p.variant);
  std::vector<PlotSeries> measured_series;
  for (std::size_t v = 0; v < variants.size(); ++v) {
    PlotSeries m{variants[v], {}, {}, series_colour(int(v) + 6)};
    m.line = false;
    for (const BenchPoint& p : st.bench.points)
      if (p.variant == variants[v] && p.head_dim == head_dim) m.x.push_back(p.seq), m.y.push_back(p.forward_ms * 1e-3 / (p.batch * p.heads));
    times.push_back(m);
  }

  std::vector<double> bench_intensity, bench_flops;
  {
    std::lock_guard lock(st.bench_job.mutex);
    bench_intensity = st.bench_intensity;
    bench_flops = st.bench_flops;
  }
  // Roofline: the H100's measured ceilings, this scenario's modeled point, the measured points.
  std::vector<PlotSeries> roof;
  PlotSeries ceiling{"H100 roof", {}, {}, series_colour(5)};
  ceiling.markers = false;
  for (double i = 1; i <= 1e4; i *= 1.25) ceiling.x.push_back(i), ceiling.y.push_back(std::min(gpu.bf16_flops_per_s, gpu.hbm_bytes_per_s * i));
  roof.push_back(ceiling);
  for (std::size_t a = 0; a < sweep.algorithms.size() && a < sweep.points.size(); ++a) {
    PlotSeries s{to_string(sweep.algorithms[a]), {}, {}, series_colour(int(a))};
    s.line = false;
    for (const SweepPoint& p : sweep.points[a]) {
      const double ai = p.flops / std::max(1.0, p.hbm_bytes);
      s.x.push_back(ai), s.y.push_back(std::min(gpu.bf16_flops_per_s, gpu.hbm_bytes_per_s * ai));
    }
    roof.push_back(s);
  }
  for (std::size_t v = 0; v < variants.size(); ++v) {
    PlotSeries m{variants[v], {}, {}, series_colour(int(v) + 6)};
    m.line = false;
    for (std::size_t k = 0; k < st.bench.points.size() && k < bench_intensity.size(); ++k) {
      const BenchPoint& p = st.bench.points[k];
      if (p.variant != variants[v] || p.head_dim != head_dim || bench_intensity[k] <= 0 || p.forward_ms <= 0) continue;
      m.x.push_back(bench_intensity[k]);
      m.y.push_back(p.tflops > 0 ? p.tflops * 1e12 : bench_flops[k] / (p.forward_ms * 1e-3));
    }
    if (!m.x.empty()) roof.push_back(m);
  }

  // DRAM reads of one forward pass of a CUDA variant on a GPU: the three levels of the model, and the counters
  // Nsight Compute recorded there (B = 1, H = 16, as the recording script runs them).
  ensure_gpu_sweep(st);
  GpuSweep gs;
  std::string gpu_error;
  {
    std::lock_guard lock(st.gpu_job.mutex);
    gs = st.gpu_sweep;
    gpu_error = st.gpu_job.error;
  }
  std::vector<PlotSeries> dram;
  {
    PlotSeries two{"paper's count", {}, {}, series_colour(0)}, l2{"L2 model", {}, {}, series_colour(3)},
        floor{"compulsory", {}, {}, series_colour(2)};
    two.thickness = floor.thickness = 1.5f;
    for (const GpuLevelPoint& p : gs.points) {
      two.x.push_back(p.n), two.y.push_back(p.two_level_read);
      l2.x.push_back(p.n), l2.y.push_back(p.dram_read);
      floor.x.push_back(p.n), floor.y.push_back(p.compulsory_read);
    }
    dram = {two, l2, floor};
    PlotSeries measured{gs.measured_device.empty() ? std::string("no counters recorded") : gs.measured_device,
                        {}, {}, series_colour(6)};
    measured.line = false;
    for (const GpuLevelPoint& p : gs.measured) measured.x.push_back(p.n), measured.y.push_back(p.dram_read);
    dram.push_back(measured);
  }

  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 top(avail.x / 3 - 6, avail.y / 2 - 4), cell(avail.x / 2 - 4, avail.y / 2 - 4);
  PlotSpec a{"traffic", "HBM traffic vs N (two-level model)", "N", "bytes", true, true, axis_count, axis_bytes};
  plot(a, traffic, top);
  ImGui::SameLine();
  const std::string gpu_title =
      "DRAM reads/pass: " + gs.variant + ", " + gs.gpu_id +
      (!gpu_error.empty() ? ": " + gpu_error : !gs.measured_error.empty() ? ": " + gs.measured_error
                                             : st.gpu_job.running() ? " (modeling...)" : "");
  const std::string gpu_x = "N (B = " + std::to_string(gs.batch) + ", H = " + std::to_string(gs.heads) +
                            ", d = " + std::to_string(gs.head_dim) + ", causal " + to_string(gs.causal) + ")";
  PlotSpec g{"dram", gpu_title, gpu_x, "bytes", true, true, axis_count, axis_bytes};
  plot(g, dram, top);
  ImGui::SameLine();
  PlotSpec b{"memory", "peak HBM memory vs N (footprint)", "N", "bytes", true, true, axis_count, axis_bytes};
  plot(b, memory, top);
  PlotSpec c{"time", "time vs N: lines H100 model, rings measured per head", "N", "time", true, true, axis_count, axis_seconds};
  plot(c, times, cell);
  ImGui::SameLine();
  PlotSpec d{"roofline", "roofline: H100 3.0 TB/s, 756 TF/s; dots modeled, rings measured (N <= 128k)", "FLOP/byte", "FLOP/s", true, true, fmt_intensity, axis_flops};
  plot(d, roof, cell);
}

}  // namespace flashlab::viz
