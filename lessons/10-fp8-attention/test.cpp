// Lesson 10's test: your head_amax, e4m3_scale and quantize_e4m3_per_head (lesson.hpp) against the project's
// quantizer (src/cpu_reference/fp8.hpp: quantize_e4m3_per_head), and what a quantizer must guarantee: values in
// [-448, 448] that e4m3 holds, each head's largest |x| on 448, and q * descale within e4m3's unit roundoff 2^-4
// of x. Then your fast_walsh_hadamard and hadamard_rotate_row against the project's (fast_walsh_hadamard,
// hadamard_rotate with rotation_signs), and what the rotation must guarantee: it is orthogonal, it leaves Q K^T
// unchanged, and on inputs with outlier channels it shrinks the error that quantizing adds to Q K^T. A failure
// says in plain words what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/fp8.hpp"
#include "lesson.hpp"

namespace lesson = flashlab::lesson10;
using flashlab::HostTensor;
using lesson::Dims;

namespace {

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

std::string where(int b, int s, int h, int c) {
  return "(b, s, h, c) = (" + std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) + ", " +
         std::to_string(c) + ")";
}

std::string head_name(int b, int h) { return "head " + std::to_string(h) + " of batch " + std::to_string(b); }

// ---- Part 1: inputs and the reference --------------------------------------------------------------------

// A float tensor as the project's HostTensor (double values, the same layout), for the reference quantizer.
HostTensor to_host(const std::vector<float>& x, const Dims& t) {
  HostTensor out({t.B, t.S, t.H, t.d});
  for (std::size_t i = 0; i < x.size(); ++i) out.data[i] = x[i];
  return out;
}

// B = 2, S = 5, H = 3, d = 8, each head of its own magnitude, so that one scale for the whole tensor, or the
// wrong head's, is visible. Head 0 of batch 0 has its largest magnitude on a NEGATIVE value; head 1 of batch 1
// is all zeros; head 2 of batch 1 has its largest magnitude in its last row and last channel.
constexpr Dims kScripted{.B = 2, .S = 5, .H = 3, .d = 8};
std::vector<float> scripted_input() {
  const Dims& t = kScripted;
  const float magnitude[2][3] = {{1.0f, 100.0f, 0.01f}, {3.0f, 0.0f, 1e-3f}};
  std::mt19937 rng(10);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(t.size());
  for (int b = 0; b < t.B; ++b)
    for (int s = 0; s < t.S; ++s)
      for (int h = 0; h < t.H; ++h)
        for (int c = 0; c < t.d; ++c) {
          x[lesson::index(t, b, s, h, c)] = normal(rng) * magnitude[b][h];
        }
  x[lesson::index(t, 0, 3, 0, 5)] = -9.5f;                 // max |x| of (0, 0), and a negative value
  x[lesson::index(t, 1, t.S - 1, 2, t.d - 1)] = 7.25e-3f;  // max |x| of (1, 2), at its very last element
  x[lesson::index(t, 0, t.S - 1, 1, 2)] = 480.0f;          // max |x| of the whole tensor, in its own head
  return x;
}

// The amax of one head over the rows [0, rows) and channels [0, cols): the right one with rows = S, cols = d.
float amax_over(const std::vector<float>& x, const Dims& t, int b, int h, int rows, int cols, bool magnitude = true) {
  float m = magnitude ? 0.0f : -std::numeric_limits<float>::infinity();
  for (int s = 0; s < rows; ++s)
    for (int c = 0; c < cols; ++c) {
      const float v = x[lesson::index(t, b, s, h, c)];
      m = std::max(m, magnitude ? std::abs(v) : v);
    }
  return m;
}

// Every diagnose_* function returns "" when your code is right, else plain words saying what is wrong and
// where to look; the test cases CHECK that it is empty.

