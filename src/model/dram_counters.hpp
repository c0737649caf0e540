#pragma once
// DRAM counters that Nsight Compute recorded on a GPU for one forward pass of a CUDA variant
// (scripts/record_dram_counters.sh writes bench/results/<gpu>-dram-counters.json): what the GPU level of
// the traffic model (model/gpu.hpp) is held to. The reader checks the file's layout and says in one
// sentence what is wrong with a malformed one; the test (tests/test_gpu_counters.cpp) and the app's Plots
// panel read it.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"
#include "model/gpu.hpp"

namespace flashlab {

struct RecordedKernel {
  std::string name;
  std::int64_t grid_size = 0;       // thread blocks launched
  int blocks_per_sm = 0;            // the smallest of ncu's occupancy limits; 0: not recorded
  int block_size = 0;               // threads per block; 0: not recorded
  std::int64_t dram_read_bytes = 0, dram_write_bytes = 0;
};

struct RecordedRun {
  std::string variant, dtype;
  Shape shape;
  CausalAlign causal = CausalAlign::None;
  std::int64_t dram_read_bytes = 0, dram_write_bytes = 0;  // summed over the pass's kernels
  std::vector<RecordedKernel> kernels;                     // in launch order
};

struct DramCounters {
  std::string path;    // where it was read from
  std::string device;  // the GPU's name, as the CUDA runtime gives it
  std::string date, command;
  std::vector<RecordedRun> runs;
};

// <results_dir>/<gpu id>-dram-counters.json: where the script writes a GPU's counters.
std::string dram_counters_path(std::string_view results_dir, const GpuSpec&);
// Throws InputError (one sentence naming `where`) for text that is not a counters file.
DramCounters parse_dram_counters(const std::string& text, const std::string& where);
// Throws InputError when the file cannot be read or is malformed.
DramCounters read_dram_counters(const std::string& path);

}  // namespace flashlab
