// flashlab bench: time, TFLOP/s, peak memory and modeled HBM bytes against sequence length.
// CPU variants are timed with a host clock, each configuration in a forked child, so that its peak
// resident memory (ru_maxrss) belongs to that configuration alone; "extra" is that peak minus the
// child's starting memory and the inputs and outputs, i.e. what the algorithm itself needs (S and P
// for naive attention). CUDA variants time themselves (Variant::bench: CUDA events, device memory).
// --timeline FILE (one cuda-fa3-ws variant, one N): after the timed runs the variant records one run's
// pipeline into FILE (Trace Event JSON) with its timeline build, the forward's or, with --backward, the
// backward's, and the bench prints what that build costs beside the plain kernel.
// --one-pass (CUDA): one pass per row inside cudaProfilerStart / Stop instead of the timing loop, for
// Nsight Compute's counters (scripts/record_dram_counters.sh).
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "cli/commands.hpp"
#include "core/flops.hpp"
#include "cpu_reference/cpu_variants.hpp"
#include "cpu_reference/tiled.hpp"
#include "model/timeline.hpp"

namespace flashlab::cli {
namespace {

constexpr int kDefaultCpuHeads = 1;
constexpr int kDefaultCudaHeads = 16;
// The modeled HBM traffic of a CUDA variant uses the paper's tiling for this much shared memory per
// block (H100: up to 227 KiB per block; FlashAttention-2's forward tiles use about this much).
constexpr std::int64_t kModelSramBytesCuda = 96 * 1024;

struct Row {
  const Variant* variant = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  std::string status = "ok";  // ok | skipped | error
  std::string reason;
  double forward_ms = -1, backward_ms = -1;
  double prepass_ms = -1;  // --quantize-from: the FP8 pre-pass
  std::optional<BackwardGrid> backward_grid;  // the grid cuda-fa3-ws's backward ran on (its plan's, or --backward-grid)
  std::int64_t peak_bytes = -1, io_bytes = -1, extra_bytes = -1;
  std::int64_t hbm_forward = -1, hbm_backward = -1;
  Tiling tiling;
  std::optional<BenchTimeline> timeline;  // --timeline: what was recorded
  std::string timeline_file;              // and where it was written
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Resident set size now, from /proc/self/statm (pages).
std::int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Resets the kernel's peak-RSS mark to the current RSS (Linux >= 4.0), so ru_maxrss measures from here.
bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return bool(clear);
}

// What a forked child sends back through its pipe.
struct ChildReport {
  int ok = 0;
  double forward_ms = -1, backward_ms = -1;
  std::int64_t peak_bytes = 0;   // peak RSS minus the RSS at the child's start
  std::int64_t extra_bytes = 0;  // peak RSS during the timed runs minus (RSS before them + outputs)
  char error[400] = {};
};

std::int64_t output_host_bytes(const Shape& s, bool backward) {
  const std::int64_t q = std::int64_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::int64_t kv = std::int64_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
  const std::int64_t lse = std::int64_t(s.batch) * s.heads_q * s.seq_q;
  return (q + lse + (backward ? q + 2 * kv : 0)) * std::int64_t(sizeof(double));  // o, lse (dq, dk, dv)
}

// Runs in the forked child. Memory is measured over the timed runs only: by then the inputs exist
// and the warm-up has paged in the code, so what the peak adds on top is the outputs and the
// algorithm's working set (S and P for naive attention). A fixed mmap threshold and malloc_trim make
// freed buffers leave the RSS, so one run's leftovers do not hide the next one's peak.
ChildReport time_cpu_in_this_process(const Variant& v, const Problem& p, DType dtype, bool backward, int warmup,
                                     int iters) {
  ChildReport r;
  constexpr int kMmapThreshold = 128 * 1024;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  const std::int64_t rss_at_start = current_rss_bytes();
  const bool reset_at_start = reset_peak_rss();
  const Qkv in = random_qkv(p.shape, dtype, p.options.seed);
  const HostTensor dO = backward ? random_like_o(p.shape, dtype, p.options.seed) : HostTensor();
  using Clock = std::chrono::steady_clock;
  std::vector<double> fwd_ms, bwd_ms;
  std::int64_t rss_before_timed = 0;
  bool reset_before_timed = false;
  for (int it = 0; it < warmup + iters; ++it) {
    if (it == warmup) {
      malloc_trim(0);
      rss_before_timed = current_rss_bytes();
      reset_before_timed = reset_peak_rss();
    }
    const auto t0 = Clock::now();
    const ForwardOut out = v.forward(p, dtype, in, nullptr);
    const auto t1 = Clock::now();
    if (it >= warmup) fwd_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (backward) {
      const auto t2 = Clock::now();
      const Grads g = v.backward(p, dtype, in, out, dO);
      const auto t3 = Clock::now();
      if (it >= warmup) bwd_ms.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const std::int64_t peak = std::int64_t(usage.ru_maxrss) * 1024;  // Linux reports KiB
  // Without the reset (kernels before 4.0) the peak is the whole process's: report it unsubtracted.
  r.peak_bytes = reset_at_start ? peak - rss_at_start : peak;
  r.extra_bytes = reset_before_timed ? peak - rss_before_timed - output_host_bytes(p.shape, backward) : peak;
  r.forward_ms = median(fwd_ms);
  if (backward) r.backward_ms = median(bwd_ms);
  r.ok = 1;
  return r;
}

// Runs one CPU configuration in a forked child and collects its report.
ChildReport time_cpu_forked(const Variant& v, const Problem& p, DType dtype, bool backward, int warmup, int iters) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe() failed");
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork() failed");
  if (pid == 0) {
    close(fds[0]);
    ChildReport r;
    try {
      r = time_cpu_in_this_process(v, p, dtype, backward, warmup, iters);
    } catch (const std::exception& e) {
      std::strncpy(r.error, e.what(), sizeof r.error - 1);
    }
    const ssize_t n = write(fds[1], &r, sizeof r);
    _exit(n == ssize_t(sizeof r) ? 0 : 1);
  }
  close(fds[1]);
  ChildReport r;
  std::size_t got = 0;
  while (got < sizeof r) {
    const ssize_t n = read(fds[0], reinterpret_cast<char*>(&r) + got, sizeof r - got);
    if (n <= 0) break;
    got += std::size_t(n);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != sizeof r) {
    r = ChildReport{};
    const std::string why = WIFSIGNALED(status) ? "the run was killed by signal " + std::to_string(WTERMSIG(status)) +
                                                      (WTERMSIG(status) == SIGKILL ? " (out of memory?)" : "")
                                                : "the run exited without a report";
    std::strncpy(r.error, why.c_str(), sizeof r.error - 1);
  }
  return r;
}

// The modeled HBM bytes: one (batch, head)'s loop nest walked, times B * H_q. The two-level count moves every
// head's tiles alike (tests/test_traffic.cpp holds it), so this is the whole nest's count exactly, at one B * H_q-th
// of the walk. Past kMaxModeledTiles tiles per head (N = 1M at d = 128 is about 1.2e8) the walk would take longer
// than the runs it sits beside (at N = 4M, minutes before the first timed run): -1, and the table says why.
constexpr double kMaxModeledTiles = 2e8;

std::int64_t modeled_hbm_bytes(const Variant& v, Pass pass, const Problem& p, Tiling tiling, DType dtype) {
  const double tiles = std::ceil(double(p.shape.seq_q) / tiling.Br) * std::ceil(double(p.shape.seq_k) / tiling.Bc);
  if (tiles > kMaxModeledTiles) return -1;
  Problem one_head = p;
  one_head.shape.batch = one_head.shape.heads_q = one_head.shape.heads_kv = 1;
  TrafficCounter counter;
  count_traffic(v.algorithm, pass, one_head, tiling, dtype_bytes(dtype), counter);
  return counter.totals().total() * p.shape.batch * p.shape.heads_q;
}

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}


// "2 consumer warpgroups, each group of query heads shared among 2 thread blocks, launched K/V block by K/V block":
// a backward grid as the note under the table says it.
std::string describe_grid(const BackwardGrid& g) {
  return std::to_string(g.consumers) + " consumer warpgroups, " +
         (g.group_splits == 1 ? std::string("each group of query heads whole in one thread block")
                              : "each group of query heads shared among " + std::to_string(g.group_splits) +
                                    " thread blocks") +
         ", launched " + (g.key_blocks_outer ? "K/V block by K/V block" : "row by row");
}
nlohmann::ordered_json backward_grid_json(const BackwardGrid& g) {
  return {{"consumers", g.consumers}, {"group_splits", g.group_splits},
          {"order", g.key_blocks_outer ? "keys" : "rows"}};
}

// --backward-grid CONSUMERS,SPLITS,ORDER, checked against the problem: cuda-fa3-ws's backward on that grid.
BackwardGrid parse_backward_grid(const std::string& text, const Shape& shape) {
  const std::string usage = "--backward-grid takes CONSUMERS,SPLITS,ORDER: 2 or 3 consumer warpgroups, the thread "
                            "blocks sharing each group of query heads, and rows or keys (e.g. 2,1,rows or 3,4,keys), "
                            "not '" + text + "'";
  const std::size_t a = text.find(','), b = a == std::string::npos ? a : text.find(',', a + 1);
  if (b == std::string::npos || text.find(',', b + 1) != std::string::npos) throw InputError(usage);
  const std::string order = text.substr(b + 1);
  BackwardGrid g;
  try {
    std::size_t used = 0;
    g.consumers = std::stoi(text.substr(0, a), &used);
    if (used != a) throw InputError(usage);
    g.group_splits = std::stoi(text.substr(a + 1, b - a - 1), &used);
    if (used != b - a - 1) throw InputError(usage);
  } catch (const std::logic_error&) {  // stoi's invalid_argument and out_of_range
    throw InputError(usage);
  }
  if (order != "rows" && order != "keys") throw InputError(usage);
  g.key_blocks_outer = order == "keys";
  if (g.consumers != 2 && !(g.consumers == 3 && shape.head_dim == 64))
    throw InputError("--backward-grid: cuda-fa3-ws's backward runs 2 consumer warpgroups, or 3 at head dim 64, not " +
                     std::to_string(g.consumers) + " at head dim " + std::to_string(shape.head_dim));
  if (shape.heads_kv < 1 || shape.heads_q % shape.heads_kv != 0) return g;  // (the shape's own check refuses it)
  const int group = shape.heads_q / shape.heads_kv;
  if (g.group_splits < 1 || group % g.group_splits != 0)
    throw InputError("--backward-grid: SPLITS, the thread blocks sharing a group of query heads, divides the query "
                     "heads per K/V head (" + std::to_string(group) + " here), not " + std::to_string(g.group_splits));
  return g;
}

nlohmann::ordered_json to_json(const Row& r, bool backward) {
  nlohmann::ordered_json j;
  j["variant"] = r.variant->name;
  j["device"] = to_string(r.variant->device);
  j["dtype"] = to_string(r.dtype);
  j["batch"] = r.shape.batch;
  j["heads_q"] = r.shape.heads_q;
  j["heads_kv"] = r.shape.heads_kv;
  j["seq_q"] = r.shape.seq_q;
  j["seq_k"] = r.shape.seq_k;
  j["head_dim"] = r.shape.head_dim;
  j["status"] = r.status;
  if (!r.reason.empty()) j["reason"] = r.reason;
  if (r.status != "ok") return j;
  j["forward_ms"] = r.forward_ms;
  if (backward) j["backward_ms"] = r.backward_ms;
  if (r.prepass_ms >= 0) j["prepass_ms"] = r.prepass_ms;
  if (r.backward_grid) j["backward_grid"] = backward_grid_json(*r.backward_grid);
  j["peak_bytes"] = r.peak_bytes;
  j["io_bytes"] = r.io_bytes;
  j["extra_bytes"] = r.extra_bytes;
  j["modeled_hbm_bytes_forward"] = r.hbm_forward;
  if (backward) j["modeled_hbm_bytes_backward"] = r.hbm_backward;
  j["model_tiling"] = {{"Br", r.tiling.Br}, {"Bc", r.tiling.Bc}};
  if (r.timeline) {
    const BenchTimeline& t = *r.timeline;
    j["timeline"] = {{"path", r.timeline_file},
                     {"records", t.records.size()},
                     {"first_block", t.first_block},
                     {"last_block", t.last_block},
                     {"capacity", t.capacity},
                     {"buffer_filled", t.buffer_filled},
                     {"recording_ms", t.recording_ms},
                     {"recording_overhead", t.recording_ms / r.forward_ms - 1}};
    const ConsumerShares shares = consumer_shares(timeline_of(t));
    j["timeline"]["consumer_softmax_share"] = shares.softmax;
    j["timeline"]["consumer_waiting_share"] = shares.waiting;
    j["timeline"]["consumer_lanes"] = shares.lanes;
  }
  return j;
}

// "timeline: 4213 records of blocks 0-3 -> FILE (the recording build ran 2.310 ms, the plain kernel 1.840 ms:
// +26%)", and a second sentence when the record buffer filled up.
std::string timeline_line(const BenchTimeline& t, const std::string& path, double plain_ms) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " (the recording build ran %.3f ms, the plain kernel %.3f ms: %+.0f%%)", t.recording_ms,
                plain_ms, 100 * (t.recording_ms / plain_ms - 1));
  std::string line = "timeline: " + std::to_string(t.records.size()) + " records of blocks " +
                     std::to_string(t.first_block) + "-" + std::to_string(t.last_block) + " -> " + path + buf + "\n";
  const ConsumerShares shares = consumer_shares(timeline_of(t));
  if (shares.lanes > 0) {
    std::snprintf(buf, sizeof buf, "timeline: a consumer warpgroup spent %.1f%% of its time in the softmax and %.1f%% "
                  "waiting at barriers (medians over %d lanes)\n", 100 * shares.softmax, 100 * shares.waiting, shares.lanes);
    line += buf;
  }
  if (t.buffer_filled)
    line += "timeline: the " + std::to_string(t.capacity) +
            "-record buffer filled up, so the run's later events are not in the file (use a shorter run)\n";
  return line;
}

}  // namespace