std::string diagnose_head_amax(const std::vector<float>& x, const Dims& t) {
  float global = 0.0f;
  for (float v : x) global = std::max(global, std::abs(v));
  for (int b = 0; b < t.B; ++b)
    for (int h = 0; h < t.H; ++h) {
      const float want = amax_over(x, t, b, h, t.S, t.d);
      const float got = lesson::head_amax(x, t, b, h);
      if (got == want) continue;
      std::string why = "head_amax of " + head_name(b, h) + " returned " + num(got) + ", expected " + num(want) + ": ";
      // The first S * d values from the head's first element: a contiguous slice, which a head is not.
      float contiguous = 0.0f;
      const std::size_t first = lesson::index(t, b, 0, h, 0);
      for (std::size_t i = first; i < std::min(x.size(), first + std::size_t(t.S) * t.d); ++i)
        contiguous = std::max(contiguous, std::abs(x[i]));
      if (got == 0.0f)
        why += "nothing was read (TODO 1): amax is the largest |x| over the head's S rows and d channels";
      else if (got == amax_over(x, t, b, h, t.S, t.d, false))
        why += "that is the largest VALUE, not the largest magnitude: the scale must fit the most negative value "
               "too, so amax = max |x| (this head's extreme is " + num(-want) + ")";
      else if (got == contiguous)
        why += "you read S * d consecutive values from the head's first element, but one head's values are not "
               "consecutive: its rows are H * d apart. Read element (b, s, h, c) with index(dims, b, s, h, c)";
      else if (got == global)
        why += "that is the largest |x| of the whole tensor: each (batch, head) has its own amax, over that head's "
               "S x d values only";
      else if (got == amax_over(x, t, b, h, t.S - 1, t.d) || got == amax_over(x, t, b, h, t.S, t.d - 1))
        why += "the head's largest |x| is in its last row or last channel, which your loops do not reach: "
               "s runs over 0 .. S - 1 and c over 0 .. d - 1";
      else
        why += "amax is the largest |x[index(dims, b, s, h, c)]| over s = 0 .. S - 1 and c = 0 .. d - 1";
      return why;
    }
  return "";
}

std::string diagnose_e4m3_scale() {
  for (const float amax : {448.0f, 1.0f, 0.75f, 3.3f, 9.5f, 1.0e4f, 0.0009765625f, 1.0e-30f}) {
    const float want = flashlab::kE4m3Max / amax, got = lesson::e4m3_scale(amax);
    if (got == want) continue;
    std::string why = "e4m3_scale(" + num(amax) + ") returned " + num(got) + ", expected " + num(want) + ": ";
    if (got == amax / flashlab::kE4m3Max)
      why += "the scale must map the head's largest |x| to 448, so amax * scale = 448 and scale = 448 / amax; "
             "yours is amax / 448, which maps 448 to amax";
    else if (got == 1.0f / amax)
      why += "that maps the head's largest |x| to 1; the scale must map it to 448, e4m3's largest value, so that "
             "the small values of the head keep clear of e4m3's subnormals: scale = 448 / amax";
    else if (got == 0.0f)
      why += "TODO 2 is not done: the scale must map the head's largest |x| to 448, scale = 448 / amax";
    else
      why += "the scale must map the head's largest |x| to 448: scale = kE4m3Max / amax, computed in float";
    return why;
  }
  const float zero = lesson::e4m3_scale(0.0f);
  if (zero != 1.0f)
    return "e4m3_scale(0) returned " + num(zero) + ", expected 1: a head of zeros has amax 0 and 448 / 0 is inf, " +
           "whose descale 1 / inf = 0 is no use; any finite scale keeps zeros zero, and the reference uses 1";
  for (const float tiny : {1.0e-37f, 1.0e-40f}) {
    const float got = lesson::e4m3_scale(tiny), want = std::ldexp(1.0f, 126);
    if (got != want)
      return "e4m3_scale(" + num(tiny) + ") returned " + num(got) + ", expected 2^126 = " + num(want) +
             ": 448 / " + num(tiny) + " is more than float's largest value 3.4e38, so the quotient overflows to inf; "
             "when it is not finite, return 2^126 (its inverse, the descale, is then a normal float)";
  }
  return "";
}

