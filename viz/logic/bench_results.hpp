#pragma once
// Measured GPU results from bench/results/*.json (written by `flashlab bench` on the lent GPU), for
// the Plots panel's time and roofline plots. The reader is tolerant of layout: any JSON object that
// names a sequence length and a forward time is a point; its device is the nearest "device" field.
#include <string>
#include <vector>

namespace flashlab::viz {

struct BenchPoint {
  std::string file, device, variant, dtype;
  int seq = 0, head_dim = 0;
  int batch = 1, heads = 1;     // the measured time covers batch * heads heads
  double modeled_bytes = 0;     // the bench's own modeled HBM bytes (forward), or 0
  bool causal = false;
  double forward_ms = 0;
  double tflops = 0;  // as recorded, or 0
};

struct BenchResults {
  std::vector<BenchPoint> points;
  std::vector<std::string> errors;  // one sentence per unreadable file
};

BenchResults read_bench_results(const std::string& directory);
// Reads one file's text (exposed for tests).
void parse_bench_json(const std::string& text, const std::string& file, BenchResults& out);

}  // namespace flashlab::viz
