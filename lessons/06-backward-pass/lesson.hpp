#pragma once
// Lesson 06: FlashAttention-2's backward pass for one head, on plain row-major arrays. You write these
// functions in exercise.cpp; solution.cpp is ours; test.cpp checks yours against the project's reference
// (src/cpu_reference: naive_forward, naive_backward, tiled_backward in the FA2 loop order).
//
// Notation (the papers'): S = tau Q K^T, P = softmax(S) row by row, O = P V; L_i = m_i + log(l_i), the
// logsumexp of row i, saved by the forward pass; dO = dLoss/dO, given; dQ, dK, dV the gradients to compute.
#include <span>
#include <vector>

namespace flashlab::lesson06 {

// One head's tensors as the backward pass receives them, row-major: element (r, c) of an (R, C) matrix
// is at [r * C + c].
struct Head {
  std::span<const double> Q, K, V;  // (seq_q, d), (seq_k, d), (seq_k, d): the forward's inputs
  std::span<const double> O;        // (seq_q, d): the forward's output
  std::span<const double> dO;       // (seq_q, d): the gradient of the loss with respect to O
  std::span<const double> L;        // (seq_q): the forward's logsumexp per query row
  int seq_q = 0, seq_k = 0, d = 0;
  double scale = 0.0;               // tau, the softmax scale: S = tau Q K^T
  bool causal = false;              // top-left causal mask: query r sees key c only if c <= r
};

// D_i = rowsum(dO_i o O_i): for every query row r, the dot product of row r of dO with row r of O.
// dO and O are (seq_q, d). Returns D, (seq_q).
std::vector<double> row_dot(std::span<const double> dO, std::span<const double> O, int seq_q, int d);

// The probabilities of one tile, recomputed from the saved logsumexp instead of stored:
//   P_ij[r][c] = exp(S - L[row0 + r]),  S = tau * (row row0 + r of Q) . (row col0 + c of K)
// for r < rows, c < cols; under the causal mask an entry whose key col0 + c comes after its query
// row0 + r is masked (S = -inf there), so P = 0. Returns P_ij, (rows, cols).
std::vector<double> recompute_p(const Head& h, int row0, int rows, int col0, int cols);

struct Gradients {
  std::vector<double> dQ;  // (seq_q, d)
  std::vector<double> dK;  // (seq_k, d)
  std::vector<double> dV;  // (seq_k, d)
  int tiles_visited = 0;   // (i, j) tiles the loops computed: every tile, less the ones the mask skips
};

// FlashAttention-2's backward pass (its Algorithm 2): D = row_dot(dO, O) once, then the key blocks j
// (Bc rows of K and V) OUTSIDE, in the order key_block_order gives (a permutation of 0 .. Tc - 1), and
// the query blocks i (Br rows of Q, dO, L, D) inside, in order 0 .. Tr - 1. For each tile (i, j) that the
// mask does not skip:
//   P_ij  = recompute_p(...)                 (Br, Bc)
//   dV_j += P_ij^T dO_i                      (Bc, d)   on chip
//   dP_ij = dO_i V_j^T                       (Br, Bc)
//   dS_ij = P_ij o (dP_ij - D_i)             (Br, Bc)
//   dQ_i += tau dS_ij K_j                    (Br, d)   in HBM: read, added to, written back
//   dK_j += tau dS_ij^T Q_i                  (Bc, d)   on chip
// and dK_j, dV_j are written once, after the inner loop. The last blocks may be shorter.
Gradients tiled_backward(const Head& h, int Br, int Bc, std::span<const int> key_block_order);

// dQ_i's sum, the way a GPU makes it: each key block j hands over its piece (here: pieces[j], all of one
// length) and the pieces are added into ONE float accumulator that starts at 0, elementwise, in exactly
// the order `order` names (a permutation of 0 .. pieces.size() - 1): the order the thread blocks' atomic
// adds arrive in, or the fixed order of a deterministic mode. Returns the sum, in float.
std::vector<float> add_in_order(const std::vector<std::vector<float>>& pieces, std::span<const int> order);

}  // namespace flashlab::lesson06
