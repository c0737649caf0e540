#pragma once
// The one tolerance rule. Ground truth is naive attention in double.
//  * f64 variants:  ||out - ref|| / ||ref|| <= 1e-12.
//  * f32 variants:  ||out - ref|| / ||ref|| <= 1e-5.
//  * f16/bf16:      max|out - ref| <= k * max|naive_lowp - ref| + 1e-5 * max(1, max|ref|),
//                   k = 2 for the forward outputs and 3 for gradients, where naive_lowp is naive
//                   attention run in the same low precision (FlashAttention's test rule).
// NaN never passes; matching infinities (LSE of a fully masked row) count as equal. A gradient whose reference is
// zero everywhere (one key per row) is judged at the scale of the case's largest gradient (check_output,
// cpu_reference/reference.cpp says why).
// e4m3 (FP8) has a rule of its own, against the FP8 forward emulated on the CPU (cpu_reference/fp8.hpp,
// check_fp8_kernel): tolerance() throws InputError for it.
#include <string>

#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab {

struct ErrorStats {
  double max_abs = 0;  // max |out - ref| over elements
  double rel = 0;      // ||out - ref||_2 / ||ref||_2 (0 when both are 0)
  double ref_max = 0;  // max |ref|, finite elements
  bool has_nan = false;
};

enum class Quantity { Forward, Gradient };

struct Bound {
  bool uses_rel;     // true: the bound is on rel; false: on max_abs
  double limit;
  std::string rule;  // e.g. "rel <= 1e-05" or "abs <= 2 x 3.1e-03 + 1e-05"
  bool passes(const ErrorStats& e) const {
    if (e.has_nan) return false;
    return (uses_rel ? e.rel : e.max_abs) <= limit;
  }
};

ErrorStats compare(const HostTensor& out, const HostTensor& ref);

// lowp_baseline: for f16/bf16 the ErrorStats of naive attention in that precision against ref;
// ignored for f64/f32.
Bound tolerance(DType, Quantity, const ErrorStats& ref_stats, const ErrorStats* lowp_baseline);

}  // namespace flashlab
