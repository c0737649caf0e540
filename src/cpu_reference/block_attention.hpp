#pragma once
// Internal to src/cpu_reference: attention of one block of queries against one block of keys, with an
// optional causal diagonal at a local offset, forward and backward. This is the unit of work the ring
// (ring.cpp) hands each rank at each step; the tiled nests do the same arithmetic tile by tile with an
// online softmax, here a block is small enough to take whole. Built from tile_steps.hpp's pieces, so a
// row that sees no key gets O = 0, L = -inf and zero gradients as everywhere else.
#include <optional>

#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/tile_steps.hpp"

namespace flashlab::detail {

// The causal diagonal of a block: local key c is visible from local query a iff c <= a + offset.
// std::nullopt: every key is visible.
using CausalOffset = std::optional<int>;

template <class T>
struct BlockResult {
  Mat<T> O;  // (m, d), normalized over this block's keys
  Col<T> L;  // (m): the logsumexp of this block's scores; -inf where the row sees none of its keys
};

// S = tau Q K^T, masked; O = softmax(S) V and L = logsumexp(S), row by row.
// Q (m, d), K and V (n, d).
template <class T>
BlockResult<T> block_forward(const Mat<T>& Q, const Mat<T>& K, const Mat<T>& V, T tau, CausalOffset offset) {
  Mat<T> S = tau * (Q * K.transpose());  // (m, n)
  if (offset) apply_causal_offset(S, *offset);
  const Col<T> m = S.rowwise().maxCoeff().array();
  S = (S.array().colwise() - finite_or_zero<T>(m)).exp().matrix();  // P~ = exp(S - m)
  const Col<T> l = S.rowwise().sum().array();
  BlockResult<T> r;
  r.O = S * V;  // (m, d)
  r.O.array().colwise() *= safe_inverse<T>(l);
  r.L = logsumexp<T>(m, l);
  return r;
}

template <class T>
struct BlockGrads {
  Mat<T> dQ;      // (m, d): this block's share of dQ
  Mat<T> dK, dV;  // (n, d): this block's share of dK, dV
};

// The backward of one block given the final statistics of its query rows: L, the logsumexp over every
// key (not only this block's), and D = rowsum(dO o O). Then P = exp(S - L) is this block's part of the
// full softmax, and the block's gradients are exactly its share of the sums over blocks:
// dV = P^T dO, dP = dO V^T, dS = P o (dP - D), dQ = tau dS K, dK = tau dS^T Q.
// Q, dO (m, d); K, V (n, d); L, D (m).
template <class T>
BlockGrads<T> block_backward(const Mat<T>& Q, const Mat<T>& K, const Mat<T>& V, const Mat<T>& dO, const Col<T>& L,
                             const Col<T>& D, T tau, CausalOffset offset) {
  Mat<T> P = tau * (Q * K.transpose());  // (m, n)
  if (offset) apply_causal_offset(P, *offset);
  probabilities_from_lse<T>(P, L);
  BlockGrads<T> g;
  g.dV = P.transpose() * dO;             // (n, d)
  Mat<T> dS = dO * V.transpose();        // dP, (m, n)
  dS = (P.array() * (dS.array().colwise() - D)).matrix();
  g.dQ = tau * (dS * K);                 // (m, d)
  g.dK = tau * (dS.transpose() * Q);     // (n, d)
  return g;
}

}  // namespace flashlab::detail
