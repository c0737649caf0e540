#pragma once
// exp2 without the exponential unit: range reduction and a short polynomial, all on the FMA and integer pipes.
//
// Why: a tensor core of Hopper or Blackwell does far more multiply-adds per clock than the multi-function unit
// (MUFU) does exponentials, 16 a clock per SM. FlashAttention-4 (Blackwell) computes part of the softmax's
// exponentials this way so that the two units share the work. This header is the arithmetic; the kernels that
// use it choose how many elements go to it.
//
// The method, for x >= kExp2PolyMinInput:
//   j = round(x), nearest         x + 1.5 * 2^23 rounds x to an integer in fp32 (|x| < 2^22); subtracting the
//                                 constant back gives j exactly
//   f = x - j in [-1/2, 1/2]      exact: x and j are within 1/2 of each other
//   2^f ~ p(f) = 1 + f (c1 + f (c2 + ...))   Horner, one FMA per degree; p(0) = 1 exactly
//   2^x = 2^j p(f)                j added to p's exponent field: the low bits of x + 1.5 * 2^23 hold j, so
//                                 shifting that float's bits left by 23 moves j into place (the rest overflows out)
// Below kExp2PolyMinInput (and at -inf) the result is 0: 2^j p(f) would leave the normal range there, and a
// softmax needs exp2(-inf) = 0 exactly for masked keys.
//
// The error is that of p on [-1/2, 1/2] (scaling by 2^j is exact), max |p(f) / 2^f - 1|: kExp2PolyMaxRelError
// states it per degree, and tests/test_exp2_poly.cpp checks it on every float f in [-1/2, 1/2] down to 2^-12 and on
// x across the whole range. The coefficients were fitted here, for the least maximum relative error (Lawson's
// iteration on 4001 Chebyshev points), then rounded to float.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.hpp"

namespace flashlab {

// The smallest input with a nonzero result: 2^-125 is the last power whose product with p(f) in [2^-1/2, 2^1/2]
// stays a normal float.
inline constexpr float kExp2PolyMinInput = -125.0f;

// The cubic's coefficients c1, c2, c3 (lesson 08's exercise evaluates the same cubic).
inline constexpr float kExp2PolyCubicC1 = 6.932829022e-01f, kExp2PolyCubicC2 = 2.422109693e-01f,
                       kExp2PolyCubicC3 = 5.500892922e-02f;

// p(f) = 1 + f (c1 + f (c2 + f (c3 + f c4))), to the degree given (Horner: one FMA a degree).
template <int kDegree>
FLASHLAB_HD float exp2_poly_fraction(float f) {
  static_assert(kDegree >= 2 && kDegree <= 4, "exp2_poly has coefficients for degrees 2, 3 and 4");
  if constexpr (kDegree == 2) {
    return fmaf(fmaf(2.398640513e-01f, f, 7.029418945e-01f), f, 1.0f);
  } else if constexpr (kDegree == 3) {
    return fmaf(fmaf(fmaf(kExp2PolyCubicC3, f, kExp2PolyCubicC2), f, kExp2PolyCubicC1), f, 1.0f);
  } else {
    return fmaf(fmaf(fmaf(fmaf(9.582852945e-03f, f, 5.590642616e-02f), f, 2.402409911e-01f), f, 6.931241751e-01f), f,
                1.0f);
  }
}

// The stated bound on max |exp2_poly<kDegree>(x) / 2^x - 1| over x >= kExp2PolyMinInput: the fit's error plus
// the float evaluation's few rounding errors, rounded up. Beside bf16's unit roundoff 2^-8 = 3.9e-3: degree 2 is
// half of it, degree 3 a fortieth, degree 4 a thousandth.
template <int kDegree>
inline constexpr double kExp2PolyMaxRelError = kDegree == 2 ? 2.0e-3 : kDegree == 3 ? 1.1e-4 : 3.2e-6;

FLASHLAB_HD std::uint32_t exp2_poly_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
FLASHLAB_HD float exp2_poly_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// 2^x by range reduction and p of degree kDegree (2, 3 or 4); 0 below kExp2PolyMinInput.
template <int kDegree>
FLASHLAB_HD float exp2_poly(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  const float shifted = x + kRound;      // j = round(x) in the low mantissa bits
  const float j = shifted - kRound;
  const float p = exp2_poly_fraction<kDegree>(x - j);
  const float r = exp2_poly_float(exp2_poly_bits(p) + (exp2_poly_bits(shifted) << 23));
  return x >= kExp2PolyMinInput ? r : 0.0f;
}

}  // namespace flashlab
