// Lesson 10, reference solution (see exercise.cpp for the guided version).
#include <algorithm>
#include <cmath>

#include "core/fp8.hpp"
#include "lesson.hpp"

namespace flashlab::lesson10 {

float head_amax(std::span<const float> x, const Dims& dims, int b, int h) {
  float amax = 0.0f;
  for (int s = 0; s < dims.S; ++s)
    for (int c = 0; c < dims.d; ++c) amax = std::max(amax, std::abs(x[index(dims, b, s, h, c)]));
  return amax;
}

float e4m3_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float scale = kE4m3Max / amax;
  return std::isfinite(scale) ? scale : std::ldexp(1.0f, 126);
}

QuantizedE4m3 quantize_e4m3_per_head(std::span<const float> x, const Dims& dims) {
  QuantizedE4m3 out{std::vector<float>(dims.size()), std::vector<float>(std::size_t(dims.B) * dims.H)};
  for (int b = 0; b < dims.B; ++b)
    for (int h = 0; h < dims.H; ++h) {
      const float scale = e4m3_scale(head_amax(x, dims, b, h));
      out.descale[std::size_t(b) * dims.H + h] = 1.0f / scale;
      for (int s = 0; s < dims.S; ++s)
        for (int c = 0; c < dims.d; ++c) {
          const std::size_t i = index(dims, b, s, h, c);
          out.q[i] = round_to_e4m3(x[i] * scale);
        }
    }
  return out;
}

void fast_walsh_hadamard(std::span<double> x) {
  // Butterflies of span 1, 2, 4, ...: after the pass of span `len`, each aligned block of 2 len entries holds
  // H_{2 len} times its input, because H_2n = [[H_n, H_n], [H_n, -H_n]] pairs entry j with entry j + len.
  for (std::size_t len = 1; len < x.size(); len *= 2)
    for (std::size_t i = 0; i < x.size(); i += 2 * len)
      for (std::size_t j = i; j < i + len; ++j) {
        const double a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

void hadamard_rotate_row(std::span<double> x, std::span<const double> signs) {
  for (std::size_t c = 0; c < x.size(); ++c) x[c] *= signs[c];
  fast_walsh_hadamard(x);
  const double norm = 1.0 / std::sqrt(static_cast<double>(x.size()));
  for (double& v : x) v *= norm;
}

}  // namespace flashlab::lesson10
