// core/exp2_poly.hpp: exp2 by range reduction and a polynomial, against std::exp2 in double. Its stated bound per
// degree holds on a dense grid and a sweep of the floats of the reduced argument f in [-1/2, 1/2], and on x across
// the whole input range; integers are exact; below the range and at -inf the result is 0 (a masked score); and at
// degree 3 rounding to bf16 hides the polynomial: at most one bf16 ulp from the exact value's rounding, in a
// fraction of the values no larger than the bound allows.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "core/exp2_poly.hpp"
#include "core/half.hpp"

namespace {

using namespace flashlab;

double rel_error(float approx, double exact) { return std::abs(static_cast<double>(approx) / exact - 1.0); }

// The largest relative error of the degree's p(f) on a uniform grid of [-1/2, 1/2] and on every `stride`-th float
// of [2^-12, 1/2] and its negatives (below 2^-12, p(f) = 1 + c1 f to well within the bound).
template <int kDegree>
double max_fraction_error(int grid, std::uint32_t stride) {
  double worst = 0;
  for (int i = 0; i <= grid; ++i) {
    const float f = -0.5f + static_cast<float>(i) / static_cast<float>(grid);
    worst = std::max(worst, rel_error(exp2_poly_fraction<kDegree>(f), std::exp2(static_cast<double>(f))));
  }
  std::uint32_t lo, hi;
  const float a = std::ldexp(1.0f, -12), b = 0.5f;
  std::memcpy(&lo, &a, 4);
  std::memcpy(&hi, &b, 4);
  for (std::uint32_t u = lo; u <= hi; u += stride) {
    float f;
    std::memcpy(&f, &u, 4);
    for (const float s : {f, -f})
      worst = std::max(worst, rel_error(exp2_poly_fraction<kDegree>(s), std::exp2(static_cast<double>(s))));
  }
  return worst;
}

template <int kDegree>
void check_degree() {
  INFO("degree " << kDegree << ", stated bound " << kExp2PolyMaxRelError<kDegree>);
  const double fraction = max_fraction_error<kDegree>(1 << 20, 61);
  CHECK(fraction <= kExp2PolyMaxRelError<kDegree>);
  // The bound is the polynomial's, not a loose cap: the measured error is within 20% of it.
  CHECK(fraction >= 0.8 * kExp2PolyMaxRelError<kDegree>);
  // Across the input range, 2^j p(f) adds no error to p's.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> x_of(kExp2PolyMinInput, 127.0f);
  double worst = 0;
  for (int n = 0; n < 200000; ++n) {
    const float x = x_of(rng);
    worst = std::max(worst, rel_error(exp2_poly<kDegree>(x), std::exp2(static_cast<double>(x))));
  }
  CHECK(worst <= kExp2PolyMaxRelError<kDegree>);
  for (int k = static_cast<int>(kExp2PolyMinInput); k <= 127; ++k)  // f = 0: p = 1, exactly 2^k
    REQUIRE(exp2_poly<kDegree>(static_cast<float>(k)) == std::ldexp(1.0f, k));
}

}  // namespace

TEST_CASE("exp2_poly: each degree within its stated bound, on the reduced argument and on x; integers exact") {
  check_degree<2>();
  check_degree<3>();
  check_degree<4>();
}

TEST_CASE("exp2_poly: 0 below the range and at -inf, a normal float at its edge") {
  CHECK(exp2_poly<3>(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(exp2_poly<3>(std::nextafter(kExp2PolyMinInput, -1000.0f)) == 0.0f);
  CHECK(exp2_poly<3>(-1000.0f) == 0.0f);
  const float edge = exp2_poly<3>(kExp2PolyMinInput);
  CHECK(std::isnormal(edge));
  CHECK(edge == std::ldexp(1.0f, -125));
  const float just_above = exp2_poly<3>(-124.6f);
  CHECK(std::isnormal(just_above));
  CHECK(rel_error(just_above, std::exp2(-124.6)) <= kExp2PolyMaxRelError<3>);
}

TEST_CASE("exp2_poly at degree 3: rounding to bf16 hides it") {
  // P's entries are 2^x for x <= 0. The polynomial's error (1.1e-4) is a fortieth of bf16's unit roundoff (2^-8), so
  // after rounding an entry is at most one bf16 ulp from the exact value's rounding, and is a different bf16 value
  // only when the exact value lies within the polynomial's error of a rounding boundary: for a relative spacing of at
  // least 2^-8 between bf16 values, at most a fraction 2^8 x the bound of uniformly spread values.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> x_of(-30.0f, 0.0f);
  constexpr int kSamples = 400000;
  int differ = 0;
  double worst = 0;
  for (int n = 0; n < kSamples; ++n) {
    const float x = x_of(rng);
    const double exact = std::exp2(static_cast<double>(x));
    const double ours = round_to_bf16(exp2_poly<3>(x)), theirs = round_to_bf16(static_cast<float>(exact));
    if (ours != theirs) {
      ++differ;
      const double ulp = std::ldexp(1.0, std::ilogb(theirs) - 7);  // bf16: 8 significant bits
      REQUIRE(std::abs(ours - theirs) <= ulp);
    }
    worst = std::max(worst, std::abs(ours / exact - 1));
  }
  CHECK(static_cast<double>(differ) / kSamples <= std::ldexp(kExp2PolyMaxRelError<3>, 8));
  // Rounded, the polynomial's entries are as accurate as bf16 can be, to within its own error.
  CHECK(worst <= std::ldexp(1.0, -8) + kExp2PolyMaxRelError<3> * (1 + std::ldexp(1.0, -8)));
}
