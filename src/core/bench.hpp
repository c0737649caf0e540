#pragma once
// What a device benchmark is asked for and what it reports: the contract between the kernels' own
// timers (CUDA events) and `flashlab bench`. Timing lives in benchmarks only, never in tests.
#include <cstddef>

namespace flashlab {

// Device timing of one configuration, inputs already resident.
struct BenchSettings {
  int warmup = 3;
  int iters = 20;
  bool backward = true;
};

struct BenchResult {
  double forward_ms = 0;       // median
  double backward_ms = -1;     // median; < 0 when not measured
  std::size_t peak_bytes = 0;  // peak device (or host) memory during the run
  std::size_t io_bytes = 0;    // of which inputs and outputs (q, k, v, o, lse, and grads)
};

}  // namespace flashlab
