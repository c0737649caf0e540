// Lesson 06, reference solution: FlashAttention-2's backward pass for one head. What changed from the
// forward pass of lesson 02: the loops are turned round (key blocks outside, so dK_j and dV_j are finished
// on chip), P is recomputed from the saved L instead of being stored, and D = rowsum(dO o O) replaces
// rowsum(P o dP), so no row of P is ever needed whole. The extra memory stays O(seq_q): D.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "lesson.hpp"

namespace flashlab::lesson06 {

std::vector<double> row_dot(std::span<const double> dO, std::span<const double> O, int seq_q, int d) {
  const auto D_ = static_cast<std::size_t>(d);
  std::vector<double> D(static_cast<std::size_t>(seq_q), 0.0);
  for (std::size_t r = 0; r < D.size(); ++r)
    for (std::size_t k = 0; k < D_; ++k) D[r] += dO[r * D_ + k] * O[r * D_ + k];
  return D;
}

std::vector<double> recompute_p(const Head& h, int row0, int rows, int col0, int cols) {
  const auto D_ = static_cast<std::size_t>(h.d);
  std::vector<double> P(static_cast<std::size_t>(rows) * cols, 0.0);  // (rows, cols)
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int q = row0 + r, key = col0 + c;
      if (h.causal && key > q) continue;  // masked: S = -inf, P = 0
      double dot = 0.0;
      for (std::size_t k = 0; k < D_; ++k) dot += h.Q[q * D_ + k] * h.K[key * D_ + k];
      P[static_cast<std::size_t>(r) * cols + c] = std::exp(h.scale * dot - h.L[q]);
    }
  return P;
}

Gradients tiled_backward(const Head& h, int Br, int Bc, std::span<const int> key_block_order) {
  const auto D_ = static_cast<std::size_t>(h.d);
  const double tau = h.scale;
  const int Tr = (h.seq_q + Br - 1) / Br;
  Gradients g{.dQ = std::vector<double>(static_cast<std::size_t>(h.seq_q) * D_, 0.0),
              .dK = std::vector<double>(static_cast<std::size_t>(h.seq_k) * D_, 0.0),
              .dV = std::vector<double>(static_cast<std::size_t>(h.seq_k) * D_, 0.0)};
  const std::vector<double> D = row_dot(h.dO, h.O, h.seq_q, h.d);  // once, before the loops: (seq_q)

  // On chip: the key block's gradients, and one score-sized tile.
  std::vector<double> dK_j(static_cast<std::size_t>(Bc) * D_), dV_j(static_cast<std::size_t>(Bc) * D_);  // (Bc, d)
  std::vector<double> dS_ij(static_cast<std::size_t>(Br) * Bc);                                         // (Br, Bc)

  for (const int j : key_block_order) {  // outer: one GPU thread block per key block
    const int col0 = j * Bc, cols = std::min(Bc, h.seq_k - col0);
    std::fill(dK_j.begin(), dK_j.end(), 0.0);
    std::fill(dV_j.begin(), dV_j.end(), 0.0);
    for (int i = 0; i < Tr; ++i) {  // inner: every query block that sees key block j
      const int row0 = i * Br, rows = std::min(Br, h.seq_q - row0);
      if (h.causal && col0 > row0 + rows - 1) continue;  // the tile's first key comes after its last query: every entry masked
      ++g.tiles_visited;
      const std::vector<double> P_ij = recompute_p(h, row0, rows, col0, cols);  // (rows, cols)
      auto P = [&](int r, int c) { return P_ij[static_cast<std::size_t>(r) * cols + c]; };
      auto dS = [&](int r, int c) -> double& { return dS_ij[static_cast<std::size_t>(r) * cols + c]; };

      // dV_j += P_ij^T dO_i
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          for (std::size_t k = 0; k < D_; ++k) dV_j[c * D_ + k] += P(r, c) * h.dO[(row0 + r) * D_ + k];

      // dP_ij = dO_i V_j^T, in the dS_ij buffer
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          double dot = 0.0;
          for (std::size_t k = 0; k < D_; ++k) dot += h.dO[(row0 + r) * D_ + k] * h.V[(col0 + c) * D_ + k];
          dS(r, c) = dot;
        }

      // dS_ij = P_ij o (dP_ij - D_i), in place
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) dS(r, c) = P(r, c) * (dS(r, c) - D[row0 + r]);

      // dQ_i += tau dS_ij K_j (in HBM: every key block adds its piece);  dK_j += tau dS_ij^T Q_i (on chip)
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          for (std::size_t k = 0; k < D_; ++k) {
            g.dQ[(row0 + r) * D_ + k] += tau * dS(r, c) * h.K[(col0 + c) * D_ + k];
            dK_j[c * D_ + k] += tau * dS(r, c) * h.Q[(row0 + r) * D_ + k];
          }
    }
    // dK_j and dV_j are complete: they leave the chip once
    for (int c = 0; c < cols; ++c)
      for (std::size_t k = 0; k < D_; ++k) {
        g.dK[(col0 + c) * D_ + k] = dK_j[c * D_ + k];
        g.dV[(col0 + c) * D_ + k] = dV_j[c * D_ + k];
      }
  }
  return g;
}

std::vector<float> add_in_order(const std::vector<std::vector<float>>& pieces, std::span<const int> order) {
  std::vector<float> sum(pieces.empty() ? 0 : pieces[0].size(), 0.0f);
  for (const int j : order)  // one piece at a time, in float, in the order given
    for (std::size_t k = 0; k < sum.size(); ++k) sum[k] += pieces[j][k];
  return sum;
}

}  // namespace flashlab::lesson06
