#pragma once
// How often an online softmax rescales O, with FlashAttention-4's conditional ("lazy") rescaling and without it.
//
// The online softmax visits a row's keys Bc at a time and keeps its running max m. When a block's max exceeds m, the
// exact algorithm rescales the accumulated O and l by exp2(m_old - m_new) and moves m. The lazy rule moves m (and so
// rescales) only when the block's max exceeds m by more than a lag: exponentials are then taken against a max up to
// `lag` below the true one, so P may reach 2^lag, harmless in fp32 sums and 16-bit P for lag = 8
// (cuda-fa3-ws's OnlineSoftmax::kMaxLag; FP8 P, which must stay <= 1, runs lag 0). Rescaling costs d / 2 multiplies
// per thread on O's registers; a GPU warp takes the branch when any of its rows needs it (16 rows per warp in
// cuda-fa3-ws's consumers), so the count that costs is per warp and block.
//
// count_rescales replays the rule on scores in log2 units (scale log2(e) q . k; -inf for a masked key) and counts,
// from each row's second block on (the first only sets m: O is still 0), the blocks where a row moves its max and the
// blocks where any row of a warp does. A block counts for a row only where the row sees one of its keys, and for a
// warp only where one of its rows does: a causal kernel does not visit blocks past the diagonal. The rule is
// OnlineSoftmax's: a block whose max is -inf (all masked) never moves m; the first finite block always does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab {

struct RescaleCounts {
  std::int64_t row_blocks = 0, row_rescales = 0;    // (row, block >= 1) pairs it sees keys of, and those where it moves m
  std::int64_t warp_blocks = 0, warp_rescales = 0;  // (warp, block >= 1) pairs it sees keys of, and where a row moves m
  double row_fraction() const { return row_blocks ? double(row_rescales) / double(row_blocks) : 0.0; }
  double warp_fraction() const { return warp_blocks ? double(warp_rescales) / double(warp_blocks) : 0.0; }
};

// scores: (rows, keys) row-major, log2 units. Rows are grouped rows_per_warp at a time (the last group may be short).
// Throws std::invalid_argument for sizes that do not fit the scores, a block or warp of less than one, or a negative
// lag.
inline RescaleCounts count_rescales(const std::vector<float>& scores, int rows, int keys, int block_keys, float lag,
                                    int rows_per_warp) {
  if (rows < 0 || keys < 0 || std::int64_t(rows) * keys != std::int64_t(scores.size()))
    throw std::invalid_argument("count_rescales: " + std::to_string(scores.size()) + " scores are not " +
                                std::to_string(rows) + " x " + std::to_string(keys));
  if (block_keys < 1 || rows_per_warp < 1 || !(lag >= 0.0f))
    throw std::invalid_argument("count_rescales: blocks and warps of at least one, and a lag >= 0");
  const int blocks = (keys + block_keys - 1) / block_keys;
  RescaleCounts c;
  std::vector<float> m(std::size_t(rows), -INFINITY);
  std::vector<char> moved(std::size_t(rows), 0), sees(std::size_t(rows), 0);
  for (int j = 0; j < blocks; ++j) {
    const int k0 = j * block_keys, k1 = std::min(keys, k0 + block_keys);
    for (int r = 0; r < rows; ++r) {
      const float* row = scores.data() + std::size_t(r) * keys;
      const float block_max = *std::max_element(row + k0, row + k1);
      const bool moves = block_max > m[r] + lag;  // -inf + lag = -inf: the first finite block moves m
      moved[r] = moves && m[r] != -INFINITY;      // a rescale: O and l held something to rescale
      sees[r] = block_max != -INFINITY;
      if (moves) m[r] = block_max;
    }
    if (j == 0) continue;
    for (int r0 = 0; r0 < rows; r0 += rows_per_warp) {
      bool any_moved = false, any_sees = false;
      for (int r = r0; r < std::min(rows, r0 + rows_per_warp); ++r) {
        c.row_blocks += sees[r];
        c.row_rescales += moved[r];
        any_moved = any_moved || moved[r];
        any_sees = any_sees || sees[r];
      }
      c.warp_blocks += any_sees;
      c.warp_rescales += any_moved;
    }
  }
  return c;
}

}  // namespace flashlab
