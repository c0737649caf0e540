// Lesson 08, reference solution (see exercise.cpp for the guided version).
#include <cmath>

#include "lesson.hpp"

namespace flashlab::lesson08 {

RingCursor advance(RingCursor cursor, int stages) {
  if (++cursor.stage == stages) {  // wrapped: the next pass over the ring waits on the next phase
    cursor.stage = 0;
    cursor.phase ^= 1u;
  }
  return cursor;
}

bool try_wait_parity(const MBarrier& bar, std::uint32_t parity) { return bar.phase != parity; }

std::uint32_t consumer_full_parity(RingCursor cursor) { return cursor.phase; }

// One phase behind the consumer: on the first pass the "previous" phase (parity 1) counts as
// completed, so the producer fills every stage once without waiting for anyone.
std::uint32_t producer_empty_parity(RingCursor cursor) { return cursor.phase ^ 1u; }

std::size_t swizzled_offset(int row, int col) {
  const int chunk = (col * 2) / kChunkBytes, within = (col * 2) % kChunkBytes;
  return std::size_t(row) * kRowBytes + std::size_t((chunk ^ (row % 8)) * kChunkBytes + within);
}

std::uint64_t make_descriptor(std::uint32_t address, std::uint32_t lbo, std::uint32_t sbo, Swizzle swizzle) {
  constexpr std::uint64_t k14 = (1u << 14) - 1;
  return ((std::uint64_t(address) >> 4) & k14)        // bits 0-13
         | (((std::uint64_t(lbo) >> 4) & k14) << 16)  // bits 16-29
         | (((std::uint64_t(sbo) >> 4) & k14) << 32)  // bits 32-45
         | (std::uint64_t(swizzle) << 62);            // bits 62-63; base offset 0
}

float exp2_by_polynomial(float x) {
  if (!(x >= kPolyMinInput)) return 0.0f;  // below the range, and -inf: a masked score's P is 0
  const float j = std::nearbyint(x);
  const float f = x - j;  // exact, in [-1/2, 1/2]
  const float p = std::fma(std::fma(std::fma(kPolyC3, f, kPolyC2), f, kPolyC1), f, 1.0f);
  return std::ldexp(p, static_cast<int>(j));
}

int count_rescales(const float* block_maxes, int blocks, float lag) {
  float m = -INFINITY;
  int rescales = 0;
  for (int j = 0; j < blocks; ++j) {
    if (block_maxes[j] > m + lag) {
      rescales += m != -INFINITY;  // the first move only sets m: O is still 0
      m = block_maxes[j];
    }
  }
  return rescales;
}

}  // namespace flashlab::lesson08
