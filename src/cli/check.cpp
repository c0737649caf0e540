// flashlab check: every variant of the table, on the same fresh random inputs, against naive attention
// in double (registry/check.hpp runs it; this file prints it). The inputs are always drawn there, never
// read from files: NaN or Inf in user data is `flashlab run`'s concern (cli/common.hpp, warn_non_finite).
// --dtype e4m3 checks the FP8 forward against its emulation on the CPU (registry/check.hpp says how).
#include <optional>
#include <utility>

#include "cli/commands.hpp"
#include "cpu_reference/fp8.hpp"  // kFp8KernelFactor
#include "registry/check.hpp"

namespace flashlab::cli {

void print_check_table(std::ostream& out, const CheckReport& report) {
  Table table({"variant", "device", "dtype", "output", "max abs err", "rel err", "bound", "result"});
  const auto number = [](const std::optional<double>& x) { return x ? format_sci(*x) : std::string("-"); };
  for (const CheckRow& r : report.rows)
    table.add({r.variant, r.device, r.dtype, r.output, number(r.max_abs_error), number(r.rel_error),
               r.bound.empty() ? "-" : r.bound, r.result});
  table.print(out);
  out << "\n" << report.passed << " passed, " << report.failed << " failed, " << report.skipped << " skipped\n";
}

namespace {

void print_variant_list(std::ostream& out) {
  Table t({"variant", "device", "dtypes", "causal", "dropout", "GQA", "backward", "head dims", "available", "summary"});
  auto yes = [](bool b) { return std::string(b ? "yes" : "no"); };
  for (const Variant& v : variants()) {
    std::vector<std::string> dtypes;
    for (DType d : v.dtypes) dtypes.push_back(to_string(d));
    // "yes": a backward with one summation order run to run; "yes, atomic dQ": no --deterministic; "(d = ...)":
    // its head dims where fewer than the forward's.
    std::string backward = yes(v.has_backward());
    if (v.has_backward() && !v.supports.deterministic) backward += ", atomic dQ";
    if (v.has_backward() && v.backward_head_dims && v.backward_head_dims->describe() != v.head_dims.describe())
      backward += " (d = " + v.backward_head_dims->describe() + ")";
    t.add({v.name, to_string(v.device), join(dtypes, ","), yes(v.supports.causal), yes(v.supports.dropout),
           yes(v.supports.gqa), backward, v.head_dims.describe(), yes(v.available()), v.summary});
  }
  t.print(out);
}

}  // namespace

void CheckCommand::add_to(CLI::App& app) {
  shape.add_to(app);
  options.add_to(app, "seed of the random inputs and the dropout mask (default: a fresh one, printed)");
  app.add_option("--dtype", dtype,
                 "f64, f32, f16, bf16 or e4m3 (default: every dtype each variant supports but e4m3). e4m3 (fp8) checks "
                 "the FP8 forward (cuda-fa3-ws, head dims 64, 128 and 256, no backward, no dropout): the inputs are "
                 "quantized per head, and the kernel's O and LSE must stay within 2x the error of the FP8 forward "
                 "emulated on the CPU (the fp8-emulation rows), both against naive attention in double on the "
                 "dequantized inputs");
  app.add_option("--variants", variants, "comma-separated variant names (default: every variant)");
  app.add_flag("--backward", backward, "also check the gradients dQ, dK, dV");
  app.add_flag("--list", list, "print the variant table and exit");
}

int CheckCommand::run(std::ostream& out, std::ostream& /*err*/) const {
  if (list) {
    print_variant_list(out);
    return kExitOk;
  }
  CheckRequest request;
  request.problem.shape = shape.shape();
  request.problem.options = options.options(fresh_seed());
  validate(request.problem);
  if (!dtype.empty()) request.dtype = parse_dtype(dtype);
  const std::optional<DType> asked_dtype = request.dtype;
  if (!variants.empty()) request.variants = named_variants(variants);
  request.backward = backward;
  const Problem p = request.problem;

  const Check check(std::move(request));  // checks the request (bad input, memory) before anything is printed
  out << "flashlab check: " << describe(p.shape) << ", causal " << to_string(p.options.causal) << ", scale "
      << p.softmax_scale() << ", dropout " << p.options.dropout_p << (backward ? ", forward and backward" : ", forward")
      << "\n";
  out << "seed " << p.options.seed << " (repeat with --seed " << p.options.seed << ")\n";
  if (asked_dtype == DType::E4M3)
    out << "reference: naive attention in double on the inputs quantized to e4m3 per head and dequantized; the "
           "kernel within "
        << kFp8KernelFactor << "x the error of the FP8 forward emulated on the CPU (fp8-emulation)\n\n";
  else
    out << "reference: naive attention in double on the inputs rounded to each dtype\n\n";
  const CheckReport report = check.run();
  print_check_table(out, report);
  report.require_some_ran();
  return report.failed ? kExitCheckFailed : kExitOk;
}

}  // namespace flashlab::cli