void BenchCommand::add_to(CLI::App& app) {
  device_option = app.add_option("--device", device, "cpu or cuda")->capture_default_str();
  variants_option =
      app.add_option("--variants", variants, "comma-separated variant names (default: every variant on the device)");
  app.add_option("--seq", seq, "comma-separated sequence lengths N (S_q = S_k = N)")->capture_default_str();
  app.add_option("--head-dim", head_dim, "head dimension d")->capture_default_str();
  app.add_option("--causal", causal, "none, top-left or bottom-right")->capture_default_str();
  app.add_option("--batch", batch, "batch size B")->capture_default_str();
  app.add_option("--heads", heads, "heads H (default: 1 on cpu, 16 on cuda)");
  app.add_option("--heads-kv", heads_kv,
                 "K/V heads (default: --heads; fewer, a divisor of --heads: grouped-query attention, as a Llama's "
                 "16 query heads on 4 K/V heads)");
  app.add_option("--dtype", dtype,
                 "f64, f32, f16, bf16 or e4m3 (default: f32 where supported, else the variant's first). e4m3 (fp8) "
                 "times cuda-fa3-ws's FP8 forward on random e4m3 inputs made on the GPU, its V^T pre-pass included "
                 "(head dims 64, 128 and 256; no --backward; --timeline at 64 and 128)");
  app.add_option("--quantize-from", quantize_from,
                 "with --dtype e4m3: make the FP8 inputs as a model would, from random f32, f16 or bf16 activations on "
                 "the GPU through the quantizing pre-pass (per-head amax and scale, then e4m3), and time that pre-pass "
                 "too: its column, and its share of the forward")
      ->type_name("DTYPE");
  app.add_flag("--rotate", rotate,
               "with --quantize-from: the pre-pass rotates Q and K first (FlashAttention-3's incoherent processing: a "
               "random Hadamard rotation of the head dim, seed 1; head dims 64, 128 and 256)");
  app.add_flag("--backward", backward, "also time the backward pass");
  app.add_option("--backward-grid", backward_grid,
                 "with --backward, cuda-fa3-ws only: time its backward on this grid instead of its launch plan's: "
                 "CONSUMERS (2, or 3 at head dim 64), SPLITS (thread blocks sharing each group of query heads, a "
                 "divisor of --heads / --heads-kv) and the launch ORDER (rows, or keys: K/V block by K/V block), e.g. "
                 "2,1,rows; the table's note names the grid that ran")
      ->type_name("C,S,ORDER");
  app.add_flag("--deterministic", deterministic,
               "with --backward: time the backward that sums dQ in a fixed order (bit-identical run to run)");
  warmup_option = app.add_option("--warmup", warmup, "untimed runs first")->capture_default_str();
  iters_option = app.add_option("--iters", iters, "timed runs (the median is reported)")->capture_default_str();
  app.add_flag("--one-pass", one_pass,
               "run exactly one forward pass per row (one backward too with --backward) and no warm-up or timing "
               "loop, between cudaProfilerStart and cudaProfilerStop, so that `ncu --profile-from-start off` "
               "counts that pass alone (scripts/record_dram_counters.sh); --device cuda; the times are that one run's");
  app.add_option("--json", json_path, "write the results as JSON to this file");
  app.add_option("--csv", csv_path, "write the results as CSV to this file");
  app.add_option("--timeline", timeline_path,
                 "after the timed runs, record one forward run's pipeline, or with --backward one backward run's (its "
                 "first thread blocks, a lane per warpgroup), into FILE.json as Trace Event JSON (the app's Pipeline "
                 "panel, Perfetto) and print what recording costs; one cuda-fa3-ws variant (--device cuda), one --seq")
      ->type_name("FILE.json");
  ring_option = app.add_option("--ring", ring,
                 "time ring attention of P ranks on this one GPU (P streams) beside its block kernel alone on the whole "
                 "problem (cuda-fa3-ws; --variants cuda-fa2 for cuda-fa2 blocks): time, TFLOP/s, and efficiency (the "
                 "one-shot time over the ring's)")
      ->type_name("P");
  app.add_option("--layouts", layouts, "with --ring: comma-separated layouts (contiguous, zigzag, striped)")
      ->capture_default_str();
}

