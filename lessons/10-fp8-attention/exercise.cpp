// Lesson 10, exercise: per-head e4m3 quantization, and the Hadamard rotation that tames outlier channels.
//
// Fill in the five TODOs (README.md explains why each step is there), then build and test YOUR file:
//   cmake -S . -B build -DFLASHLAB_LESSON_SOLUTIONS=OFF
//   cmake --build build --target lesson10_fp8_attention
//   ctest --test-dir build -L lesson -R 10 --output-on-failure
// Delete each `(void)x;` line once your code uses x (it only silences "unused" warnings).
#include <algorithm>
#include <cmath>

#include "core/fp8.hpp"  // kE4m3Max = 448, round_to_e4m3
#include "lesson.hpp"

namespace flashlab::lesson10 {

float head_amax(std::span<const float> x, const Dims& dims, int b, int h) {
  // TODO 1 (about 4 lines): the largest |x| over s = 0 .. S - 1 and c = 0 .. d - 1 of this (b, h), read
  // with index(dims, b, s, h, c). Magnitudes: a head whose extreme value is -9 has amax 9.
  (void)x;
  (void)dims;
  (void)b;
  (void)h;
  return 0.0f;
}

float e4m3_scale(float amax) {
  // TODO 2 (about 4 lines): kE4m3Max / amax, so that amax * scale = 448. A head of zeros gets 1. If the
  // quotient is not finite (std::isfinite), return 2^126 (std::ldexp(1.0f, 126)).
  (void)amax;
  return 0.0f;
}

QuantizedE4m3 quantize_e4m3_per_head(std::span<const float> x, const Dims& dims) {
  QuantizedE4m3 out{std::vector<float>(dims.size()), std::vector<float>(std::size_t(dims.B) * dims.H)};
  // TODO 3 (about 10 lines): for every (b, h): scale = e4m3_scale(head_amax(...)); descale[b * H + h] =
  // 1 / scale; and for every (s, c) of that head, q = round_to_e4m3(x * scale) at the same index as x.
  (void)x;
  return out;
}

void fast_walsh_hadamard(std::span<double> x) {
  // TODO 4 (about 8 lines): for len = 1, 2, 4, ... < n: in every block of 2 len entries starting at i,
  // replace each pair (a, b) = (x[j], x[j + len]), j = i .. i + len - 1, by (a + b, a - b).
  // No normalization here.
  (void)x;
}

void hadamard_rotate_row(std::span<double> x, std::span<const double> signs) {
  // TODO 5 (about 4 lines): x[c] *= signs[c] for every c; then fast_walsh_hadamard(x); then divide every
  // entry by sqrt(d), d = x.size().
  (void)x;
  (void)signs;
}

}  // namespace flashlab::lesson10