std::string diagnose_quantize(const std::vector<float>& x, const Dims& t) {
  const flashlab::Fp8Tensor ref = flashlab::quantize_e4m3_per_head(to_host(x, t), "x");
  const lesson::QuantizedE4m3 got = lesson::quantize_e4m3_per_head(x, t);
  const std::size_t heads = std::size_t(t.B) * t.H;
  if (got.q.size() != x.size())
    return "quantize_e4m3_per_head returned q of " + std::to_string(got.q.size()) + " values; it has x's layout, " +
           std::to_string(x.size()) + " values";
  if (got.descale.size() != heads)
    return "quantize_e4m3_per_head returned " + std::to_string(got.descale.size()) + " descales; there is one per " +
           "(batch, head), B * H = " + std::to_string(heads);
  const bool q_zero = std::all_of(got.q.begin(), got.q.end(), [](float v) { return v == 0.0f; });
  const bool d_zero = std::all_of(got.descale.begin(), got.descale.end(), [](float v) { return v == 0.0f; });
  if (q_zero && d_zero)
    return "quantize_e4m3_per_head returned zeros (TODO 3): for every (b, h), scale = e4m3_scale(head_amax(...)), "
           "descale[b * H + h] = 1 / scale, and q = round_to_e4m3(x * scale) for each element of that head";
  // quantize_e4m3_per_head builds on head_amax and e4m3_scale: a mistake there shows up here first.
  for (int b = 0; b < t.B; ++b)
    for (int h = 0; h < t.H; ++h) {
      const float amax = amax_over(x, t, b, h, t.S, t.d), scale = amax == 0.0f ? 1.0f : flashlab::kE4m3Max / amax;
      if (lesson::head_amax(x, t, b, h) != amax || lesson::e4m3_scale(amax) != scale)
        return "quantize_e4m3_per_head builds on head_amax and e4m3_scale, and for " + head_name(b, h) +
               " (amax " + num(amax) + ", scale " + num(scale) + ") one of them is wrong: make their test cases " +
               "pass first";
    }
  for (int b = 0; b < t.B; ++b)
    for (int h = 0; h < t.H; ++h) {
      const float want = ref.descale_at(b, h), mine = got.descale[std::size_t(b) * t.H + h];
      if (mine == want) continue;
      std::string why = "the descale of " + head_name(b, h) + " is " + num(mine) + ", expected " + num(want) + ": ";
      if (mine == 1.0f / want)
        why += "you stored the scale; the descale is 1 / scale, the factor that maps q back to x";
      else if (t.B > 1 && t.H > 1 && h < t.B && b < t.H && mine == ref.descale_at(h, b))
        why += "that is the descale of head " + std::to_string(b) + " of batch " + std::to_string(h) +
               ": descale is (B, H) row-major, head h of batch b at b * H + h";
      else
        why += "descale = 1 / scale with scale = e4m3_scale(amax) and amax = " + num(amax_over(x, t, b, h, t.S, t.d)) +
               ", the largest |x| of this head";
      return why;
    }
  for (int b = 0; b < t.B; ++b)
    for (int s = 0; s < t.S; ++s)
      for (int h = 0; h < t.H; ++h)
        for (int c = 0; c < t.d; ++c) {
          const std::size_t i = lesson::index(t, b, s, h, c);
          const double want = ref.q.at(b, s, h, c);
          if (got.q[i] == want) continue;
          const float scale = 1.0f / ref.descale_at(b, h), unrounded = x[i] * scale;
          std::string why = "q at " + where(b, s, h, c) + " is " + num(got.q[i]) + ", expected " + num(want) +
                            " = round_to_e4m3(x * scale) with x = " + num(x[i]) + " and this head's scale " +
                            num(scale) + ": ";
          if (got.q[i] == unrounded)
            why += "the value is scaled but not rounded; e4m3 holds 3 mantissa bits, so q = round_to_e4m3(x * scale)";
          else if (got.q[i] == 0.0f)
            why += "this element was never written: every (s, c) of every (b, h) gets its q";
          else
            why += "q goes at the same index as its x, index(dims, b, s, h, c), and uses the scale of its own head";
          return why;
        }
  return "";
}

