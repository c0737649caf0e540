#pragma once
// fp16 and bf16 on the host: round-to-nearest-even conversions between their 16-bit patterns and
// float. The bit patterns match CUDA's __half and __nv_bfloat16, so buffers move between them as is.
#include <cstdint>
#include <cstring>

namespace flashlab {

inline float bits_to_float(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline std::uint32_t float_to_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t(h) << 16); }

inline std::uint16_t float_to_f16_bits(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);        // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);       // rounds to inf
  if (abs < 0x38800000u) {                                                          // subnormal or 0
    // value = abs_float; f16 subnormal unit is 2^-24. Round half to even via float arithmetic.
    const float a = bits_to_float(abs);
    const float scaled = a * 16777216.0f;  // a / 2^-24, exact (power of two)
    std::uint32_t m = static_cast<std::uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  std::uint32_t e = ((abs >> 23) - 112u) << 10;  // rebias 127 -> 15
  std::uint32_t m = (abs >> 13) & 0x3ffu;
  const std::uint32_t rest = abs & 0x1fffu;
  std::uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (m & 1u))) ++h;  // may carry into the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}
inline float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // subnormal or zero: m * 2^-24
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return bits_to_float(sign | 0x7f800000u | (m << 13));
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

inline double round_to_f16(double x) { return f16_bits_to_float(float_to_f16_bits(static_cast<float>(x))); }
inline double round_to_bf16(double x) { return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(x))); }

}  // namespace flashlab
