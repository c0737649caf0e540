#pragma once
// The subcommands. Each registers its flags on a CLI11 subcommand and runs from them; each
// returns an exit code and throws InputError for bad input (cli.cpp turns it into one line on stderr).
#include <CLI/CLI.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "cli/common.hpp"
#include "registry/check.hpp"

namespace flashlab::cli {

// flashlab check: every available variant on the same fresh random inputs, against naive<double>.
struct CheckCommand {
  ShapeFlags shape;
  OptionFlags options;
  std::string dtype;     // empty: every dtype each variant supports
  std::string variants;  // empty: every variant of the table
  bool backward = false;
  bool list = false;
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;
};

// flashlab verify: a plugin's attention kernel (include/flashlab/plugin.h) through FlashLab's cases and rule.
struct VerifyCommand {
  std::string plugin, symbol = "flashlab_plugin", suite = "quick", dtypes, head_dims;
  std::uint64_t seed = 0;
  CLI::Option* seed_option = nullptr;
  bool no_backward = false;
  bool bench = false;     // after the verdict, time the plugin beside FlashLab's variants (verify_bench.cpp)
  std::string bench_seq;  // --bench-seq: the lengths it times (empty: the defaults)
  CLI::Option* bench_seq_option = nullptr;
  std::string python = "python3";  // --python: the interpreter --bench times PyTorch's SDPA with
  CLI::Option* python_option = nullptr;
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;
};

// flashlab run: one variant on .npy inputs, writing .npy outputs.
struct RunCommand {
  std::string variant, q, k, v, out, lse, dout, dq, dk, dv;
  OptionFlags options;
  std::string dtype;  // empty: the files' dtype
  std::string save_quantized;  // --dtype e4m3: a folder for the quantized inputs (core/npy.hpp, write_e4m3_npy)
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;
};

// flashlab trace: the HBM <-> SRAM traffic of a loop nest, counted without arithmetic. With --variant and
// --gpu: a CUDA variant's kernels on a GPU, three levels side by side (the paper's two-level count, the
// L2 model, the compulsory traffic). With --ring P: ring attention's schedule over P ranks, step by step
// (bytes per link, work and idle time per rank, imbalance; model/ring.hpp).
struct TraceCommand {
  std::string algorithm = "fa2";
  int batch = 1, heads = 1, seq_q = 1024, seq_k = 0, head_dim = 64;
  long long sram_bytes = 0;
  std::string causal = "none";
  int bytes_per_element = 2;
  bool backward = false, json = false, events = false;
  std::string variant, gpu;
  int ring = 0;  // P ranks; 0: no ring
  int heads_kv = 0;  // --ring only; 0: heads
  std::string layout = "contiguous";
  double tflops = 400, link_gbs = 400;
  std::string from_timeline;  // --ring: a measured ring timeline, whose problem and rates the model takes
  std::vector<CLI::Option*> problem_flags;  // what a timeline fixes (shape, mask, layout, pass, element size)
  // The flags of the paper's two-level mode, to refuse them beside --variant (and to require --sram-bytes).
  std::vector<CLI::Option*> two_level_flags;
  // The flags that mean nothing to the ring (--algorithm, --sram-bytes, --events, --variant, --gpu), and
  // the ring's own, to refuse them without --ring.
  std::vector<CLI::Option*> not_ring_flags, ring_flags;
  CLI::Option* sram_option = nullptr;
  CLI::Option* ring_option = nullptr;
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;

 private:
  int run_gpu(std::ostream& out) const;
  int run_ring(std::ostream& out) const;
  int run_ring_timeline(std::ostream& out) const;
};

// flashlab bench: time, TFLOP/s, peak memory and modeled HBM bytes against sequence length.
struct BenchCommand {
  std::string device = "cpu";
  std::string variants;  // empty: every available variant on the device
  std::string seq = "256,512,1024,2048";
  int head_dim = 64;
  std::string causal = "none";
  int batch = 1, heads = 0;  // heads 0: 1 on the CPU, 16 on a GPU
  int heads_kv = 0;          // 0: heads (multi-head); fewer: grouped-query attention
  std::string dtype;         // empty: f32 where the variant supports it, else its first dtype
  bool backward = false;
  bool deterministic = false;  // the backward sums dQ in a fixed order (Options::deterministic)
  int warmup = 1, iters = 5;
  std::string json_path, csv_path;
  std::string timeline_path;  // empty: no timeline; else one forward run's pipeline, written here (cuda-fa3-ws)
  bool one_pass = false;      // exactly one pass inside a profiler range, for Nsight Compute (BenchSettings::one_pass)
  std::string quantize_from;  // --dtype e4m3: the activations' dtype the FP8 pre-pass starts from (BenchSettings)
  bool rotate = false;        // ... and it rotates Q and K first
  std::string backward_grid;  // --backward-grid CONSUMERS,SPLITS,ORDER: cuda-fa3-ws's backward on that grid, not its plan's
  int ring = 0;               // given: ring attention of P ranks on one GPU beside the one-shot kernel (bench_ring.cpp)
  std::string layouts = "contiguous,zigzag,striped";  // --ring: the layouts timed
  CLI::Option* ring_option = nullptr;
  CLI::Option* device_option = nullptr;
  CLI::Option* variants_option = nullptr;
  CLI::Option* warmup_option = nullptr;
  CLI::Option* iters_option = nullptr;
  std::string command_line;  // recorded in the JSON
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;
  int run_ring(std::ostream& out, std::ostream& err) const;  // --ring
};

// flashlab ring: ring attention over NCCL, one process per GPU (ring.cpp). As typed it is the launcher: it
// starts P ranks (this executable again, told its rank through the environment) and joins them.
struct RingCommand {
  int gpus = 0;
  std::string layout = "zigzag";
  ShapeFlags shape;
  std::string causal = "none";
  std::string dtype = "bf16";
  std::string blocks = "cuda-fa3-ws";  // the block kernel
  bool backward = false, check = false, no_one_shot = false;
  std::uint64_t seed = 0;
  CLI::Option* seed_option = nullptr;
  int warmup = 1, iters = 3;
  std::string json_path;
  std::string timeline_path;      // --timeline: the forward's; the backward's beside it (ring_timeline_path)
  std::vector<std::string> argv;  // as typed: the ranks are started with it
  void add_to(CLI::App& app);
  int run(std::ostream& out, std::ostream& err) const;
};

// check's table of rows (check.cpp), which ring --check prints too.
void print_check_table(std::ostream& out, const CheckReport& report);

}  // namespace flashlab::cli
