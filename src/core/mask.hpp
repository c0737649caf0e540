#pragma once
// The causal mask, element- and tile-wise. One definition for the CPU code and every kernel.
#include "core/hd.hpp"
#include "core/problem.hpp"

namespace flashlab {

// Largest key index query `row` may see, or seq_k - 1 when not causal. Negative: the row sees none.
FLASHLAB_HD int last_visible_key(CausalAlign align, int row, int seq_q, int seq_k) {
  switch (align) {
    case CausalAlign::TopLeft: return row < seq_k - 1 ? row : seq_k - 1;
    case CausalAlign::BottomRight: {
      const int last = row + seq_k - seq_q;
      return last < seq_k - 1 ? last : seq_k - 1;
    }
    default: return seq_k - 1;
  }
}

// Smallest query row that sees key `col` (0 <= col < seq_k); seq_q or more when no row does. The backward
// walks the query rows of a key block from there.
FLASHLAB_HD int first_row_seeing_key(CausalAlign align, int col, int seq_q, int seq_k) {
  switch (align) {
    case CausalAlign::TopLeft: return col;
    case CausalAlign::BottomRight: {
      const int first = col - (seq_k - seq_q);
      return first > 0 ? first : 0;
    }
    default: return 0;
  }
}

FLASHLAB_HD bool is_masked(CausalAlign align, int row, int col, int seq_q, int seq_k) {
  return col > last_visible_key(align, row, seq_q, seq_k);
}

// Tile of rows [row0, row1) x cols [col0, col1) (half-open). Skipped when every element is masked;
// needs the element mask when some element is masked.
FLASHLAB_HD bool tile_fully_masked(CausalAlign align, int row0, int row1, int col0, int seq_q, int seq_k) {
  (void)row0;
  // The last row sees the most keys; if even it sees none of this tile, nobody does.
  return col0 > last_visible_key(align, row1 - 1, seq_q, seq_k);
}
FLASHLAB_HD bool tile_needs_mask(CausalAlign align, int row0, int col1, int seq_q, int seq_k) {
  return col1 - 1 > last_visible_key(align, row0, seq_q, seq_k);
}

}  // namespace flashlab
