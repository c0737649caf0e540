#pragma once
// float8 e4m3 on the host: the OCP FP8 E4M3 format of Hopper's FP8 tensor cores (CUDA's __nv_fp8_e4m3).
// One byte: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits. Normals are (1 + m/8) * 2^(e-7), e = 1..15, up
// to 448 = 1.75 * 2^8; subnormals are m * 2^-9 below the smallest normal 2^-6; there is no infinity, and
// S.1111.111 is NaN. With 3 mantissa bits the unit roundoff is 2^-4 (about one significant decimal digit), over
// a range of 2^-9 to 448. Beside bf16 (8 exponent bits, 7 mantissa bits: range to 3.4e38, unit roundoff 2^-8),
// e4m3 gives up both range and precision for half the bytes, which is why FP8 attention has to scale its inputs.
//
// float -> e4m3 rounds as the GPU's satfinite conversion does (cvt.rn.satfinite.e4m3x2.f32, and
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)): to nearest, ties to even; every magnitude past 448,
// infinities included, becomes +-448; NaN becomes 0x7f whatever its sign (the pattern the toolkit returns).
// tests/fp8_toolkit_crosscheck.cpp compares it with the toolkit's own host conversion.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.hpp"  // bits_to_float, float_to_bits

namespace flashlab {

inline constexpr float kE4m3Max = 448.0f;            // largest finite magnitude, pattern 0x7e
// The keys per K/V block of cuda-fa3-ws's shipped FP8 forward at head dim d (its E4m3HeadConfig::kBc): the order in
// which its online softmax rounds P, which the CPU emulation can follow (cpu_reference/fp8.hpp, LowpAttentionOptions::
// block_keys). Whole 128-key panels of V^T: two at d = 64 and 128 (the wide blocks), one at d = 256.
constexpr int e4m3_kernel_block_keys(int head_dim) { return head_dim <= 128 ? 256 : 128; }
inline constexpr std::uint8_t kE4m3MaxBits = 0x7e;   // S.1111.110
inline constexpr std::uint8_t kE4m3NanBits = 0x7f;   // S.1111.111 (0xff is NaN too)

inline std::uint8_t float_to_e4m3_bits(float x) {
  const std::uint32_t u = float_to_bits(x);
  const std::uint8_t sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return kE4m3NanBits;                  // NaN
  if (abs >= 0x43e00000u) return sign | kE4m3MaxBits;          // |x| >= 448 (inf too): saturate
  const int exp = static_cast<int>(abs >> 23) - 127;           // unbiased exponent of a normal float
  if (abs < 0x00800000u) return sign;                          // zero and float subnormals (< 2^-126): +-0
  const std::uint32_t sig = (abs & 0x7fffffu) | 0x800000u;     // 24-bit significand, the leading 1 included
  // The e4m3 result is an integer count of units: of 2^(exp-3) for a normal (exp >= -6), of 2^-9 below
  // that. `shift` is how many low bits of `sig` fall below one unit; they decide the rounding.
  const int shift = exp >= -6 ? 20 : 14 - exp;
  if (shift > 25) return sign;  // |x| < 2^-11: below half the smallest subnormal 2^-9 / 2, so +-0
  std::uint32_t units = sig >> shift;
  const std::uint32_t rest = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) ++units;  // nearest, ties to even
  if (exp >= -6) {
    // units is 8..16 here (1.mmm scaled by 8); 16 means the rounding carried into the next binade. The
    // pattern is (exponent field << 3) + mantissa = ((exp + 7) << 3) + (units - 8), and a carry lands in the
    // exponent field on its own. |x| < 448 keeps the result at or below 0x7e.
    return sign | static_cast<std::uint8_t>(((exp + 7) << 3) + static_cast<int>(units) - 8);
  }
  // Subnormal range: units is 0..8; 8 is the smallest normal 2^-6, whose pattern 0x08 is that same integer.
  return sign | static_cast<std::uint8_t>(units);
}

inline float e4m3_bits_to_float(std::uint8_t b) {
  const int e = (b >> 3) & 0xf, m = b & 0x7;
  const bool negative = (b & 0x80) != 0;
  if (e == 0xf && m == 0x7) return std::nanf("");
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return negative ? -mag : mag;
}

// The value x becomes once stored as e4m3 (float holds every e4m3 value exactly).
inline float round_to_e4m3(float x) { return e4m3_bits_to_float(float_to_e4m3_bits(x)); }

// The inputs of an FP8 forward (DType::E4M3) as its kernel reads them: Q, K, V as e4m3 bytes in the layouts of
// core/tensor.hpp (q_dims: (B, S_q, H_q, d); kv_dims: (B, S_k, H_kv, d)), each with one descale per (batch, head),
// row-major: (B, H_q) for Q, (B, H_kv) for K and V. An element's real value is its e4m3 value times its head's
// descale. cpu_reference/fp8.hpp makes them from values (quantize_e4m3_qkv).
struct E4m3Qkv {
  std::vector<std::uint8_t> q, k, v;
  std::vector<float> q_descale, k_descale, v_descale;
};

}  // namespace flashlab
