#pragma once
// A scenario: everything the app needs to replay one loop nest (algorithm, shape, SRAM size, tiling,
// causal alignment, dtype, step) plus what to show (panels, window size), and the Ring panel's own
// problem (ring attention over P ranks, `"ring": {...}`). Scenarios come from JSON
// files (viz/scenarios/*.json), from command-line flags, or from the Controls panel; all three end in
// the same struct and the same validation, so the app and the command line report the same errors.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpu_reference/tiled.hpp"
#include "cuda/tilings.hpp"
#include "model/gpu.hpp"
#include "model/traffic.hpp"
#include "core/problem.hpp"
#include "ring_view.hpp"

namespace flashlab::viz {

// The H100 the project measured (2026-11-22): the app's one preset of measured rates. What the GPU is
// (SMs, L2) is the traffic model's description (model/gpu.hpp), its SM's shared memory cuda/tilings.hpp's.
struct GpuPreset {
  const GpuSpec& gpu = find_gpu("h100");
  double hbm_bytes_per_s = 3.0e12;        // device-to-device copy, bytes read + written
  double bf16_flops_per_s = 756e12;       // bf16 matrix product (798 at best)
  double bf16_flops_per_s_best = 798e12;
  std::int64_t smem_bytes_per_sm = cuda::kSharedMemoryPerSm;
};
const GpuPreset& h100();

struct Scenario {
  Algorithm algorithm = Algorithm::FA2;
  Pass pass = Pass::Forward;
  int seq_q = 1024, seq_k = 1024, head_dim = 64;
  std::int64_t sram_bytes = cuda::kSharedMemoryPerSm;  // M in bytes; default: one H100 SM's shared memory
  int br = 0, bc = 0;                    // 0: the paper's choice from M (tiling_from_sram)
  CausalAlign causal = CausalAlign::None;
  DType dtype = DType::BF16;             // sets the bytes per element that move
  std::int64_t step = -1;                // events applied; -1: the end of the stream
  std::optional<Algorithm> compare;      // second algorithm for the Compare panel
  std::vector<std::string> panels;       // panel ids to show; empty: all
  int width = 1600, height = 1000;       // window size for screenshots
  std::string caption;                   // drawn in the Controls panel (figures)
  std::uint64_t seed = 1;                // inputs of the Online softmax panel's real run
  std::string timeline, timeline_compare;  // Pipeline panel: Trace Event JSON files (relative: to the scenario file)
  // The GPU level (Plots panel, memory chart): a CUDA variant with a GPU model (empty: the kernel of the
  // algorithm, gpu_variant_of), on a described GPU.
  std::string gpu_variant;
  std::string gpu = "h100";
  // The Ring panel: ring attention over P ranks, its own problem (relative measured and timeline paths: to the
  // scenario file).
  RingSettings ring;
};

// The CUDA variant whose kernels the GPU level replays: the scenario's gpu_variant, or the kernel of its
// algorithm (standard: cuda-naive, fa1: cuda-fa1, fa2: cuda-fa2).
std::string gpu_variant_of(const Scenario&);

// Parses a scenario from JSON text. Throws InputError (one sentence) on malformed JSON, unknown keys,
// wrong types or impossible values; `where` names the file in the message.
Scenario parse_scenario(const std::string& json_text, const std::string& where = "scenario");
Scenario load_scenario_file(const std::string& path);  // throws InputError when unreadable
std::string to_json(const Scenario&);                  // the inverse, for "save scenario"

// The event the transport starts at: the scenario's step; else the first event of its ring step (the
// Ring panel follows the transport, ring_view.hpp); else the end of the stream.
std::int64_t start_event(const Scenario&, std::int64_t events);

// The problem (batch = heads = 1: the app shows one head) and the tiling the scenario implies.
// Throws InputError when the parameters are impossible (e.g. M cannot hold a row each of Q, K, V, O).
Problem to_problem(const Scenario&);
Tiling resolve_tiling(const Scenario&);
int bytes_per_element(const Scenario&);
void validate(const Scenario&);

// The known panel ids, in registry order (the app's registry must list exactly these).
const std::vector<std::string>& panel_ids();

}  // namespace flashlab::viz