int BenchCommand::run(std::ostream& out, std::ostream& err) const {
  if (ring_option->count() > 0) return run_ring(out, err);
  Device dev;
  if (device == "cpu") {
    dev = Device::Cpu;
  } else if (device == "cuda") {
    dev = Device::Cuda;
  } else {
    throw InputError("unknown device '" + device + "': supported are cpu and cuda");
  }
  if (one_pass) {
    if (dev != Device::Cuda)
      throw InputError("--one-pass brackets one GPU pass for Nsight Compute: it needs --device cuda");
    if (warmup_option->count() > 0 || iters_option->count() > 0)
      throw InputError("--one-pass runs exactly one pass: it takes no --warmup or --iters");
    if (!timeline_path.empty())
      throw InputError("--one-pass runs exactly one pass for Nsight Compute, --timeline a recording build after the "
                       "timed runs: give one of them");
  }
  std::optional<DType> prepass_from;
  if (!quantize_from.empty()) {
    prepass_from = parse_dtype(quantize_from);
    if (dtype.empty() || parse_dtype(dtype) != DType::E4M3)
      throw InputError("--quantize-from makes the inputs of the FP8 forward: give --dtype e4m3 too");
    if (*prepass_from != DType::F32 && *prepass_from != DType::F16 && *prepass_from != DType::BF16)
      throw InputError("--quantize-from " + quantize_from +
                       ": the FP8 pre-pass quantizes f32, f16 or bf16 activations");
    if (one_pass) throw InputError("--one-pass runs the forward alone: it takes no --quantize-from");
  }
  if (rotate && !prepass_from)
    throw InputError("--rotate is done by the FP8 pre-pass: give --dtype e4m3 --quantize-from f32, f16 or bf16 too");
  std::optional<BackwardGrid> grid;
  if (!backward_grid.empty()) {
    if (!backward) throw InputError("--backward-grid chooses the backward's grid: give --backward too");
    if (variants != "cuda-fa3-ws")
      throw InputError("--backward-grid is cuda-fa3-ws's backward grid: give --variants cuda-fa3-ws (and no other)");
    const int heads_q = heads > 0 ? heads : kDefaultCudaHeads;
    grid = parse_backward_grid(backward_grid, Shape{.batch = batch, .heads_q = heads_q,
                                                    .heads_kv = heads_kv != 0 ? heads_kv : heads_q,
                                                    .head_dim = head_dim});
  }
  if (dev == Device::Cuda && !cuda_device_present())
    throw InputError(std::string("--device cuda needs a CUDA GPU and ") +
                     (cuda_device_name().empty() ? "none is available on this machine" : "it is not usable"));
  if (warmup < 0 || iters < 1) throw InputError("--warmup must be >= 0 and --iters >= 1");
  const std::vector<int> seqs = parse_int_list(seq, "--seq");
  const std::string started = utc_now();
  std::string load_average;  // the machine's load when the sweep began: timings on a busy host are noisy
  std::getline(std::ifstream("/proc/loadavg"), load_average);
  const bool fixed_dtype = !dtype.empty();
  const DType only_dtype = fixed_dtype ? parse_dtype(dtype) : DType::F32;

  Problem base;
  base.shape = Shape{batch,
                     heads > 0 ? heads : (dev == Device::Cpu ? kDefaultCpuHeads : kDefaultCudaHeads),
                     0,
                     seqs.front(),
                     seqs.front(),
                     head_dim};
  base.shape.heads_kv = heads_kv != 0 ? heads_kv : base.shape.heads_q;  // validate refuses one below 1
  base.options.causal = parse_causal(causal);
  base.options.seed = 1;
  if (deterministic && !backward)
    throw InputError("--deterministic chooses how the backward sums dQ: give --backward too");
  base.options.deterministic = deterministic;
  validate(base);

  const bool named = !variants.empty();
  std::vector<const Variant*> chosen;
  if (named) {
    chosen = named_variants(variants);
    for (const Variant* v : chosen)
      if (v->device != dev)
        throw InputError("variant " + v->name + " runs on " + to_string(v->device) + ", not on --device " + device);
  } else {
    for (const Variant& v : flashlab::variants())
      if (v.device == dev && v.available()) chosen.push_back(&v);
  }
  auto dtype_for = [&](const Variant& v) {
    if (fixed_dtype) return only_dtype;
    return v.supports_dtype(DType::F32) ? DType::F32 : v.dtypes.front();
  };
  // --timeline records one run: one named variant that can, at one N, forward only.
  if (!timeline_path.empty()) {
    if (!named)
      throw InputError("--timeline records one variant's run: name it with --variants (e.g. --variants "
                       "cuda-fa3-ws-step3)");
    if (chosen.size() > 1)
      throw InputError("--timeline records one variant's run, but --variants names " + std::to_string(chosen.size()) +
                       ": bench them without --timeline, or record them one at a time");
    if (seqs.size() > 1)
      throw InputError("--timeline records one run, but --seq lists " + std::to_string(seqs.size()) +
                       " lengths: give one");
    check_records_timeline(*chosen.front(), base, dtype_for(*chosen.front()), backward);
  }
  // A variant the user named must be able to run the sweep's problem (sizes aside).
  if (named)
    for (const Variant* v : chosen) check_supported(*v, base, dtype_for(*v), backward);

  std::vector<Row> rows;
  const int total = int(chosen.size() * seqs.size());
  int done = 0;
  for (const Variant* v : chosen) {
    for (int n : seqs) {
      Row r;
      r.variant = v;
      r.dtype = dtype_for(*v);
      r.shape = base.shape;
      r.shape.seq_q = r.shape.seq_k = n;
      Problem p = base;
      p.shape = r.shape;
      progress(err, done, total, v->name + " N=" + std::to_string(n));
      try {
        check_supported(*v, p, r.dtype, backward);
        if (v->device == Device::Cpu)
          require_memory(host_bytes_for_run(*v, p.shape, r.dtype, backward), "N = " + std::to_string(n));
        r.tiling = v->device == Device::Cpu
                       ? cpu_variant_tiling(p.shape.head_dim)
                       : tiling_from_sram(kModelSramBytesCuda, p.shape.head_dim, dtype_bytes(r.dtype));
        r.hbm_forward = modeled_hbm_bytes(*v, Pass::Forward, p, r.tiling, r.dtype);
        if (backward) r.hbm_backward = modeled_hbm_bytes(*v, Pass::Backward, p, r.tiling, r.dtype);
      } catch (const InputError& e) {
        r.status = "skipped";
        r.reason = e.what();
      }
      // A timeline was asked for by name: a run that cannot make it stops the command with its sentence
      // (on a line of its own, after the progress bar).
      const bool stop_on_error = !timeline_path.empty();
      if (stop_on_error && r.status != "ok") {
        err << "\n";
        throw InputError(r.reason);
      }
      if (r.status == "ok" && v->has_device_timer()) {
        try {
          const BenchSettings settings{.warmup = one_pass ? 0 : warmup,
                                       .iters = one_pass ? 1 : iters,
                                       .backward = backward,
                                       .record_timeline = !timeline_path.empty(),
                                       .one_pass = one_pass,
                                       .fp8_prepass_from = prepass_from,
                                       .fp8_rotate = rotate,
                                       .backward_grid = grid};
          const BenchResult b = v->bench(p, r.dtype, settings);
          r.forward_ms = b.forward_ms;
          r.prepass_ms = b.prepass_ms;
          r.backward_grid = b.backward_grid;
          r.backward_ms = b.backward_ms;
          r.peak_bytes = std::int64_t(b.peak_bytes);
          r.io_bytes = std::int64_t(b.io_bytes);
          r.extra_bytes = r.peak_bytes - r.io_bytes;
          r.timeline = b.timeline;
          if (r.timeline) {
            write_trace_event_file(timeline_of(*r.timeline), timeline_path);
            r.timeline_file = timeline_path;
          }
        } catch (const InputError& e) {
          if (stop_on_error) {
            err << "\n";
            throw;
          }
          r.status = "skipped";
          r.reason = e.what();
        } catch (const std::exception& e) {
          if (stop_on_error) {
            err << "\n";
            throw;
          }
          r.status = "error";
          r.reason = e.what();
        }
      } else if (r.status == "ok") {
        const ChildReport c = time_cpu_forked(*v, p, r.dtype, backward, warmup, iters);
        if (!c.ok) {
          r.status = "error";
          r.reason = c.error;
        } else {
          r.forward_ms = c.forward_ms;
          r.backward_ms = c.backward_ms;
          r.io_bytes = io_host_bytes(p.shape, backward);
          r.peak_bytes = c.peak_bytes;
          r.extra_bytes = std::max<std::int64_t>(0, c.extra_bytes);
        }
      }
      rows.push_back(r);
      ++done;
    }
  }
  progress(err, done, total, "done");
  err << "\n";

  // The table.
  const std::string device_name = dev == Device::Cpu ? cpu_model() : cuda_device_name();
  out << "bench on " << device_name << ": batch " << base.shape.batch << ", heads " << base.shape.heads_q
      << (base.shape.heads_kv != base.shape.heads_q ? " on " + std::to_string(base.shape.heads_kv) + " K/V heads" : "")
      << ", head_dim " << head_dim << ", causal " << to_string(base.options.causal)
      << (one_pass ? ", one pass per row inside a profiler range (no warm-up, a single timed run)"
                   : ", median of " + std::to_string(iters) + " after " + std::to_string(warmup) + " warm-up")
      << "\n";
  out << (dev == Device::Cpu ? "extra memory: peak RSS of the timed runs above the inputs and outputs (one forked "
                               "process per row)"
                             : "extra memory: peak device memory minus inputs and outputs (Variant::bench)")
      << "\nmodeled HBM: bytes moved by the variant's loop nest, counted as `flashlab trace` does (-: not counted past "
      << kMaxModeledTiles << " tiles per head, where the count takes longer than the runs)\n\n";
  std::vector<std::string> header = {"variant", "dtype", "N", "fwd ms", "fwd TFLOP/s"};
  if (backward) header.insert(header.end(), {"bwd ms", "bwd TFLOP/s"});
  if (prepass_from)
    header.insert(header.end(), {std::string("pre-pass ms (") + to_string(*prepass_from) + (rotate ? ", rotated)" : ")"),
                                 "pre-pass / fwd"});
  header.insert(header.end(), {"extra memory", "modeled HBM fwd"});
  Table table(header);
  for (const Row& r : rows) {
    std::vector<std::string> cells = {r.variant->name, to_string(r.dtype), std::to_string(r.shape.seq_q)};
    if (r.status != "ok") {
      cells.push_back(r.status + ": " + r.reason);
      table.add(cells);
      continue;
    }
    const double fwd_flops = forward_flops(r.shape, base.options.causal);
    cells.insert(cells.end(), {format_fixed(r.forward_ms, 3), format_fixed(tflops(fwd_flops, r.forward_ms), 4)});
    if (backward)
      cells.insert(cells.end(), {format_fixed(r.backward_ms, 3),
                                 format_fixed(tflops(backward_flops(r.shape, base.options.causal), r.backward_ms), 4)});
    if (prepass_from)
      cells.insert(cells.end(), {format_fixed(r.prepass_ms, 3), format_fixed(100 * r.prepass_ms / r.forward_ms, 3) + "%"});
    cells.insert(cells.end(), {format_bytes(double(r.extra_bytes)),
                               r.hbm_forward >= 0 ? format_bytes(double(r.hbm_forward)) : "-"});
    table.add(cells);
  }
  table.print(out);
  for (const Row& r : rows)
    if (r.timeline) out << "\n" << timeline_line(*r.timeline, r.timeline_file, backward ? r.backward_ms : r.forward_ms);
  for (const Row& r : rows)
    if (r.backward_grid)
      out << "\n" << r.variant->name << " N=" << r.shape.seq_q << ": the backward ran " << describe_grid(*r.backward_grid)
          << (grid ? " (--backward-grid)" : " (its launch plan's)");
  if (std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.backward_grid.has_value(); })) out << "\n";

  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device_name;
    j["device_kind"] = device;
    if (dev == Device::Cpu) j["cpu_threads"] = sysconf(_SC_NPROCESSORS_ONLN);
    j["command"] = command_line;
    j["date"] = started;  // when the sweep began
    j["settings"] = {{"batch", base.shape.batch},
                     {"heads", base.shape.heads_q},
                     {"heads_kv", base.shape.heads_kv},
                     {"head_dim", head_dim},
                     {"causal", to_string(base.options.causal)},
                     {"backward", backward},
                     {"deterministic", deterministic},
                     {"warmup", one_pass ? 0 : warmup},
                     {"iters", one_pass ? 1 : iters},
                     {"one_pass", one_pass}};
    if (prepass_from) j["settings"]["fp8_prepass"] = {{"from", to_string(*prepass_from)}, {"rotate", rotate}};
    if (!timeline_path.empty()) j["settings"]["timeline"] = timeline_path;
    if (grid) j["settings"]["backward_grid"] = backward_grid_json(*grid);
    if (dev == Device::Cpu) j["load_average_at_start"] = load_average;
    j["notes"] = dev == Device::Cpu
                     ? "one forked process per row. times: host steady_clock, median of the timed runs. peak_bytes: "
                       "ru_maxrss minus the RSS at the child's start (includes the inputs and code paged in). "
                       "extra_bytes: ru_maxrss over the timed runs minus the RSS just before them (inputs resident, "
                       "code paged in by the warm-up) minus the outputs: the algorithm's own working set. io_bytes: "
                       "q, k, v, o, lse (and dO, dq, dk, dv) as double host tensors"
                     : "times and memory from Variant::bench (CUDA events, device memory)";
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      nlohmann::ordered_json row = to_json(r, backward);
      if (r.status == "ok") {
        row["forward_tflops"] = tflops(forward_flops(r.shape, base.options.causal), r.forward_ms);
        if (backward) row["backward_tflops"] = tflops(backward_flops(r.shape, base.options.causal), r.backward_ms);
      }
      list.push_back(row);
    }
    j["rows"] = list;
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) throw InputError("cannot write the JSON results to '" + json_path + "'");
    out << "\nwrote " << json_path << "\n";
  }
  if (!csv_path.empty()) {
    std::ofstream f(csv_path);
    f << "variant,device,dtype,batch,heads,seq,head_dim,causal,status,forward_ms,backward_ms,forward_tflops,"
         "peak_bytes,io_bytes,extra_bytes,modeled_hbm_bytes_forward,reason\n";
    for (const Row& r : rows) {
      std::string reason = r.reason;
      std::replace(reason.begin(), reason.end(), '"', '\'');
      f << r.variant->name << ',' << to_string(r.variant->device) << ',' << to_string(r.dtype) << ',' << r.shape.batch
        << ',' << r.shape.heads_q << ',' << r.shape.seq_q << ',' << r.shape.head_dim << ','
        << to_string(base.options.causal) << ',' << r.status << ',' << r.forward_ms << ',' << r.backward_ms << ','
        << tflops(forward_flops(r.shape, base.options.causal), r.forward_ms) << ',' << r.peak_bytes << ',' << r.io_bytes
        << ',' << r.extra_bytes << ',' << r.hbm_forward << ",\"" << reason << "\"\n";
    }
    if (!f) throw InputError("cannot write the CSV results to '" + csv_path + "'");
    out << "wrote " << csv_path << "\n";
  }
  return kExitOk;
}

}  // namespace flashlab::cli
