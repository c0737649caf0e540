#include "core/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace flashlab {

ErrorStats compare(const HostTensor& out, const HostTensor& ref) {
  ErrorStats e;
  if (out.dims != ref.dims || out.data.size() != ref.data.size()) {
    e.has_nan = true;  // a shape mismatch can never pass
    e.max_abs = e.rel = INFINITY;
    return e;
  }
  double diff2 = 0, ref2 = 0;
  for (std::size_t n = 0; n < out.data.size(); ++n) {
    const double a = out.data[n], b = ref.data[n];
    if (std::isnan(a) || std::isnan(b)) {
      e.has_nan = true;
      continue;
    }
    if (std::isinf(a) || std::isinf(b)) {
      if (a != b) e.max_abs = INFINITY, diff2 = INFINITY;  // infinities must match exactly
      continue;
    }
    const double d = std::abs(a - b);
    e.max_abs = std::max(e.max_abs, d);
    e.ref_max = std::max(e.ref_max, std::abs(b));
    diff2 += d * d;
    ref2 += b * b;
  }
  e.rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  if (e.has_nan) e.max_abs = e.rel = NAN;
  return e;
}

Bound tolerance(DType dtype, Quantity quantity, const ErrorStats& ref_stats, const ErrorStats* lowp_baseline) {
  if (dtype == DType::E4M3)
    throw InputError("e4m3 outputs are held to the FP8 rule (check_fp8_kernel, cpu_reference/fp8.hpp: within 2x the "
                     "error of the FP8 forward emulated on the CPU), not to the f16/bf16 tolerance");
  char rule[128];
  if (dtype == DType::F64 || dtype == DType::F32) {
    const double limit = dtype == DType::F64 ? 1e-12 : 1e-5;
    std::snprintf(rule, sizeof rule, "rel <= %.0e", limit);
    return Bound{true, limit, rule};
  }
  const double factor = quantity == Quantity::Forward ? 2.0 : 3.0;
  const double baseline = lowp_baseline && !lowp_baseline->has_nan ? lowp_baseline->max_abs : 0.0;
  const double slack = 1e-5 * std::max(1.0, ref_stats.ref_max);
  std::snprintf(rule, sizeof rule, "abs <= %.0f x %.2e + %.0e", factor, baseline, slack);
  return Bound{false, factor * baseline + slack, rule};
}

}  // namespace flashlab
