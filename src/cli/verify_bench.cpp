// flashlab verify --bench: once every case passed, the plugin's forward (and forward + backward, when it has a
// backward) timed on a few large problems, in the dtypes it passed and at a head dim it passed, causal and not, beside
// FlashLab's own variants that run the same problems on the same device. One table: ms, TFLOP/s (core/flops.hpp's
// count, as `flashlab bench` reports), and the time over the fastest FlashLab variant's. FlashLab's CUDA variants time
// themselves as `flashlab bench` times them (Variant::bench: CUDA events); its CPU variants and a plugin on host memory
// are timed here with a host clock; a plugin on CUDA memory with CUDA events on its stream (verify_cuda.cpp).
// PyTorch's scaled_dot_product_attention gets a row too, timed on the same problems and the same device by a Python
// child process (sdpa_child.hpp): CUDA device 0 with CUDA events beside a plugin on CUDA memory, the host CPU with a
// host clock beside one on host memory (PyTorch's CPU SDPA is what a CPU kernel is up against, as FlashLab's CPU
// variants are). The table's `x sdpa` is each time over SDPA's; where SDPA could not be timed, one line says why,
// and verify's exit code stays its verdict's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include "cli/commands.hpp"
#include "cli/sdpa_child.hpp"
#include "cli/verify_plugin.hpp"
#include "core/flops.hpp"

