#pragma once
// The GPU level for the app: a CUDA variant's kernels replayed at three levels against sequence length (the
// paper's two-level count, the L2 model, the compulsory traffic; model/gpu.hpp through registry/gpu_models),
// beside the DRAM bytes Nsight Compute recorded on that GPU (bench/results/<gpu>-dram-counters.json), for the
// Plots panel; and the memory chart's note: what the L2 model says of the scenario's own problem.
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "scenario.hpp"
#include "sweep.hpp"

namespace flashlab::viz {

// One sequence length of a variant: DRAM bytes read (and written) per forward pass at each level.
struct GpuLevelPoint {
  int n = 0;
  double two_level_read = 0, dram_read = 0, compulsory_read = 0;
  double dram_written = 0, dirty_at_end = 0;
};

struct GpuSweep {
  std::string variant, gpu_id, gpu_name;
  int batch = 1, heads = 16, head_dim = 64;
  CausalAlign causal = CausalAlign::None;
  std::vector<GpuLevelPoint> points;     // the model, N = 1k, 2k, ...
  std::vector<GpuLevelPoint> measured;   // the counters recorded on the GPU (dram_read, dram_written)
  std::string measured_device;           // the GPU they were recorded on; empty: none recorded
  std::string measured_error;            // a counters file that could not be read: its sentence
};

// Batch 1 and 16 heads, as the counters are recorded (scripts/record_dram_counters.sh).
constexpr int kGpuSweepBatch = 1, kGpuSweepHeads = 16;

// The recorded counters of the scenario's GPU and variant (gpu_variant_of), at its head dim and causal mask.
void read_measured(const Scenario&, const std::string& results_dir, GpuSweep& out);
// The model at one length.
GpuLevelPoint model_point(const Scenario&, int n);
// Fills `out` (under job.mutex): the measured points, then the model at N = 1k, 2k, ... up to max_n, as long as
// the sweep stays within budget_s: a length is not started when, at four times the last one's time (a replay's
// work grows at least as N^2), it would end past the budget. So the sweep ends on time, and where it ends does
// not hang on one slow moment of a busy machine.
void run_gpu_sweep(Job&, const Scenario&, const std::string& results_dir, GpuSweep& out, int max_n = kSweepMaxLength,
                   double budget_s = 4.0);

// The memory chart's note for the scenario's problem (one head): the CUDA variant of its algorithm
// (standard: cuda-naive, fa1: cuda-fa1, fa2: cuda-fa2, or cuda-fa3-ws when that is the scenario's
// gpu_variant) on the scenario's GPU. One sentence, also when it cannot be modeled (a backward pass, a head dim
// the kernel lacks, a problem too long to replay in the app).
std::string gpu_note(const Scenario&);

}  // namespace flashlab::viz
