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

// The causal rule as one inequality: query i sees key j iff j <= i + causal_shift (0 for top-left,
// seq_k - seq_q for bottom-right). last_visible_key is this, clipped to the last key. Sequence-parallel
// code (model/ring.hpp) uses it on global token indices, where a rank's tokens need not be contiguous.
FLASHLAB_HD int causal_shift(CausalAlign align, int seq_q, int seq_k) {
  return align == CausalAlign::BottomRight ? seq_k - seq_q : 0;
}

// How many (query, key) pairs the mask leaves visible: seq_q * seq_k when not causal. The work of
// attention is proportional to it (core/flops.hpp).
inline long long visible_scores(CausalAlign align, int seq_q, int seq_k) {
  long long n = 0;
  for (int row = 0; row < seq_q; ++row) {
    const int keys_seen = last_visible_key(align, row, seq_q, seq_k) + 1;
    if (keys_seen > 0) n += keys_seen;
  }
  return n;
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
