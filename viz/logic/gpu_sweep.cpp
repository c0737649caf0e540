#include "gpu_sweep.hpp"

#include <chrono>
#include <filesystem>

#include "format.hpp"
#include "model/dram_counters.hpp"
#include "model/gpu.hpp"
#include "registry/gpu_models.hpp"

namespace flashlab::viz {

namespace {

// One head at most this long is replayed for the memory chart's note on the UI thread.
constexpr int kMaxNoteSeq = 65536;
constexpr int kFirstLength = 1024;

Problem problem_at(const Scenario& s, int batch, int heads, int n) {
  Problem p;
  p.shape = Shape{.batch = batch, .heads_q = heads, .heads_kv = heads, .seq_q = n, .seq_k = n, .head_dim = s.head_dim};
  p.options.causal = s.causal;
  return p;
}

GpuLevelPoint level_point(const GpuTraffic& t, int n) {
  GpuLevelPoint pt;
  pt.n = n;
  pt.two_level_read = double(t.two_level.total_read());
  pt.dram_read = double(t.dram.total_read());
  pt.compulsory_read = double(t.compulsory.total_read());
  pt.dram_written = double(t.dram.total_written());
  pt.dirty_at_end = double(t.dirty_at_end);
  return pt;
}

}  // namespace

void read_measured(const Scenario& s, const std::string& results_dir, GpuSweep& out) {
  const GpuSpec& gpu = find_gpu(s.gpu);
  const std::string path = dram_counters_path(results_dir, gpu);
  out.measured.clear();
  out.measured_device.clear();
  out.measured_error.clear();
  if (!std::filesystem::exists(path)) return;
  try {
    const DramCounters c = read_dram_counters(path);
    for (const RecordedRun& r : c.runs)
      if (r.variant == gpu_variant_of(s) && r.shape.head_dim == s.head_dim && r.causal == s.causal &&
          r.shape.batch == kGpuSweepBatch && r.shape.heads_q == kGpuSweepHeads) {
        GpuLevelPoint pt;
        pt.n = r.shape.seq_q;
        pt.dram_read = double(r.dram_read_bytes);
        pt.dram_written = double(r.dram_write_bytes);
        out.measured.push_back(pt);
      }
    out.measured_device = c.device;
  } catch (const InputError& e) {
    out.measured_error = e.what();
  }
}

GpuLevelPoint model_point(const Scenario& s, int n) {
  const GpuSpec& gpu = find_gpu(s.gpu);
  const Problem p = problem_at(s, kGpuSweepBatch, kGpuSweepHeads, n);
  const GpuForwardPass pass = gpu_forward_pass(gpu_variant_of(s), p, gpu);
  return level_point(model_gpu_traffic(gpu, p.shape, pass.kernels), n);
}

void run_gpu_sweep(Job& job, const Scenario& s, const std::string& results_dir, GpuSweep& out, int max_n,
                   double budget_s) {
  GpuSweep fresh;
  fresh.variant = gpu_variant_of(s);
  fresh.gpu_id = std::string(find_gpu(s.gpu).id);
  fresh.gpu_name = std::string(find_gpu(s.gpu).device_name);
  fresh.batch = kGpuSweepBatch;
  fresh.heads = kGpuSweepHeads;
  fresh.head_dim = s.head_dim;
  fresh.causal = s.causal;
  read_measured(s, results_dir, fresh);
  {
    std::lock_guard lock(job.mutex);
    out = fresh;
  }
  const std::vector<int> ns = sweep_lengths(kFirstLength, max_n);
  constexpr double kGrowth = 4;  // a length's replay over the last one's, at least: the work grows as N^2
  double elapsed = 0;
  for (std::size_t k = 0; k < ns.size(); ++k) {
    if (job.stop_requested()) return;
    job.set_activity("replaying " + fresh.variant + " on the " + fresh.gpu_id + "'s L2 at N = " + format_length(ns[k]));
    const auto t0 = std::chrono::steady_clock::now();
    const GpuLevelPoint pt = model_point(s, ns[k]);  // InputError (a head dim the kernel lacks): the job's error
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard lock(job.mutex);
      out.points.push_back(pt);
    }
    job.set_progress(int(k) + 1, int(ns.size()));
    elapsed += secs;
    if (elapsed + kGrowth * secs > budget_s) break;  // the next length would end past the budget
  }
  job.set_progress(1, 1);
}

std::string gpu_note(const Scenario& s) {
  if (s.pass != Pass::Forward) return "the GPU level models forward kernels; this is a backward pass";
  Scenario own = s;  // the kernel of the scenario's algorithm, or cuda-fa3-ws for FA2 when it is chosen
  own.gpu_variant = s.algorithm == Algorithm::FA2 && s.gpu_variant == "cuda-fa3-ws" ? s.gpu_variant : "";
  const std::string variant = gpu_variant_of(own);
  if (std::max(s.seq_q, s.seq_k) > kMaxNoteSeq)
    return "one head of N > 64k is too long to replay here: `flashlab trace --variant " + variant + " --gpu " + s.gpu +
           "` models it";
  const GpuSpec& gpu = find_gpu(s.gpu);
  Problem p = to_problem(s);
  try {
    const GpuForwardPass pass = gpu_forward_pass(variant, p, gpu);
    const GpuTraffic t = model_gpu_traffic(gpu, p.shape, pass.kernels);
    return variant + " on the " + std::string(gpu.id) + " (Br = " + std::to_string(pass.tiling.Br) + ", Bc = " +
           std::to_string(pass.tiling.Bc) + ", " + to_string(pass.dtype) + ", this one head) reads " +
           format_bytes(double(t.dram.total_read())) + " from DRAM (compulsory " +
           format_bytes(double(t.compulsory.total_read())) + ", the paper's count " +
           format_bytes(double(t.two_level.total_read())) + ") and writes " + format_bytes(double(t.dram.total_written())) +
           " while it runs (" + format_bytes(double(t.dirty_at_end)) + " left dirty in L2)";
  } catch (const InputError& e) {
    return std::string("no GPU level for this scenario: ") + e.what();
  }
}

}  // namespace flashlab::viz
