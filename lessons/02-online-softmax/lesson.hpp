#pragma once
// Lesson 02: the online softmax and the tiled FlashAttention-2 forward pass, for one head on plain
// row-major arrays. You write these functions in exercise.cpp; solution.cpp is ours; test.cpp checks
// yours against the project's reference (src/cpu_reference: naive_forward, tiled_forward).
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

namespace flashlab::lesson02 {

// What one query row i keeps while the key blocks j = 1, 2, ... stream past (paper notation):
//   m   = m_i, the largest score seen so far
//   l   = l_i, the sum of exp(s - m) over the scores seen so far
//   o   = the row of O, not yet divided by l (FA2's O~_i): the sum of exp(s - m) * (row of V)
//         over the keys seen so far (d)
// Before the first block nothing has been seen: m = -inf, l = 0, o = 0.
struct OnlineRow {
  double m = -std::numeric_limits<double>::infinity();
  double l = 0.0;
  std::vector<double> o;  // (d)
  explicit OnlineRow(int d) : o(static_cast<std::size_t>(d), 0.0) {}
};

// Folds one block of scores into the row's state. s holds the row's scores against the block's
// keys, s = S_ij[r, :] (Bc); Vj holds the block's rows of V (Bc, d), row-major:
//   m_new = max(m, max_c s_c)
//   l_new = exp(m - m_new) * l   + sum_c exp(s_c - m_new)
//   o_new = exp(m - m_new) * o   + sum_c exp(s_c - m_new) * Vj[c, :]
void online_softmax_update(OnlineRow& row, std::span<const double> s, std::span<const double> Vj);

// The row's final output once every block has been folded in:
//   O_i = o / l   (d)          and      L_i = m + log(l)   (the log-sum-exp the backward pass keeps)
// Writes O_i into `O_i` and returns L_i.
double finish_row(const OnlineRow& row, std::span<double> O_i);

struct TiledResult {
  std::vector<double> O;    // (seq_q, d)
  std::vector<double> lse;  // (seq_q): L_i
};

// FlashAttention-2's forward pass for one head: for each block Q_i of Br query rows, for each block
// K_j, V_j of Bc key rows, S_ij = scale * Q_i K_j^T (Br, Bc) and every row is folded in with
// online_softmax_update; then finish_row. The last blocks may be shorter (seq_q % Br, seq_k % Bc).
// Q is (seq_q, d), K and V are (seq_k, d), row-major.
TiledResult tiled_attention(std::span<const double> Q, std::span<const double> K,
                            std::span<const double> V, int seq_q, int seq_k, int d, double scale,
                            int Br, int Bc);

}  // namespace flashlab::lesson02