// A bigger input for the properties: standard normal, with 4 channels 30x larger in every head (outliers), and
// head 1 of batch 1 all zeros.
constexpr Dims kRandom{.B = 2, .S = 64, .H = 4, .d = 64};
std::vector<float> random_input() {
  const Dims& t = kRandom;
  std::mt19937 rng(1010);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(t.size());
  for (int b = 0; b < t.B; ++b)
    for (int s = 0; s < t.S; ++s)
      for (int h = 0; h < t.H; ++h)
        for (int c = 0; c < t.d; ++c) {
          const bool outlier = c == 3 || c == 17 || c == 40 || c == 59;
          x[lesson::index(t, b, s, h, c)] = (b == 1 && h == 1) ? 0.0f : normal(rng) * (outlier ? 30.0f : 1.0f);
        }
  return x;
}

std::string diagnose_quantizer_properties(const std::vector<float>& x, const Dims& t) {
  const lesson::QuantizedE4m3 got = lesson::quantize_e4m3_per_head(x, t);
  if (got.q.size() != x.size() || got.descale.size() != std::size_t(t.B) * t.H)
    return "quantize_e4m3_per_head returned q of " + std::to_string(got.q.size()) + " values and " +
           std::to_string(got.descale.size()) + " descales; they are " + std::to_string(x.size()) + " and B * H = " +
           std::to_string(t.B * t.H);
  // e4m3's unit roundoff, 2^-4, plus float's roundings of x * scale and of 1 / scale.
  const double kUnitRoundoff = std::ldexp(1.0, -4), kSlack = std::ldexp(1.0, -20);
  const float kSmallestNormal = std::ldexp(1.0f, -6);
  for (int b = 0; b < t.B; ++b)
    for (int h = 0; h < t.H; ++h) {
      const float descale = got.descale[std::size_t(b) * t.H + h];
      float largest_q = 0.0f;
      for (int s = 0; s < t.S; ++s)
        for (int c = 0; c < t.d; ++c) {
          const float q = got.q[lesson::index(t, b, s, h, c)];
          if (!(std::abs(q) <= flashlab::kE4m3Max))
            return "q at " + where(b, s, h, c) + " is " + num(q) + ", outside e4m3's range [-448, 448]: the scale " +
                   "must map the head's largest |x| to 448 and no further, and round_to_e4m3 saturates the rest";
          if (flashlab::round_to_e4m3(q) != q)
            return "q at " + where(b, s, h, c) + " is " + num(q) + ", which e4m3 cannot hold (it would be " +
                   num(flashlab::round_to_e4m3(q)) + "): every q must come out of round_to_e4m3";
          largest_q = std::max(largest_q, std::abs(q));
        }
      const bool zeros = amax_over(x, t, b, h, t.S, t.d) == 0.0f;
      if (zeros && !(std::isfinite(descale) && descale > 0.0f))
        return "the descale of " + head_name(b, h) + ", a head of zeros, is " + num(descale) + ": its scale is 1, " +
               "so its descale is 1";
      if (!zeros && largest_q != flashlab::kE4m3Max)
        return "the largest |q| of " + head_name(b, h) + " is " + num(largest_q) + ", not 448: the scale must " +
               "map the head's largest |x| to 448, e4m3's largest value, so that the whole range is used";
      // Where x * scale is a normal e4m3 value (>= 2^-6), rounding moves it by at most 2^-4 of itself.
      for (int s = 0; s < t.S; ++s)
        for (int c = 0; c < t.d; ++c) {
          const std::size_t i = lesson::index(t, b, s, h, c);
          if (x[i] == 0.0f || !(std::abs(x[i]) >= kSmallestNormal * descale)) continue;
          const double back = double(got.q[i]) * descale, rel = std::abs(back - x[i]) / std::abs(x[i]);
          if (rel <= kUnitRoundoff + kSlack) continue;
          if (std::abs(got.q[i]) == flashlab::kE4m3Max)
            return "x = " + num(x[i]) + " at " + where(b, s, h, c) + " came back as q * descale = " + num(back) +
                   ": it was clipped at 448, so the scale maps something smaller than the head's largest |x| " +
                   "to 448. amax must be the largest |x| of the whole (S, d) slice of the head";
          return "q * descale at " + where(b, s, h, c) + " is " + num(back) + " for x = " + num(x[i]) +
                 ", a relative error of " + num(rel) + ": it must stand for x within e4m3's unit roundoff " +
                 "2^-4 = 0.0625 wherever x * scale is a normal e4m3 value (>= 2^-6); the descale must be exactly " +
                 "1 / scale of the scale that made q";
        }
    }
  return "";
}

