#pragma once
// Lesson 10: the two pieces of FP8 attention that decide its accuracy, on the CPU. You write the
// functions declared here in exercise.cpp; solution.cpp is ours; test.cpp checks yours against the
// project's reference (src/cpu_reference/fp8.hpp: quantize_e4m3_per_head, fast_walsh_hadamard,
// hadamard_rotate), and checks the properties that make them useful.
//
// Part 1, per-head scaling: e4m3 (core/fp8.hpp) holds magnitudes from 2^-9 to 448 with 3 mantissa bits.
// Each (batch, head) slice of a (B, S, H, d) tensor is multiplied by its own scale, 448 / amax, so that
// the slice's largest magnitude lands on e4m3's largest value, then rounded to e4m3. The kernel keeps
// the descale 1 / scale to undo it after each matrix product.
//
// Part 2, the rotation: x -> H D x / sqrt(d) along the head dim, D a diagonal of random signs and H the
// Hadamard matrix applied by the fast Walsh-Hadamard transform. The map is orthogonal, so Q K^T does not
// change when both are rotated with the same signs; what changes is that an outlier channel is spread
// over all d channels before rounding.
#include <cstddef>
#include <span>
#include <vector>

namespace flashlab::lesson10 {

// ---- Part 1: per-(batch, head) e4m3 quantization -------------------------------------------------

// A (B, S, H, d) tensor, row-major: the project's layout of Q, K and V (core/tensor.hpp).
struct Dims {
  int B = 1, S = 1, H = 1, d = 1;
  std::size_t size() const { return std::size_t(B) * S * H * d; }
};

// Given. Where element (b, s, h, c) of such a tensor sits. The heads of one token are neighbours: one
// head's (S, d) slice is NOT contiguous, it is S runs of d values, H * d apart.
inline std::size_t index(const Dims& t, int b, int s, int h, int c) {
  return ((std::size_t(b) * t.S + s) * t.H + h) * t.d + c;
}

// The largest magnitude |x| over the (S, d) slice of head h of batch b: all S rows, all d channels of
// that head, and nothing of the other heads or batches. 0 for a slice of zeros.
float head_amax(std::span<const float> x, const Dims& dims, int b, int h);

// The scale that maps a slice's largest magnitude to e4m3's largest value: 448 / amax, in float.
// Two cases need care. amax = 0 (a head of zeros): the scale is 1 (any scale keeps zeros zero; never
// 448 / 0). 448 / amax overflowing float (amax below about 1.3e-36): the scale is 2^126, the largest
// power of two whose inverse, the descale, is still a normal float.
float e4m3_scale(float amax);

struct QuantizedE4m3 {
  std::vector<float> q;        // (B, S, H, d), x's layout: every value one that e4m3 holds, in [-448, 448]
  std::vector<float> descale;  // (B, H), row-major: 1 / scale of that head, in float
};

// Per (b, h): amax = head_amax, scale = e4m3_scale(amax), q = flashlab::round_to_e4m3(x * scale) (the
// product in float) for every element of the slice, descale = 1 / scale (in float). Then q * descale
// stands for x, within e4m3's rounding.
QuantizedE4m3 quantize_e4m3_per_head(std::span<const float> x, const Dims& dims);

// ---- Part 2: the Hadamard rotation ---------------------------------------------------------------

// The unnormalized fast Walsh-Hadamard transform, in place: x <- H_n x, n = x.size() a power of two,
// H_1 = [1] and H_2n = [[H_n, H_n], [H_n, -H_n]] (Sylvester's construction). n log2 n additions and
// subtractions, no multiplication, no 1 / sqrt(n): H_n H_n = n I.
void fast_walsh_hadamard(std::span<double> x);

// One row of Q or K (d values, d a power of two) rotated in place: x <- H (D x) / sqrt(d), where D is
// diag(signs), each sign +1 or -1 (the test passes the project's rotation_signs). First the signs, then
// the transform, then the normalization, which makes the map orthogonal.
void hadamard_rotate_row(std::span<double> x, std::span<const double> signs);

}  // namespace flashlab::lesson10
