#pragma once
// Counter-based random numbers for dropout: Philox4x32-10 (Salmon et al., SC'11), the generator
// cuRAND and PyTorch use. Keyed by the seed and counted by (batch, head, row, column), so every
// variant, CPU or GPU, in any loop order, drops exactly the same elements of P.
#include <cstdint>

#include "core/hd.hpp"

namespace flashlab {

struct Philox4 {
  std::uint32_t x[4];
};

FLASHLAB_HD std::uint32_t mulhi32(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
}

FLASHLAB_HD Philox4 philox4x32_10(Philox4 counter, std::uint64_t seed) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;      // round multipliers
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;    // key schedule increments
  std::uint32_t k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  std::uint32_t c0 = counter.x[0], c1 = counter.x[1], c2 = counter.x[2], c3 = counter.x[3];
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t hi0 = mulhi32(kMul0, c0), lo0 = kMul0 * c0;
    const std::uint32_t hi1 = mulhi32(kMul1, c2), lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// An element is kept when its 32-bit draw is >= this threshold, so P(drop) = threshold / 2^32 ~= p.
FLASHLAB_HD std::uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  return t >= 4294967295.0 ? 0xffffffffu : static_cast<std::uint32_t>(t);
}

// One Philox call yields the draws of 4 neighbouring columns (col & ~3 ... col | 3): a kernel that
// owns 4 consecutive columns pays for one call. `head` is the query head.
FLASHLAB_HD Philox4 dropout_draws4(std::uint64_t seed, int batch, int head, int row, int col4) {
  return philox4x32_10(Philox4{{static_cast<std::uint32_t>(col4), static_cast<std::uint32_t>(row),
                                static_cast<std::uint32_t>(head), static_cast<std::uint32_t>(batch)}},
                       seed);
}

FLASHLAB_HD bool dropout_keep(std::uint64_t seed, std::uint32_t threshold, int batch, int head, int row,
                              int col) {
  const Philox4 r = dropout_draws4(seed, batch, head, row, col >> 2);
  return r.x[col & 3] >= threshold;
}

}  // namespace flashlab
