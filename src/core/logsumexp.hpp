#pragma once
// The two scalar pieces of merging partial attention results through their logsumexps, one definition for
// the CPU reference (cpu_reference/lse_merge.hpp) and the GPU ring's merge kernel (cuda/ring.cu):
//
//   log(e^a + e^b) = max(a, b) + log1p(exp(-|a - b|))     (log_add_exp)
//   e^b / (e^a + e^b) = sigmoid(b - a)                      (stable_sigmoid, the weight of the part with b)
//
// Written so that no exponential of a large number is ever formed.
#include <cmath>

#include "core/hd.hpp"

namespace flashlab {

// sigmoid(x) = 1 / (1 + e^-x), evaluated on the side where the exponential cannot overflow.
template <class T>
FLASHLAB_HD T stable_sigmoid(T x) {
  using std::exp;
  if (x >= T(0)) return T(1) / (T(1) + exp(-x));
  const T e = exp(x);
  return e / (T(1) + e);
}

// log(e^a + e^b) for finite a, b (a -inf operand is the caller's case: the other one is the answer).
template <class T>
FLASHLAB_HD T log_add_exp(T a, T b) {
  using std::abs, std::exp, std::log1p;
  return (a > b ? a : b) + log1p(exp(-abs(a - b)));
}

}  // namespace flashlab