namespace flashlab::cli {
namespace {

// The problems --bench times for a plugin on each kind of memory: B * N = tokens and H * d = width, at each N.
struct BenchPlan {
  int tokens, width, preferred_head_dim;
  std::vector<int> seqs;
};
const BenchPlan kCudaPlan{16384, 2048, 128, {1024, 4096, 16384}};
const BenchPlan kHostPlan{1024, 128, 64, {256, 1024}};  // seconds on a CPU, for a plain C kernel

// One row of the table.
struct BenchRow {
  std::string shape, pass, kernel;
  double ms = -1, flops = 0;
  bool flashlab = false;  // one of FlashLab's variants (the ratio's denominator is the fastest of these)
  std::string note;       // why it has no time
  bool sdpa = false;      // PyTorch's SDPA (x sdpa's denominator)
};

// One problem's rows: the forward's, then the forward + backward's.
struct ProblemRows {
  std::vector<BenchRow> fwd, both;
};

// "sdpa (flash)": SDPA, and the backend PyTorch's dispatcher picked where it said.
std::string sdpa_label(const std::string& backend) { return backend.empty() ? "sdpa" : "sdpa (" + backend + ")"; }

// SDPA's rows joined to each problem's, from its times (one per problem, in order).
void add_sdpa_rows(std::vector<ProblemRows>& groups, const std::vector<SdpaProblem>& asked, const SdpaTimes& sdpa) {
  for (std::size_t n = 0; n < groups.size() && n < sdpa.times.size(); ++n) {
    const SdpaTime& t = sdpa.times[n];
    ProblemRows& g = groups[n];
    const std::string shape = g.fwd.front().shape;  // the plugin's row's
    g.fwd.push_back({shape, "fwd", sdpa_label(t.forward_backend), t.forward_ms, g.fwd.front().flops, false,
                     t.forward_ms < 0 ? "not run: " + t.note : "", true});
    if (!asked[n].backward || g.both.empty()) continue;
    const std::string note = t.forward_backward_ms >= 0 ? ""
                             : t.note.empty()           ? "not run, without saying why"
                                                        : "not run: " + t.note;
    g.both.push_back({shape, "fwd+bwd", sdpa_label(t.forward_backward_backend), t.forward_backward_ms,
                      g.both.front().flops, false, note, true});
  }
}

double host_ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// "bf16 B=16 H=16 N=1024 d=128 causal"
std::string shape_label(const Problem& p, DType dtype) {
  const Shape& s = p.shape;
  return std::string(to_string(dtype)) + " B=" + std::to_string(s.batch) + " H=" + std::to_string(s.heads_q) +
         " N=" + std::to_string(s.seq_q) + " d=" + std::to_string(s.head_dim) +
         (p.options.causal == CausalAlign::None ? "" : " causal");
}

// A CPU variant's forward and backward, timed here as the plugin is (bench_median_ms with a host clock), in this
// process.
BenchResult time_cpu_variant(const Variant& v, const Problem& p, DType dtype, bool backward) {
  require_memory(host_bytes_for_run(v, p.shape, dtype, backward), "the bench's " + v.name + " run");
  const Qkv in = random_qkv(p.shape, dtype, p.options.seed);
  BenchResult r;
  ForwardOut out;
  r.forward_ms = bench_median_ms([&] {
    const auto start = std::chrono::steady_clock::now();
    out = v.forward(p, dtype, in);
    return host_ms_since(start);
  });
  if (backward) {
    const HostTensor d_o = random_like_o(p.shape, dtype, p.options.seed);
    r.backward_ms = bench_median_ms([&] {
      const auto start = std::chrono::steady_clock::now();
      v.backward(p, dtype, in, out, d_o);
      return host_ms_since(start);
    });
  }
  return r;
}

// The dtypes and head dims of the cases the report ran, in order.
std::vector<DType> dtypes_run(const VerifyReport& report) {
  std::vector<DType> dtypes;
  for (const DType t : {DType::F32, DType::F16, DType::BF16})
    if (std::any_of(report.cases.begin(), report.cases.end(), [&](const VerifyCaseResult& r) { return r.c.dtype == t; }))
      dtypes.push_back(t);
  return dtypes;
}
// The head dim of the cases run nearest `preferred` (the larger on a tie).
int head_dim_run(const VerifyReport& report, int preferred) {
  int best = 0;
  for (const VerifyCaseResult& r : report.cases) {
    const int d = r.c.problem.shape.head_dim;
    if (best == 0 || std::abs(d - preferred) < std::abs(best - preferred) ||
        (std::abs(d - preferred) == std::abs(best - preferred) && d > best))
      best = d;
  }
  return best;
}

}  // namespace

double bench_median_ms(const std::function<double()>& run_ms) {
  const double warm_up = run_ms();
  std::vector<double> times;
  for (int n = 0; n < (warm_up > kBenchSlowRunMs ? 1 : kBenchTimedRuns); ++n) times.push_back(run_ms());
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

PluginTimes time_host_plugin(const flashlab_attention_plugin& plugin, const Problem& problem, DType dtype,
                             bool backward) {
  const Shape& s = problem.shape;
  const Qkv in = random_qkv(s, dtype, problem.options.seed);
  HostBuffer q(in.q, dtype), k(in.k, dtype), v(in.v, dtype), o(q_dims(s), dtype);
  std::vector<float> lse(std::size_t(s.batch) * s.heads_q * s.seq_q, NAN);
  const flashlab_problem a = abi_problem(problem, dtype);
  flashlab_forward_args fwd{};
  fwd.q = q.data(), fwd.k = k.data(), fwd.v = v.data(), fwd.o = o.data();
  fwd.lse = plugin.writes_lse ? lse.data() : nullptr;
  fwd.q_strides = q.strides(), fwd.k_strides = k.strides(), fwd.v_strides = v.strides(), fwd.o_strides = o.strides();
  // One call, timed by the host clock.
  const auto timed = [](const char* call, const std::function<int(char*, std::size_t)>& make_call) {
    char message[512] = "";
    const auto start = std::chrono::steady_clock::now();
    const int rc = make_call(message, sizeof message);
    const double ms = host_ms_since(start);
    require_ok(rc, call, message);
    return ms;
  };
  PluginTimes times;
  times.forward_ms = bench_median_ms([&] {
    return timed("forward", [&](char* message, std::size_t size) { return plugin.forward(&a, &fwd, message, size); });
  });
  if (!backward || !plugin.backward) return times;
  if (!plugin.writes_lse) {
    times.no_backward = "the plugin writes no LSE, which its backward reads";
    return times;
  }
  HostBuffer d_o(random_like_o(s, dtype, problem.options.seed), dtype), dq(q_dims(s), dtype), dk(kv_dims(s), dtype),
      dv(kv_dims(s), dtype);
  flashlab_backward_args bwd{};
  bwd.q = q.data(), bwd.k = k.data(), bwd.v = v.data(), bwd.o = o.data(), bwd.d_o = d_o.data();
  bwd.lse = lse.data();  // the plugin's own forward's O and LSE
  bwd.dq = dq.data(), bwd.dk = dk.data(), bwd.dv = dv.data();
  bwd.q_strides = fwd.q_strides, bwd.k_strides = fwd.k_strides, bwd.v_strides = fwd.v_strides;
  bwd.o_strides = fwd.o_strides;
  times.backward_ms = bench_median_ms([&] {
    return timed("backward", [&](char* message, std::size_t size) { return plugin.backward(&a, &bwd, message, size); });
  });
  return times;
}

void print_verify_bench(std::ostream& out, std::ostream& err, const flashlab_attention_plugin& plugin,
                        const VerifyReport& report, const std::vector<int>& seqs, const std::string& python) {
  const bool on_cuda = plugin.memory == FLASHLAB_MEMORY_CUDA;
  const Device device = on_cuda ? Device::Cuda : Device::Cpu;
  const BenchPlan plan = on_cuda ? kCudaPlan : kHostPlan;
  const int head_dim = head_dim_run(report, plan.preferred_head_dim);
  const bool backward = report.backward && plugin.backward != nullptr;
  const std::string name = plugin.name ? plugin.name : "plugin";

  // The problems: each dtype the plugin passed, each N, unmasked and causal (S_q = S_k, so both alignments agree).
  std::vector<std::pair<Problem, DType>> problems;
  for (const DType dtype : dtypes_run(report))
    for (const int n : seqs.empty() ? plan.seqs : seqs)
      for (const CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft}) {
        Problem p;
        p.shape = Shape{.batch = std::max(1, plan.tokens / n), .heads_q = std::max(1, plan.width / head_dim),
                        .heads_kv = std::max(1, plan.width / head_dim), .seq_q = n, .seq_k = n, .head_dim = head_dim};
        p.options.causal = causal;
        p.options.seed = 1;
        validate(p);
        problems.emplace_back(p, dtype);
      }

  std::vector<ProblemRows> groups;        // of the problems the plugin ran
  std::vector<SdpaProblem> sdpa_problems;  // the same problems, for SDPA
  std::vector<std::string> notes;          // what was not timed, and why
  const int steps = int(problems.size()) + 1;  // and SDPA's, all at once
  int done = 0;
  for (const auto& [p, dtype] : problems) {
    const std::string shape = shape_label(p, dtype);
    progress(err, done++, steps, shape);
    const double fwd_flops = forward_flops(p.shape, p.options.causal);
    const double both_flops = fwd_flops + backward_flops(p.shape, p.options.causal);
    // The plugin, when it runs the problem.
    const flashlab_problem a = abi_problem(p, dtype);
    char message[512] = "";
    if (plugin.supports && plugin.supports(&a, message, sizeof message) != 0) {
      notes.push_back(shape + ": " + name + " refuses it: " + (message[0] ? message : "without saying why"));
      continue;
    }
    PluginTimes mine;
    try {
#ifdef FLASHLAB_HAVE_CUDA
      mine = on_cuda ? time_cuda_plugin(plugin, p, dtype, backward) : time_host_plugin(plugin, p, dtype, backward);
#else
      mine = time_host_plugin(plugin, p, dtype, backward);  // a CUDA plugin never gets here without CUDA
#endif
    } catch (const std::exception& e) {
      notes.push_back(shape + ": " + name + " did not run: " + e.what());
      continue;
    }
    if (!mine.no_backward.empty()) notes.push_back(shape + ": forward + backward not timed: " + mine.no_backward);
    const bool with_backward = mine.backward_ms >= 0;
    ProblemRows g;
    g.fwd.push_back({shape, "fwd", name, mine.forward_ms, fwd_flops, false, ""});
    if (with_backward) g.both.push_back({shape, "fwd+bwd", name, mine.forward_ms + mine.backward_ms, both_flops, false, ""});

    // FlashLab's variants on the same device that run the same problem (with its backward, when the plugin's ran).
    for (const Variant& v : variants()) {
      if (v.device != device || !v.available()) continue;
      try {
        check_supported(v, p, dtype, false);
      } catch (const InputError&) {
        continue;  // not the same problem
      }
      bool variant_backward = with_backward;
      try {
        if (variant_backward) check_supported(v, p, dtype, true);
      } catch (const InputError&) {
        variant_backward = false;
      }
      BenchRow fwd{shape, "fwd", v.name, -1, fwd_flops, true, ""};
      BenchRow both{shape, "fwd+bwd", v.name, -1, both_flops, true, ""};
      try {
        const BenchResult r =
            v.has_device_timer()
                ? v.bench(p, dtype, BenchSettings{.warmup = 1, .iters = kBenchTimedRuns, .backward = variant_backward})
                : time_cpu_variant(v, p, dtype, variant_backward);
        fwd.ms = r.forward_ms;
        if (variant_backward) both.ms = r.forward_ms + r.backward_ms;
      } catch (const std::exception& e) {
        fwd.note = both.note = (dynamic_cast<const InputError*>(&e) ? "skipped: " : "error: ") + std::string(e.what());
      }
      g.fwd.push_back(fwd);
      if (variant_backward) g.both.push_back(both);
    }
    groups.push_back(std::move(g));
    sdpa_problems.push_back({p, dtype, with_backward});
  }
  // PyTorch's SDPA on the problems the plugin ran, in one child process (its start-up, importing PyTorch, is paid once).
  SdpaTimes sdpa;
  if (sdpa_problems.empty()) {
    sdpa.why_not = name + " ran none of the problems";
  } else {
    progress(err, done++, steps, "PyTorch's SDPA (" + python + ")");
    sdpa = time_sdpa(python, sdpa_problems, device);
  }
  add_sdpa_rows(groups, sdpa_problems, sdpa);
  progress(err, done, steps, "done");
  err << "\n";
  std::vector<BenchRow> rows;
  for (const ProblemRows& g : groups) {
    rows.insert(rows.end(), g.fwd.begin(), g.fwd.end());
    rows.insert(rows.end(), g.both.begin(), g.both.end());
  }

  out << "bench on " << (on_cuda ? cuda_device_name() + " (CUDA device 0)" : std::string("the host CPU")) << ": " << name
      << " beside FlashLab's variants that run the same problems; B*N = " << plan.tokens << " tokens, H*d = "
      << plan.width << "; median of " << kBenchTimedRuns << " runs after 1 warm-up (a single run when the warm-up "
      << "took over " << kBenchSlowRunMs / 1000 << " s); "
      << (on_cuda ? "CUDA events on the stream verify gives the plugin; FlashLab's variants timed as `flashlab bench` "
                    "times them"
                  : "a host clock around each call")
      << "\nTFLOP/s: forward 4*B*H*N^2*d, halved when causal, backward 2.5 times the forward; x fastest: the time over "
         "the fastest FlashLab variant's on the same shape and pass; x sdpa: the time over PyTorch's "
         "scaled_dot_product_attention's, as PyTorch dispatches it (its row names the backend it picked), timed the "
         "same way in a Python child process\n\n";
  Table table({"shape", "pass", "kernel", "ms", "TFLOP/s", "x fastest", "x sdpa"});
  for (const BenchRow& r : rows) {
    std::optional<double> fastest, sdpa_ms;  // of FlashLab's variants, and SDPA's, on the same shape and pass
    for (const BenchRow& other : rows) {
      if (other.ms <= 0 || other.shape != r.shape || other.pass != r.pass) continue;
      if (other.flashlab) fastest = fastest ? std::min(*fastest, other.ms) : other.ms;
      if (other.sdpa) sdpa_ms = other.ms;
    }
    if (r.ms < 0) {
      table.add({r.shape, r.pass, r.kernel, r.note});
      continue;
    }
    const auto over = [&](const std::optional<double>& base) {
      return base ? format_fixed(r.ms / *base, 2) + "x" : std::string("-");
    };
    table.add({r.shape, r.pass, r.kernel, format_fixed(r.ms, 3), format_fixed(tflops(r.flops, r.ms), 3), over(fastest),
               over(sdpa_ms)});
  }
  table.print(out);
  if (sdpa.why_not.empty())
    out << "sdpa: " << sdpa.about << ", run by `" << python << "` (" << sdpa_timer_path() << ")\n";
  else
    out << "sdpa: not timed: " << sdpa.why_not << "\n";
  for (const std::string& note : notes) out << "not timed: " << note << "\n";
}

}  // namespace flashlab::cli
