#include "registry/check.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <utility>

#include "core/tensor.hpp"
#include "core/tolerance.hpp"
#include "cpu_reference/fp8.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/reference.hpp"
#include "registry/host_memory.hpp"

namespace flashlab {

// A (variant, dtype) pair to run, or to list as SKIP with the reason.
struct CheckJob {
  const Variant* variant;
  DType dtype;
  std::string skip;           // non-empty: why it cannot run this problem
  std::string backward_skip;  // non-empty: forward runs, backward cannot
};

namespace {

using Job = CheckJob;

class Recorder {
 public:
  explicit Recorder(CheckReport& report) : report_(report) {}

  // One output of one variant against the reference.
  void compare_output(const Job& job, const std::string& name, const HostTensor& out, const HostTensor& ref,
                      Quantity quantity, const Reference& r) {
    if (out.dims != ref.dims) {
      fail(job, name, "shape " + out.dims_string() + ", expected " + ref.dims_string());
      return;
    }
    CheckRow row = prefix(job, name);
    const OutputCheck c = check_output(name, out, ref, quantity, job.dtype, r);
    const ErrorStats& e = c.error;
    const bool pass = c.passes();
    row.max_abs_error = e.max_abs;
    row.rel_error = e.rel;
    row.bound = c.bound.rule;
    row.result = pass ? "PASS" : (e.has_nan ? "FAIL (NaN)" : "FAIL");
    ++(pass ? report_.passed : report_.failed);
    report_.rows.push_back(std::move(row));
  }
  // An output held to a rule of its own (the e4m3 rows): its errors, the rule as text, and whether it holds.
  void judged(const Job& job, const std::string& name, const ErrorStats& e, const std::string& bound, bool pass) {
    CheckRow row = prefix(job, name);
    row.max_abs_error = e.max_abs;
    row.rel_error = e.rel;
    row.bound = bound;
    row.result = pass ? "PASS" : (e.has_nan ? "FAIL (NaN)" : "FAIL");
    ++(pass ? report_.passed : report_.failed);
    report_.rows.push_back(std::move(row));
  }
  void fail(const Job& job, const std::string& what, const std::string& why) {
    CheckRow row = prefix(job, what);
    row.result = "FAIL: " + why;
    report_.rows.push_back(std::move(row));
    ++report_.failed;
  }
  void skip(const Job& job, const std::string& what, const std::string& why) {
    CheckRow row = prefix(job, what);
    row.result = "SKIP: " + why;
    report_.rows.push_back(std::move(row));
    ++report_.skipped;
  }