// ---- Part 2: the rotation ----------------------------------------------------------------------------------

std::vector<double> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> x(n);
  for (double& v : x) v = normal(rng);
  return x;
}

// max_i |a_i - b_i| against the size of b, so that sums taken in another order still agree.
bool close(const std::vector<double>& a, const std::vector<double>& b, double rel = 1e-12) {
  if (a.size() != b.size()) return false;
  double err = 0, size = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return false;
    err = std::max(err, std::abs(a[i] - b[i]));
    size = std::max(size, std::abs(b[i]));
  }
  return err <= rel * std::max(size, 1e-300);
}

std::vector<double> reference_fwht(std::vector<double> x) {
  flashlab::fast_walsh_hadamard(x);
  return x;
}

std::vector<double> times(std::vector<double> x, double f) {
  for (double& v : x) v *= f;
  return x;
}

std::vector<double> your_fwht(std::vector<double> x) {
  lesson::fast_walsh_hadamard(x);
  return x;
}

std::string diagnose_fwht(std::size_t n) {
  const std::vector<double> x = random_vector(n, unsigned(100 + n));
  const std::vector<double> want = reference_fwht(x), got = your_fwht(x);
  if (close(got, want)) return "";
  std::string why = "fast_walsh_hadamard on " + std::to_string(n) + " values: ";
  if (n == 1) return why + "H_1 = [1], so one value stays as it is; yours changed it to " + num(got[0]);
  if (got == x) return why + "x came back unchanged (TODO 4): butterflies of span 1, 2, 4, ... < n";
  if (close(times(got, std::sqrt(double(n))), want))
    return why + "your result is H x / sqrt(n): this transform is the unnormalized one, H with entries +-1 " +
           "(H_n H_n = n I); the 1 / sqrt(d) belongs to hadamard_rotate_row";
  // Column by column: H e_j is column j of H, whose entry i is (-1)^popcount(i & j).
  for (std::size_t j = 0; j < n; ++j) {
    std::vector<double> e(n, 0.0);
    e[j] = 1.0;
    const std::vector<double> col = your_fwht(e);
    for (std::size_t i = 0; i < n; ++i) {
      const double entry = (__builtin_popcountll(i & j) % 2) ? -1.0 : 1.0;
      if (col[i] != entry)
        return why + "H e_" + std::to_string(j) + " must be column " + std::to_string(j) + " of H_" +
               std::to_string(n) + ", whose entry " + std::to_string(i) + " is (-1)^popcount(" + std::to_string(i) +
               " & " + std::to_string(j) + ") = " + num(entry) + "; yours is " + num(col[i]) +
               ". In the pass of span len, pair x[j] with x[j + len] inside each block of 2 len entries and replace "
               "them by (a + b, a - b)";
    }
  }
  return why + "the result differs from H x though every column of H is right: the transform must be linear, "
               "the same butterflies whatever x holds";
}

