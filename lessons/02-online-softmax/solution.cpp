// Lesson 02, reference solution: the online softmax update and the tiled FlashAttention-2 forward
// pass for one head. What changed from lesson 01: S and P are never stored whole; each (Br, Bc)
// block of scores lives only while it is folded into the rows' running (m, l, o), so the extra
// memory is O(seq_q) for m and l instead of O(seq_q * seq_k) for S and P.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "lesson.hpp"

namespace flashlab::lesson02 {

void online_softmax_update(OnlineRow& row, std::span<const double> s, std::span<const double> Vj) {
  const std::size_t d = row.o.size();
  const double m_block = *std::max_element(s.begin(), s.end());  // m~ = rowmax(S_ij)
  const double m_new = std::max(row.m, m_block);
  // Everything accumulated so far was measured against the old max: rescale it to the new one.
  // For the first block row.m = -inf, so the factor is exp(-inf) = 0 and the (empty) past vanishes.
  const double rescale = std::exp(row.m - m_new);
  row.l *= rescale;
  for (double& x : row.o) x *= rescale;
  for (std::size_t c = 0; c < s.size(); ++c) {
    const double p = std::exp(s[c] - m_new);  // P~_ij[r, c]
    row.l += p;
    for (std::size_t k = 0; k < d; ++k) row.o[k] += p * Vj[c * d + k];
  }
  row.m = m_new;
}

double finish_row(const OnlineRow& row, std::span<double> O_i) {
  for (std::size_t k = 0; k < row.o.size(); ++k) O_i[k] = row.o[k] / row.l;
  return row.m + std::log(row.l);
}

TiledResult tiled_attention(std::span<const double> Q, std::span<const double> K,
                            std::span<const double> V, int seq_q, int seq_k, int d, double scale,
                            int Br, int Bc) {
  const auto D = static_cast<std::size_t>(d);
  TiledResult out{std::vector<double>(static_cast<std::size_t>(seq_q) * D),
                  std::vector<double>(static_cast<std::size_t>(seq_q))};
  const int Tr = (seq_q + Br - 1) / Br;  // query blocks, the last one possibly shorter
  const int Tc = (seq_k + Bc - 1) / Bc;  // key blocks, likewise
  std::vector<double> S_ij(static_cast<std::size_t>(Br) * Bc);  // (Br, Bc): the only score buffer

  for (int i = 0; i < Tr; ++i) {  // FA2: the query block loop is outer, so O_i is written once
    const int row0 = i * Br, rows = std::min(Br, seq_q - row0);
    std::vector<OnlineRow> state(static_cast<std::size_t>(rows), OnlineRow(d));
    for (int j = 0; j < Tc; ++j) {
      const int col0 = j * Bc, cols = std::min(Bc, seq_k - col0);
      // S_ij = scale * Q_i K_j^T   (rows, cols)
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          double dot = 0.0;
          for (std::size_t k = 0; k < D; ++k) dot += Q[(row0 + r) * D + k] * K[(col0 + c) * D + k];
          S_ij[static_cast<std::size_t>(r * cols + c)] = scale * dot;
        }
      const std::span<const double> Vj = V.subspan(col0 * D, cols * D);  // (cols, d)
      for (int r = 0; r < rows; ++r)
        online_softmax_update(state[r], std::span<const double>(S_ij).subspan(r * cols, cols), Vj);
    }
    for (int r = 0; r < rows; ++r)
      out.lse[row0 + r] = finish_row(state[r], std::span<double>(out.O).subspan((row0 + r) * D, D));
  }
  return out;
}

}  // namespace flashlab::lesson02
