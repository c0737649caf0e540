// flashlab check: every variant of the table, on the same fresh random inputs, against naive attention
// in double. The inputs are drawn once in double and rounded to each dtype, and the reference runs on
// the rounded inputs, so a variant is judged only on its own arithmetic. For f16/bf16 the bound is
// FlashAttention's rule: a multiple of naive attention's own error in that precision
// (core/tolerance.hpp). The inputs are always drawn here, never read from files: NaN or Inf in user
// data is `flashlab run`'s concern (cli/common.hpp, warn_non_finite).
#include <map>
#include <optional>

#include "cli/commands.hpp"
#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"

namespace flashlab::cli {
namespace {

// A (variant, dtype) pair to run, or to list as SKIP with the reason.
struct Job {
  const Variant* variant;
  DType dtype;
  std::string skip;           // non-empty: why it cannot run this problem
  std::string backward_skip;  // non-empty: forward runs, backward cannot
};

bool is_low_precision(DType t) { return t == DType::F16 || t == DType::BF16; }

// Ground truth for one dtype: naive<double> on the inputs rounded to it, and for f16/bf16 the error of
// naive attention run in that precision, which scales the bound.
struct Reference {
  Qkv inputs;
  HostTensor dO;
  ForwardOut forward;
  Grads grads;
  std::map<std::string, ErrorStats> lowp_error;  // by output name
};

Reference make_reference(const Problem& p, DType dtype, const Qkv& in64, const HostTensor& dO64, bool backward) {
  Reference r;
  r.inputs = in64;
  round_to(r.inputs.q, dtype);
  round_to(r.inputs.k, dtype);
  round_to(r.inputs.v, dtype);
  r.forward = naive_forward<double>(p, r.inputs);
  if (backward) {
    r.dO = dO64;
    round_to(r.dO, dtype);
    r.grads = naive_backward<double>(p, r.inputs, r.forward, r.dO);
  }
  if (is_low_precision(dtype)) {
    const ForwardOut f = naive_forward_lowp(p, dtype, r.inputs);
    r.lowp_error["O"] = compare(f.o, r.forward.o);
    r.lowp_error["LSE"] = compare(f.lse, r.forward.lse);
    if (backward) {
      const Grads g = naive_backward_lowp(p, dtype, r.inputs, f, r.dO);
      r.lowp_error["dQ"] = compare(g.dq, r.grads.dq);
      r.lowp_error["dK"] = compare(g.dk, r.grads.dk);
      r.lowp_error["dV"] = compare(g.dv, r.grads.dv);
    }
  }
  return r;
}

class CheckTable {
 public:
  CheckTable() : table_({"variant", "device", "dtype", "output", "max abs err", "rel err", "bound", "result"}) {}

  // One output of one variant against the reference.
  void compare_output(const Job& job, const std::string& name, const HostTensor& out, const HostTensor& ref,
                      Quantity quantity, const Reference& r) {
    std::vector<std::string> row = prefix(job, name);
    if (out.dims != ref.dims) {
      row.insert(row.end(), {"-", "-", "-", "FAIL: shape " + out.dims_string() + ", expected " + ref.dims_string()});
      ++failed_;
    } else {
      const ErrorStats e = compare(out, ref);
      const auto base = r.lowp_error.find(name);
      const Bound bound = tolerance(job.dtype, quantity, e, base == r.lowp_error.end() ? nullptr : &base->second);
      const bool pass = bound.passes(e);
      row.insert(row.end(), {format_sci(e.max_abs), format_sci(e.rel), bound.rule,
                             pass ? "PASS" : (e.has_nan ? "FAIL (NaN)" : "FAIL")});
      ++(pass ? passed_ : failed_);
    }
    table_.add(std::move(row));
  }
  void fail(const Job& job, const std::string& what, const std::string& why) {
    std::vector<std::string> row = prefix(job, what);
    row.insert(row.end(), {"-", "-", "-", "FAIL: " + why});
    table_.add(std::move(row));
    ++failed_;
  }
  void skip(const Job& job, const std::string& what, const std::string& why) {
    std::vector<std::string> row = prefix(job, what);
    row.insert(row.end(), {"-", "-", "-", "SKIP: " + why});
    table_.add(std::move(row));
    ++skipped_;
  }
  void print(std::ostream& out) const {
    table_.print(out);
    out << "\n" << passed_ << " passed, " << failed_ << " failed, " << skipped_ << " skipped\n";
  }
  int failed() const { return failed_; }
  int ran() const { return passed_ + failed_; }