// Variants of the rotation that are easy to write by mistake, to name them.
std::vector<double> signed_(std::vector<double> x, const std::vector<double>& signs) {
  for (std::size_t c = 0; c < x.size(); ++c) x[c] *= signs[c];
  return x;
}

std::string diagnose_rotate(int d, std::uint64_t seed) {
  const Dims t{.B = 1, .S = 3, .H = 2, .d = d};
  HostTensor x({t.B, t.S, t.H, t.d});
  x.data = random_vector(t.size(), unsigned(seed * 7 + d));
  const HostTensor want = flashlab::hadamard_rotate(x, seed);
  const std::vector<double> signs = flashlab::rotation_signs(d, seed);
  const double inv = 1.0 / std::sqrt(double(d));
  for (std::size_t row = 0; row * d < x.data.size(); ++row) {
    const auto first = x.data.begin() + std::ptrdiff_t(row * d);
    const std::vector<double> in(first, first + d);
    const std::vector<double> ref(want.data.begin() + std::ptrdiff_t(row * d),
                                  want.data.begin() + std::ptrdiff_t((row + 1) * d));
    std::vector<double> got = in;
    lesson::hadamard_rotate_row(got, signs);
    if (close(got, ref)) continue;
    std::string why = "hadamard_rotate_row at d = " + std::to_string(d) + " (row " + std::to_string(row) +
                      ", signs of seed " + std::to_string(seed) + "): ";
    if (got == in) return why + "the row came back unchanged (TODO 5): x <- H (D x) / sqrt(d)";
    if (close(got, times(reference_fwht(in), inv)))
      return why + "your result is H x / sqrt(d): the random signs are missing. D x first (x[c] *= signs[c]), " +
             "then the transform; without the signs, an input aligned with a column of H stays concentrated";
    if (close(got, signed_(times(reference_fwht(in), inv), signs)))
      return why + "your result is D H x / sqrt(d): the signs come first, x <- H (D x) / sqrt(d); applied after " +
             "the transform they give another map, whose transpose is not the project's";
    if (close(got, reference_fwht(signed_(in, signs))))
      return why + "your result is H D x without the normalization: divide by sqrt(d), which makes the map " +
             "orthogonal (H H = d I, so H / sqrt(d) keeps lengths)";
    if (close(got, times(reference_fwht(signed_(in, signs)), 1.0 / d)))
      return why + "your result is H D x / d: divide by sqrt(d), not d (H / d would shrink every length by sqrt(d))";
    return why + "your result differs from the project's hadamard_rotate: x[c] *= signs[c], then " +
           "fast_walsh_hadamard(x), then x[c] /= sqrt(d)";
  }
  return "";
}

// The rotation of one row with your code.
std::vector<double> rotated(std::vector<double> x, const std::vector<double>& signs) {
  lesson::hadamard_rotate_row(x, signs);
  return x;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

std::string diagnose_orthogonal(int d) {
  const std::vector<double> signs = flashlab::rotation_signs(d, 3);
  std::vector<std::vector<double>> columns;  // R e_j
  for (int j = 0; j < d; ++j) {
    std::vector<double> e(std::size_t(d), 0.0);
    e[std::size_t(j)] = 1.0;
    columns.push_back(rotated(e, signs));
  }
  // Flat: H has entries +-1, so H D e_j / sqrt(d) has every entry +-1 / sqrt(d): one channel, however large,
  // ends up spread evenly over all d.
  const double flat = 1.0 / std::sqrt(double(d));
  for (int j = 0; j < d; ++j)
    for (int i = 0; i < d; ++i) {
      const double got = columns[std::size_t(j)][std::size_t(i)];
      if (!(std::abs(std::abs(got) - flat) <= 1e-12)) {
        std::vector<double> e(std::size_t(d), 0.0);
        e[std::size_t(j)] = 1.0;
        return "the rotation must spread each channel evenly over all d channels: entry " + std::to_string(i) +
               " of R e_" + std::to_string(j) + " (channel " + std::to_string(j) + " alone, rotated) is " + num(got) +
               ", and every entry of H D e_j / sqrt(d) is +-1 / sqrt(d) = +-" + num(flat) + " at d = " +
               std::to_string(d) + (columns[std::size_t(j)] == e ? " (yours left the channel where it was)" : "");
      }
    }
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) {
      const double got = dot(columns[std::size_t(i)], columns[std::size_t(j)]), want = i == j ? 1.0 : 0.0;
      if (std::abs(got - want) > 1e-12)
        return "the rotation must be orthogonal (R^T R = I) at d = " + std::to_string(d) + ": R e_" +
               std::to_string(i) + " . R e_" + std::to_string(j) + " is " + num(got) + ", not " + num(want) +
               (i == j ? ": a rotated unit vector must keep length 1 (divide by sqrt(d))"
                       : ": two rotated basis vectors must stay perpendicular");
    }
  return "";
}

