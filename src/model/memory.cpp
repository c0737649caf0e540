#include "model/memory.hpp"

#include <limits>

namespace flashlab {

std::int64_t naive_extra_bytes(const Shape& s, int bytes_per_element, bool backward) {
  // One (batch, head) at a time: S and P, plus dP and dS in the backward pass, each (S_q, S_k).
  // Saturates instead of overflowing, so an absurd size is refused rather than wrapped around.
  const std::int64_t matrices = backward ? 4 : 2;
  const double bytes = double(matrices) * s.seq_q * s.seq_k * bytes_per_element;
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  return bytes >= static_cast<double>(kMax) ? kMax : matrices * std::int64_t{s.seq_q} * s.seq_k * bytes_per_element;
}

}  // namespace flashlab
