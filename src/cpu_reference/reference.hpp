#pragma once
// The ground truth every output is judged against, by `flashlab check` (FlashLab's variants) and `flashlab
// verify` (anyone's kernel): naive attention in double on inputs drawn from a seed and rounded to the dtype
// under test, and for f16/bf16 the error of naive attention run in that precision, which scales the bound
// of the tolerance rule (core/tolerance.hpp).
#include <map>
#include <string>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "core/tolerance.hpp"

namespace flashlab {

struct Reference {
  Qkv inputs;        // drawn in double, rounded to the dtype
  HostTensor d_o;    // likewise, with the backward
  ForwardOut forward;
  Grads grads;
  std::map<std::string, ErrorStats> lowp_error;  // f16/bf16: naive attention's own error, by output name
};

// q, k, v (and dO with `backward`) drawn in double and rounded to the dtype, and the reference on them.
Reference make_reference(const Problem&, DType, const Qkv& inputs64, const HostTensor& d_o64, bool backward);
// The same on the inputs drawn from the problem's seed (options.seed).
Reference seeded_reference(const Problem&, DType, bool backward);

// One output (named "O", "LSE", "dQ", "dK" or "dV") against its reference: the errors, and the bound the rule
// sets for them.
struct OutputCheck {
  ErrorStats error;
  Bound bound;
  bool passes() const { return bound.passes(error); }
};
OutputCheck check_output(const std::string& name, const HostTensor& out, const HostTensor& ref, Quantity, DType,
                         const Reference&);

}  // namespace flashlab
