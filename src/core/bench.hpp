#pragma once
// What a device benchmark is asked for and what it reports: the contract between the kernels' own
// timers (CUDA events) and `flashlab bench`. Timing lives in benchmarks only, never in tests.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"  // DType
#include "core/timeline_record.hpp"

namespace flashlab {

// cuda-fa3-ws's backward grid (cuda/fa3_ws/fa3_ws_params.hpp, backward_plan): its consumer warpgroups, how many
// thread blocks share each group of query heads, and whether its blocks launch K/V block by K/V block (else row by row).
struct BackwardGrid {
  int consumers = 2;
  int group_splits = 1;
  bool key_blocks_outer = false;
};

// Device timing of one configuration, inputs already resident.
struct BenchSettings {
  int warmup = 3;
  int iters = 20;
  bool backward = true;
  // After the timed runs, record the pipeline of one run (the forward's, or with `backward` the backward's) with
  // the variant's timeline build: BenchResult::timeline (only variants that record one: Variant::records_timeline).
  // (The {} initializer keeps GCC's -Wmissing-field-initializers quiet on BenchSettings{0, 1, false}.)
  bool record_timeline{};
  // Exactly one pass instead of the timing loop: one forward (and one backward with `backward`), no warm-up,
  // bracketed by cudaProfilerStart / cudaProfilerStop, so that `ncu --profile-from-start off` measures that
  // pass and nothing else (the inputs are made before it). The times reported are that one run's.
  bool one_pass = false;
  // The FP8 forward (DType::E4M3) only. Unset: its inputs are random e4m3 bytes made on the GPU. Set: they are made as
  // a model would make them, from random activations of this dtype (F32, F16 or BF16) through the quantizing pre-pass
  // on the GPU (cuda/fp8_quantize.hpp), which is timed too (BenchResult::prepass_ms); with fp8_rotate it rotates Q
  // and K first (the Hadamard rotation, seed 1).
  std::optional<DType> fp8_prepass_from{};
  bool fp8_rotate{};
  // With `backward`, cuda-fa3-ws only: time its backward on this grid instead of the one its plan chooses.
  std::optional<BackwardGrid> backward_grid{};
};

// What a bench with BenchSettings::record_timeline recorded, and what recording costs. The records are the
// kernel's own; model/timeline.hpp turns them into a Timeline (timeline_from_records, with the fields below) and
// writes it, which the caller does (`flashlab bench --timeline FILE`).
struct BenchTimeline {
  std::vector<TimelineRecord> records{};  // in the order the lanes wrote them, the buffer's holes left out
  std::string device{}, variant{};        // what the Timeline names: "NVIDIA H100 80GB HBM3", "cuda-fa3-ws"
  std::string label{};                    // what the run was: "ladder step 3, B=4 H=16 N=4096 d=128, blocks 0-3"
  std::uint32_t producer_warpgroups = 1;  // warpgroups 0 .. this-1 produce (TMA), the rest consume
  std::uint32_t first_block = 0;          // the thread blocks that recorded: first_block .. last_block
  std::uint32_t last_block = 0;
  std::size_t capacity = 0;               // record slots of the device buffer
  bool buffer_filled = false;             // the lanes asked for more slots than that: the run's later events are missing
  double recording_ms = -1;               // median of the timeline build recording the pass (warm-up and iterations as
                                          // the plain pass's: forward_ms, or backward_ms when the backward was recorded)
};

struct BenchResult {
  double forward_ms = 0;       // median
  double backward_ms = -1;     // median; < 0 when not measured
  std::size_t peak_bytes = 0;  // peak device (or host) memory during the run
  std::size_t io_bytes = 0;    // of which inputs and outputs (q, k, v, o, lse, and grads)
  std::optional<BenchTimeline> timeline{};  // set when BenchSettings::record_timeline was
  double prepass_ms = -1;  // the FP8 pre-pass's median (BenchSettings::fp8_prepass_from); < 0 when not timed
  std::optional<BackwardGrid> backward_grid{};  // the grid cuda-fa3-ws's timed backward ran on
};

}  // namespace flashlab