std::string diagnose_scores_unchanged(int d) {
  const std::vector<double> signs = flashlab::rotation_signs(d, 11);
  for (unsigned r = 0; r < 8; ++r) {
    std::vector<double> q = random_vector(std::size_t(d), 300 + r), k = random_vector(std::size_t(d), 400 + r);
    q[5] *= 40.0, k[5] *= 40.0;  // an outlier channel in both
    const double want = dot(q, k), got = dot(rotated(q, signs), rotated(k, signs));
    const double size = std::sqrt(dot(q, q) * dot(k, k));
    if (!(std::abs(got - want) <= 1e-12 * size))
      return "rotating a query and a key with the same signs must leave their dot product unchanged (the map " +
             std::string("is orthogonal: (R q) . (R k) = q . R^T R k = q . k), at d = ") + std::to_string(d) +
             ": q . k = " + num(want) + " before, " + num(got) + " after";
  }
  return "";
}

// What the rotation buys: Q and K with 4 outlier channels 30x larger, scaled to unit root mean square (scores
// of a few units, as in trained models), one head of N = 64 tokens at d = 128. The RMS error of the scores
// Q K^T / sqrt(d) computed from the quantized Q, K (q * descale), against the exact ones, without and with
// the rotation; both with your quantizer and your rotation.
struct ScoreErrors {
  double plain = 0, rotated = 0;
  std::string problem;
};

ScoreErrors score_errors() {
  constexpr int kN = 64, kD = 128;
  constexpr Dims t{.B = 1, .S = kN, .H = 1, .d = kD};
  const int outliers[] = {9, 50, 77, 120};
  std::mt19937 rng(2024);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> q(t.size()), k(t.size());
  for (std::vector<double>* m : {&q, &k}) {
    for (std::size_t i = 0; i < m->size(); ++i) {
      const int c = int(i % kD);
      const bool outlier = std::find(std::begin(outliers), std::end(outliers), c) != std::end(outliers);
      (*m)[i] = normal(rng) * (outlier ? 30.0 : 1.0);
    }
    const double rms = std::sqrt(dot(*m, *m) / double(m->size()));
    for (double& v : *m) v /= rms;
  }
  const double tau = 1.0 / std::sqrt(double(kD));
  const std::vector<double> signs = flashlab::rotation_signs(kD, 5);
  ScoreErrors out;
  for (const bool rotate : {false, true}) {
    std::vector<double> rq = q, rk = k;
    if (rotate)
      for (int s = 0; s < kN; ++s) {
        std::span<double> qs(rq.data() + std::size_t(s) * kD, kD), ks(rk.data() + std::size_t(s) * kD, kD);
        lesson::hadamard_rotate_row(qs, signs);
        lesson::hadamard_rotate_row(ks, signs);
      }
    const std::vector<float> fq(rq.begin(), rq.end()), fk(rk.begin(), rk.end());
    const lesson::QuantizedE4m3 a = lesson::quantize_e4m3_per_head(fq, t), b = lesson::quantize_e4m3_per_head(fk, t);
    if (a.q.size() != t.size() || b.q.size() != t.size() || a.descale.size() != 1 || b.descale.size() != 1) {
      out.problem = "this check needs part 1: quantize_e4m3_per_head must return q of x's size and one descale per "
                    "head";
      return out;
    }
    double sum2 = 0;
    for (int i = 0; i < kN; ++i)
      for (int j = 0; j < kN; ++j) {
        double exact = 0, quantized = 0;
        for (int c = 0; c < kD; ++c) {
          const std::size_t qi = std::size_t(i) * kD + c, kj = std::size_t(j) * kD + c;
          exact += q[qi] * k[kj];  // the unrotated inputs: the rotation must not change the scores
          quantized += double(a.q[qi]) * a.descale[0] * double(b.q[kj]) * b.descale[0];
        }
        sum2 += std::pow(tau * (quantized - exact), 2);
      }
    (rotate ? out.rotated : out.plain) = std::sqrt(sum2 / (kN * kN));
  }
  return out;
}

}  // namespace

