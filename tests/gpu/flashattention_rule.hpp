#pragma once
// What the tensor-core suites (cuda-fa2, cuda-fa3-ws forward and backward) share: one output checked against
// the double reference under the FlashAttention rule of core/tolerance.hpp, bounded by naive attention run
// in the same low precision; and the one-sentence refusal a call raises.
#include <doctest/doctest.h>

#include <string>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "core/tolerance.hpp"

inline void check_output(const char* name, flashlab::DType dtype, flashlab::Quantity quantity,
                         const flashlab::HostTensor& out, const flashlab::HostTensor& ref,
                         const flashlab::HostTensor& lowp) {
  const flashlab::ErrorStats err = flashlab::compare(out, ref);
  const flashlab::ErrorStats baseline = flashlab::compare(lowp, ref);
  const flashlab::Bound bound = flashlab::tolerance(dtype, quantity, err, &baseline);
  INFO(std::string(name) << ": max abs error " << err.max_abs << " (rel " << err.rel << "), bound " << bound.rule
                         << (err.has_nan ? ", has NaN (an unwritten or non-finite element)" : ""));
  CHECK(bound.passes(err));
}

// The InputError sentence of `call`, or "" when it does not throw one.
template <class F>
std::string refusal(F&& call) {
  try {
    call();
  } catch (const flashlab::InputError& e) {
    return e.what();
  }
  return "";
}
