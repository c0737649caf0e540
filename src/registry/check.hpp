#pragma once
// `flashlab check`: variants of the table on the same fresh random inputs, against naive attention in
// double. The inputs are drawn once in double and rounded to each dtype, and the reference runs on the
// rounded inputs, so a variant is judged only on its own arithmetic. For f16/bf16 the bound is
// FlashAttention's rule: a multiple of naive attention's own error in that precision
// (core/tolerance.hpp). e4m3 (FP8) runs only when asked for: the inputs are quantized per head, the
// reference is naive attention in double on the dequantized inputs, and the kernel is held to the FP8
// forward emulated on the CPU (cpu_reference/fp8.hpp, check_fp8_kernel), whose own rows
// ("fp8-emulation") come first. The CLI prints the rows as a table; the Python module returns them.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "registry/variants.hpp"

namespace flashlab {

struct CheckRequest {
  Problem problem;                        // options.seed draws the inputs (and keys the dropout mask)
  std::optional<DType> dtype;             // none: every dtype each variant supports but e4m3, which
                                          // runs only when asked for (its own inputs and rule)
  std::vector<const Variant*> variants;   // empty: every variant of the table, listing those that cannot
                                          // run the problem as SKIP; named ones must run it
  bool backward = false;                  // also the gradients dQ, dK, dV
};

// One row of the table: an output of a (variant, dtype) pair compared with the reference, or a pair
// that failed or was skipped, with the reason.
struct CheckRow {
  std::string variant, device, dtype;
  std::string output;                    // "O", "LSE", "dQ", "dK", "dV"; "forward" / "backward" for a
                                         // pass that threw, "grads" for a skipped backward, "-" for a skip
  std::optional<double> max_abs_error;   // compared rows only
  std::optional<double> rel_error;
  std::string bound;                     // the rule applied, e.g. "rel <= 1e-05"; compared rows only
                                         // (e4m3: "abs <= 2 x 3.10e-03 (emulation's)")
  std::string result;                    // "PASS", "FAIL", "FAIL (NaN)", "FAIL: <why>", "SKIP: <why>"
};

struct CheckReport {
  std::vector<CheckRow> rows;
  int passed = 0, failed = 0, skipped = 0;
  int ran() const { return passed + failed; }
  // Throws InputError when no variant could run the problem (every row a SKIP, each saying why).
  void require_some_ran() const;
};

// A planned check: made, it has checked its request, so a caller may announce the run before it starts.
struct CheckJob;  // one (variant, dtype) pair to run or skip (check.cpp)
class Check {
 public:
  // Plans every (variant, dtype) pair. Throws InputError (one sentence) for a bad problem, a named
  // variant that cannot run it, or a check that would not fit in memory (the double-precision reference
  // materializes S and P).
  explicit Check(CheckRequest);
  ~Check();
  CheckReport run() const;

 private:
  CheckRequest request_;
  std::vector<CheckJob> jobs_;
};

// Outputs computed outside the table (`flashlab ring --check`: the ring over NCCL), checked as Check checks a
// variant's. check_inputs: the inputs Check would draw for the problem (options.seed), rounded to the dtype,
// and dO with `backward` (InputError, in one sentence, when the reference would not fit in this machine's
// memory); check_computed: the rows of outputs computed from them, labelled `name` on `device`.
struct CheckInputs {
  Qkv in;
  HostTensor d_o;
};
CheckInputs check_inputs(const Problem&, DType, bool backward);
// What check_inputs refuses, alone: a double-precision reference (S and P materialized) that would not fit.
void require_reference_memory(const Problem&, bool backward);
CheckReport check_computed(const std::string& name, Device device, const Problem&, DType, const ForwardOut&,
                           const Grads* grads);

}  // namespace flashlab
