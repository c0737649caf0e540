#include "model/tiling.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "core/problem.hpp"

namespace flashlab {

Tiling tiling_from_sram(std::int64_t sram_bytes, int head_dim, int bytes_per_element) {
  if (head_dim < 1 || bytes_per_element < 1)
    throw InputError("head_dim and bytes per element must be positive to derive block sizes");
  const std::int64_t M = sram_bytes / bytes_per_element;  // SRAM size in elements
  const std::int64_t four_d = 4 * std::int64_t{head_dim};
  if (M < four_d)
    throw InputError("an SRAM of " + std::to_string(sram_bytes) + " bytes holds " + std::to_string(M) +
                     " elements, fewer than 4d = " + std::to_string(four_d) +
                     " (one row each of Q, K, V and O); use at least " + std::to_string(four_d * bytes_per_element) +
                     " bytes");
  // Bc = ceil(M / 4d) so that K_j, V_j (and Q_i, O_i) fill the SRAM; Br <= d bounds S_ij by Bc x d.
  const std::int64_t Bc = (M + four_d - 1) / four_d;
  const std::int64_t Br = std::min<std::int64_t>(Bc, head_dim);
  constexpr std::int64_t kMaxBlock = std::numeric_limits<int>::max();
  return Tiling{static_cast<int>(std::min(Br, kMaxBlock)), static_cast<int>(std::min(Bc, kMaxBlock))};
}

}  // namespace flashlab
