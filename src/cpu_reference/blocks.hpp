#pragma once
// Internal to src/cpu_reference: the block geometry of a tiled loop nest. Q is cut into Tr row blocks
// of Br rows, K and V into Tc blocks of Bc rows; the last block of each may be ragged.
#include <algorithm>

#include "core/mask.hpp"
#include "core/problem.hpp"
#include "model/tiling.hpp"

namespace flashlab::detail {

struct Blocks {
  int Br, Bc, Tr, Tc, seq_q, seq_k, d;
  Blocks(const Shape& s, Tiling t)
      : Br(t.Br), Bc(t.Bc), Tr((s.seq_q + t.Br - 1) / t.Br), Tc((s.seq_k + t.Bc - 1) / t.Bc), seq_q(s.seq_q),
        seq_k(s.seq_k), d(s.head_dim) {}
  int row0(int i) const { return i * Br; }
  int col0(int j) const { return j * Bc; }
  int rows(int i) const { return std::min(Br, seq_q - i * Br); }
  int cols(int j) const { return std::min(Bc, seq_k - j * Bc); }
};

// Causal attention never visits a tile whose every element is masked (core/mask.hpp).
inline bool skip_tile(const Problem& p, const Blocks& bk, int i, int j) {
  return p.options.causal != CausalAlign::None &&
         tile_fully_masked(p.options.causal, bk.row0(i), bk.row0(i) + bk.rows(i), bk.col0(j), bk.seq_q, bk.seq_k);
}
// A visited tile that crosses the causal diagonal: its scores are masked element by element.
inline bool tile_has_mask(const Problem& p, const Blocks& bk, int i, int j) {
  return p.options.causal != CausalAlign::None &&
         tile_needs_mask(p.options.causal, bk.row0(i), bk.col0(j) + bk.cols(j), bk.seq_q, bk.seq_k);
}

}  // namespace flashlab::detail