 private:
  static std::vector<std::string> prefix(const Job& job, const std::string& what) {
    return {job.variant->name, to_string(job.variant->device), to_string(job.dtype), what};
  }
  Table table_;
  int passed_ = 0, failed_ = 0, skipped_ = 0;
};

void run_job(const Job& job, const Problem& p, const Reference& r, bool backward, CheckTable& table) {
  const Variant& v = *job.variant;
  ForwardOut fwd;
  try {
    fwd = v.forward(p, job.dtype, r.inputs, nullptr);
  } catch (const std::exception& e) {
    table.fail(job, "forward", e.what());
    return;
  }
  table.compare_output(job, "O", fwd.o, r.forward.o, Quantity::Forward, r);
  table.compare_output(job, "LSE", fwd.lse, r.forward.lse, Quantity::Forward, r);
  if (!backward) return;
  if (!job.backward_skip.empty()) {
    table.skip(job, "grads", job.backward_skip);
    return;
  }
  Grads g;
  try {
    g = v.backward(p, job.dtype, r.inputs, fwd, r.dO);
  } catch (const std::exception& e) {
    table.fail(job, "backward", e.what());
    return;
  }
  table.compare_output(job, "dQ", g.dq, r.grads.dq, Quantity::Gradient, r);
  table.compare_output(job, "dK", g.dk, r.grads.dk, Quantity::Gradient, r);
  table.compare_output(job, "dV", g.dv, r.grads.dv, Quantity::Gradient, r);
}

void print_variant_list(std::ostream& out) {
  Table t({"variant", "device", "dtypes", "causal", "dropout", "GQA", "backward", "head dims", "available", "summary"});
  auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  for (const Variant& v : variants()) {
    std::vector<std::string> dtypes;
    for (DType d : v.dtypes) dtypes.push_back(to_string(d));
    t.add({v.name, to_string(v.device), join(dtypes, ","), yes(v.supports.causal), yes(v.supports.dropout),
           yes(v.supports.gqa), yes(v.has_backward()), v.head_dims.describe(), yes(v.available()),
           v.summary});
  }
  t.print(out);
}

}  // namespace

void CheckCommand::add_to(CLI::App& app) {
  shape.add_to(app);
  options.add_to(app, "seed of the random inputs and the dropout mask (default: a fresh one, printed)");
  app.add_option("--dtype", dtype, "f64, f32, f16 or bf16 (default: every dtype each variant supports)");
  app.add_option("--variants", variants, "comma-separated variant names (default: every variant)");
  app.add_flag("--backward", backward, "also check the gradients dQ, dK, dV");
  app.add_flag("--list", list, "print the variant table and exit");
}

int CheckCommand::run(std::ostream& out, std::ostream& /*err*/) const {
  if (list) {
    print_variant_list(out);
    return kExitOk;
  }
  Problem p;
  p.shape = shape.shape();
  p.options = options.options(fresh_seed());
  validate(p);
  const std::optional<DType> only_dtype = dtype.empty() ? std::nullopt : std::optional(parse_dtype(dtype));

  // The plan: every (variant, dtype) to run or skip. A variant the user named must run.
  const bool named = !variants.empty();
  std::vector<const Variant*> chosen;
  if (named) {
    chosen = named_variants(variants);
  } else {
    for (const Variant& v : flashlab::variants()) chosen.push_back(&v);
  }
  std::vector<Job> jobs;
  for (const Variant* v : chosen) {
    for (DType t : only_dtype ? std::vector<DType>{*only_dtype} : v->dtypes) {
      Job job{v, t, "", ""};
      try {
        check_supported(*v, p, t, false);
      } catch (const InputError& e) {
        if (named) throw;
        job.skip = e.what();
      }
      if (backward && job.skip.empty()) {
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

  // Memory, before anything is allocated: the references' S and P dominate.
  std::int64_t working_set = naive_extra_bytes(p.shape, sizeof(double), backward);
  for (const Job& job : jobs)
    if (job.skip.empty())
      working_set = std::max(working_set, host_bytes_for_run(*job.variant, p.shape, job.dtype, backward));
  require_memory(3 * io_host_bytes(p.shape, backward) + working_set,
                 "this check (the double-precision reference materializes S and P)");

  out << "flashlab check: " << describe(p.shape) << ", causal " << to_string(p.options.causal) << ", scale "
      << p.softmax_scale() << ", dropout " << p.options.dropout_p << (backward ? ", forward and backward" : ", forward")
      << "\n";
  out << "seed " << p.options.seed << " (repeat with --seed " << p.options.seed << ")\n";
  out << "reference: naive attention in double on the inputs rounded to each dtype\n\n";

  const Qkv in64 = random_qkv(p.shape, DType::F64, p.options.seed);
  const HostTensor dO64 = backward ? random_like_o(p.shape, DType::F64, p.options.seed) : HostTensor();
  std::map<DType, Reference> references;  // built on first use
  CheckTable table;
  for (const Job& job : jobs) {
    if (!job.skip.empty()) {
      table.skip(job, "-", job.skip);
      continue;
    }
    auto it = references.find(job.dtype);
    if (it == references.end())
      it = references.emplace(job.dtype, make_reference(p, job.dtype, in64, dO64, backward)).first;
    run_job(job, p, it->second, backward, table);
  }
  table.print(out);
  if (table.ran() == 0) throw InputError("no variant available here can run this problem (see the SKIP reasons above)");
  return table.failed() ? kExitCheckFailed : kExitOk;
}

}  // namespace flashlab::cli