 private:
  static CheckRow prefix(const Job& job, const std::string& what) {
    CheckRow row;
    row.variant = job.variant->name;
    row.device = to_string(job.variant->device);
    row.dtype = to_string(job.dtype);
    row.output = what;
    return row;
  }
  CheckReport& report_;
};

void run_job(const Job& job, const Problem& p, const Reference& r, bool backward, Recorder& out) {
  const Variant& v = *job.variant;
  ForwardOut fwd;
  try {
    fwd = v.forward(p, job.dtype, r.inputs, nullptr);
  } catch (const std::exception& e) {
    out.fail(job, "forward", e.what());
    return;
  }
  out.compare_output(job, "O", fwd.o, r.forward.o, Quantity::Forward, r);
  out.compare_output(job, "LSE", fwd.lse, r.forward.lse, Quantity::Forward, r);
  if (!backward) return;
  if (!job.backward_skip.empty()) {
    out.skip(job, "grads", job.backward_skip);
    return;
  }
  Grads g;
  try {
    g = v.backward(p, job.dtype, r.inputs, fwd, r.d_o);
  } catch (const std::exception& e) {
    out.fail(job, "backward", e.what());
    return;
  }
  out.compare_output(job, "dQ", g.dq, r.grads.dq, Quantity::Gradient, r);
  out.compare_output(job, "dK", g.dk, r.grads.dk, Quantity::Gradient, r);
  out.compare_output(job, "dV", g.dv, r.grads.dv, Quantity::Gradient, r);
}

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

// The name the FP8 emulation's rows go under (device cpu, dtype e4m3).
constexpr const char* kFp8EmulationRow = "fp8-emulation";

// An e4m3 job: the variant's FP8 forward on the check's inputs (Variant::forward quantizes them per head, as the
// emulation does), held to the emulation by check_fp8_kernel. The first e4m3 job that runs reports the
// emulation's own rows first: its errors against the same reference, within its worst-case bound.
void run_e4m3_job(const Job& job, const Problem& p, const Qkv& in64, const EmulatedForward& emulated, bool backward,
                  bool& emulation_reported, Recorder& out) {
  ForwardOut fwd;
  Fp8KernelCheck c;
  try {
    fwd = job.variant->forward(p, DType::E4M3, in64, nullptr);
    c = check_fp8_kernel(p, emulated, fwd);  // InputError when the outputs' dims are wrong
  } catch (const std::exception& e) {
    out.fail(job, "forward", e.what());
    return;
  }
  const ForwardOut& ref = c.emulation.reference;
  if (!emulation_reported) {
    emulation_reported = true;
    Variant label;
    label.name = kFp8EmulationRow;
    label.device = Device::Cpu;
    const Job row{&label, DType::E4M3, "", ""};
    const Fp8Check& e = c.emulation;
    out.judged(row, "O", compare(emulated.out.o, ref.o), "abs <= " + sci(e.bounds.o_max_abs) + " (worst case)",
               e.o.max_abs <= e.bounds.o_max_abs);
    out.judged(row, "LSE", compare(emulated.out.lse, ref.lse), "abs <= " + sci(e.bounds.lse_max_abs) + " (worst case)",
               e.lse.max_abs <= e.bounds.lse_max_abs);
  }
  char factor[16];
  std::snprintf(factor, sizeof factor, "%g", kFp8KernelFactor);
  const std::string o_bound = "abs <= " + std::string(factor) + " x " + sci(c.emulation.o.max_abs) + " (emulation's)";
  const std::string lse_bound = "abs <= " + std::string(factor) + " x " + sci(c.emulation.lse.max_abs) +
                                " (emulation's) + " + sci(c.lse_limit - kFp8KernelFactor * c.emulation.lse.max_abs);
  out.judged(job, "O", compare(fwd.o, ref.o), o_bound, c.o_passes());
  out.judged(job, "LSE", compare(fwd.lse, ref.lse), lse_bound, c.lse_passes());
  if (backward) out.skip(job, "grads", job.backward_skip);
}

// Host bytes the FP8 emulation and its check add to a run's: the quantized and the dequantized inputs in double,
// and one head's S and P in float (the reference's S and P are counted with the other references').
std::int64_t fp8_emulation_bytes(const Shape& s) {
  const std::int64_t inputs =
      std::int64_t(s.batch) * (std::int64_t(s.seq_q) * s.heads_q + 2 * std::int64_t(s.seq_k) * s.heads_kv) * s.head_dim;
  return 2 * inputs * std::int64_t(sizeof(double)) + 2 * std::int64_t(s.seq_q) * s.seq_k * std::int64_t(sizeof(float));
}

// The plan: every (variant, dtype) to run or skip. A variant the caller named must run.
std::vector<Job> plan_jobs(const CheckRequest& request) {
  const Problem& p = request.problem;
  const bool named = !request.variants.empty();
  std::vector<const Variant*> chosen = request.variants;
  if (!named)
    for (const Variant& v : variants()) chosen.push_back(&v);
  std::vector<Job> jobs;
  for (const Variant* v : chosen) {
    std::vector<DType> dtypes;
    if (request.dtype) dtypes = {*request.dtype};
    else
      for (DType t : v->dtypes)
        if (t != DType::E4M3) dtypes.push_back(t);  // e4m3 only when asked for
    for (DType t : dtypes) {
      Job job{v, t, "", ""};
      try {
        check_supported(*v, p, t, false);
      } catch (const InputError& e) {
        if (named) throw;
        job.skip = e.what();
      }
      if (request.backward && job.skip.empty()) {
        try {
          check_supported(*v, p, t, true);
        } catch (const InputError& e) {
          if (named) throw;
          job.backward_skip = e.what();
        }
      }
      jobs.push_back(job);
    }
  }
  return jobs;
}

}  // namespace

void CheckReport::require_some_ran() const {
  if (ran() == 0) throw InputError("no variant available here can run this problem (see the SKIP reasons)");
}

Check::Check(CheckRequest request) : request_(std::move(request)) {
  const Problem& p = request_.problem;
  validate(p);
  jobs_ = plan_jobs(request_);
  // Memory, before anything is allocated: the references' S and P dominate.
  std::int64_t working_set = naive_extra_bytes(p.shape, sizeof(double), request_.backward);
  for (const Job& job : jobs_)
    if (job.skip.empty())
      working_set = std::max(working_set, host_bytes_for_run(*job.variant, p.shape, job.dtype, request_.backward) +
                                              (job.dtype == DType::E4M3 ? fp8_emulation_bytes(p.shape) : 0));
  require_memory(3 * io_host_bytes(p.shape, request_.backward) + working_set,
                 "this check (the double-precision reference materializes S and P)");
}

Check::~Check() = default;

CheckReport Check::run() const {
  const Problem& p = request_.problem;
  const bool backward = request_.backward;
  const Qkv in64 = random_qkv(p.shape, DType::F64, p.options.seed);
  const HostTensor dO64 = backward ? random_like_o(p.shape, DType::F64, p.options.seed) : HostTensor();
  std::map<DType, Reference> references;  // built on first use
  std::optional<EmulatedForward> emulated;  // e4m3: the FP8 forward emulated on in64, built on first use
  bool emulation_reported = false;
  CheckReport report;
  Recorder recorder(report);
  for (const Job& job : jobs_) {
    if (!job.skip.empty()) {
      recorder.skip(job, "-", job.skip);
      continue;
    }
    if (job.dtype == DType::E4M3) {
      if (!emulated) emulated = fp8_attention_emulated(p, in64, fp8_kernel_order(p.shape.head_dim));
      run_e4m3_job(job, p, in64, *emulated, backward, emulation_reported, recorder);
      continue;
    }
    auto it = references.find(job.dtype);
    if (it == references.end())
      it = references.emplace(job.dtype, make_reference(p, job.dtype, in64, dO64, backward)).first;
    run_job(job, p, it->second, backward, recorder);
  }
  return report;
}

void require_reference_memory(const Problem& p, bool backward) {
  require_memory(3 * io_host_bytes(p.shape, backward) + naive_extra_bytes(p.shape, sizeof(double), backward),
                 "this check (the double-precision reference materializes S and P)");
}

CheckInputs check_inputs(const Problem& p, DType dtype, bool backward) {
  validate(p);
  require_reference_memory(p, backward);  // check_computed builds it later: refuse before any work
  CheckInputs c{random_qkv(p.shape, DType::F64, p.options.seed),
                backward ? random_like_o(p.shape, DType::F64, p.options.seed) : HostTensor()};
  round_to(c.in.q, dtype);
  round_to(c.in.k, dtype);
  round_to(c.in.v, dtype);
  if (backward) round_to(c.d_o, dtype);
  return c;
}

CheckReport check_computed(const std::string& name, Device device, const Problem& p, DType dtype, const ForwardOut& fwd,
                           const Grads* grads) {
  const bool backward = grads != nullptr;
  const Reference r = seeded_reference(p, dtype, backward);
  Variant label;  // a row's name and device, as a variant's
  label.name = name;
  label.device = device;
  const Job job{&label, dtype, "", ""};
  CheckReport report;
  Recorder recorder(report);
  recorder.compare_output(job, "O", fwd.o, r.forward.o, Quantity::Forward, r);
  recorder.compare_output(job, "LSE", fwd.lse, r.forward.lse, Quantity::Forward, r);
  if (backward) {
    recorder.compare_output(job, "dQ", grads->dq, r.grads.dq, Quantity::Gradient, r);
    recorder.compare_output(job, "dK", grads->dk, r.grads.dk, Quantity::Gradient, r);
    recorder.compare_output(job, "dV", grads->dv, r.grads.dv, Quantity::Gradient, r);
  }
  return report;
}

}  // namespace flashlab