TEST_CASE("Part 1: head_amax is the largest |x| of one (batch, head), over its S rows and d channels") {
  const std::vector<float> x = scripted_input();
  const std::string mistake = diagnose_head_amax(x, kScripted);
  CHECK_MESSAGE(mistake.empty(), mistake);
}

TEST_CASE("Part 1: e4m3_scale maps the head's largest |x| to 448, zeros to scale 1, and never overflows") {
  const std::string mistake = diagnose_e4m3_scale();
  CHECK_MESSAGE(mistake.empty(), mistake);
}

TEST_CASE("Part 1: quantize_e4m3_per_head equals the project's quantize_e4m3_per_head") {
  SUBCASE("heads of very different sizes, a negative extreme, a head of zeros (B = 2, S = 5, H = 3, d = 8)") {
    const std::string mistake = diagnose_quantize(scripted_input(), kScripted);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
  SUBCASE("standard normal with 4 outlier channels 30x larger (B = 2, S = 64, H = 4, d = 64)") {
    const std::string mistake = diagnose_quantize(random_input(), kRandom);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("Part 1: q is e4m3 in [-448, 448], each head's largest |q| is 448, q * descale is x within 2^-4") {
  const std::string mistake = diagnose_quantizer_properties(random_input(), kRandom);
  CHECK_MESSAGE(mistake.empty(), mistake);
}

TEST_CASE("Part 2: fast_walsh_hadamard equals the project's (H_2n = [[H_n, H_n], [H_n, -H_n]])") {
  for (const std::size_t n : {1, 2, 4, 8, 16, 64, 128, 256}) {
    const std::string mistake = diagnose_fwht(n);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("Part 2: hadamard_rotate_row equals the project's hadamard_rotate (x -> H D x / sqrt(d))") {
  for (const int d : {64, 128, 256})
    for (const std::uint64_t seed : {1u, 42u}) {
      const std::string mistake = diagnose_rotate(d, seed);
      CHECK_MESSAGE(mistake.empty(), mistake);
    }
}

TEST_CASE("Part 2: the rotation spreads every channel over all d and is orthogonal, so Q K^T does not change") {
  for (const int d : {64, 128}) {
    std::string mistake = diagnose_orthogonal(d);
    if (mistake.empty()) mistake = diagnose_scores_unchanged(d);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("Parts 1 and 2: with outlier channels, rotating before quantizing shrinks the error of Q K^T") {
  const ScoreErrors e = score_errors();
  REQUIRE_MESSAGE(e.problem.empty(), e.problem);
  INFO("RMS error of the scores Q K^T / sqrt(d) from e4m3 Q and K: " << e.plain << " without the rotation, "
                                                                     << e.rotated << " with it");
  CHECK_MESSAGE(e.rotated * 2 < e.plain,
                "rotating Q and K before quantizing must at least halve the error of the scores on these inputs "
                "(4 channels of 128 are 30x larger than the rest): spread over all channels, the outliers no longer "
                "dominate every dot product with their rounding errors. Check parts 1 and 2 above first");
}
