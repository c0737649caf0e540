// core/fp8.hpp against the CUDA toolkit's own host-side FP8 conversions (cuda_fp8.h), on a machine that has
// the toolkit but needs no GPU: float -> e4m3 with __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) for every
// float whose bit pattern is a multiple of the stride (stride 1, the default: all 2^32 floats), and, whatever the
// stride, every midpoint between neighbouring e4m3 values with the floats on either side of it; e4m3 -> float
// for all 256 patterns through __nv_fp8_e4m3's conversion to float. Prints the first mismatches and a summary;
// exits 1 on any mismatch. CTest runs it (fp8_toolkit_crosscheck) in a build that has the toolkit; by hand:
//
//   g++ -std=c++20 -O2 -Wall -Wextra -I src -I /usr/local/cuda/include tests/fp8_toolkit_crosscheck.cpp -o x
//   ./x [--stride N]
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/fp8.hpp"

namespace {

std::uint8_t toolkit_encode(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

struct Tally {
  std::uint64_t checked = 0, mismatched = 0;
  void compare(float x) {
    ++checked;
    const std::uint8_t ours = flashlab::float_to_e4m3_bits(x), theirs = toolkit_encode(x);
    if (ours == theirs) return;
    if (++mismatched <= 10)
      std::printf("  mismatch: x = %a (bits 0x%08x): ours 0x%02x, toolkit 0x%02x\n", static_cast<double>(x),
                  flashlab::float_to_bits(x), ours, theirs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t stride = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stride") == 0 && i + 1 < argc) {
      stride = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--stride N]\n", argv[0]);
      return 2;
    }
  }
  if (stride == 0) stride = 1;

  // Decoding: all 256 patterns.
  int decode_mismatches = 0;
  for (int b = 0; b < 256; ++b) {
    __nv_fp8_e4m3 t;
    t.__x = static_cast<__nv_fp8_storage_t>(b);
    const float theirs = static_cast<float>(t), ours = flashlab::e4m3_bits_to_float(static_cast<std::uint8_t>(b));
    const bool same = (std::isnan(theirs) && std::isnan(ours)) ||
                      (theirs == ours && std::signbit(theirs) == std::signbit(ours));
    if (!same) {
      ++decode_mismatches;
      std::printf("  decode mismatch: 0x%02x: ours %a, toolkit %a\n", b, static_cast<double>(ours),
                  static_cast<double>(theirs));
    }
  }
  std::printf("decode: 256 patterns, %d mismatches\n", decode_mismatches);

  // Midpoints (and their neighbours) of both signs, including 464, the tie between 448 and the next step.
  Tally mid;
  for (int b = 0; b <= 0x7e; ++b)
    for (const float sign : {1.0f, -1.0f}) {
      const float lo = flashlab::e4m3_bits_to_float(static_cast<std::uint8_t>(b));
      const float hi = b < 0x7e ? flashlab::e4m3_bits_to_float(static_cast<std::uint8_t>(b + 1)) : 480.0f;
      const float m = sign * (lo + hi) / 2;
      mid.compare(m);
      mid.compare(std::nextafter(m, 0.0f));
      mid.compare(std::nextafter(m, sign * INFINITY));
    }
  std::printf("midpoints: %llu floats, %llu mismatches\n", static_cast<unsigned long long>(mid.checked),
              static_cast<unsigned long long>(mid.mismatched));

  // The sweep over float bit patterns (NaNs, infinities, zeros and subnormals included).
  Tally sweep;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += stride) sweep.compare(flashlab::bits_to_float(static_cast<std::uint32_t>(u)));
  std::printf("sweep (every %llu-th float bit pattern): %llu floats, %llu mismatches\n",
              static_cast<unsigned long long>(stride), static_cast<unsigned long long>(sweep.checked),
              static_cast<unsigned long long>(sweep.mismatched));

  const bool ok = decode_mismatches == 0 && mid.mismatched == 0 && sweep.mismatched == 0;
  std::printf("%s\n", ok ? "OK: core/fp8.hpp matches the toolkit" : "FAILED");
  return ok ? 0 : 1;
}
