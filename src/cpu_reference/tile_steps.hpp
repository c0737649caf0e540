#pragma once
// Internal to src/cpu_reference: small arithmetic steps of the tiled nests, named after the
// pseudocode line they implement, and the reading and writing of the saved LSE.
#include <cstddef>

#include "cpu_reference/attention_math.hpp"

namespace flashlab::detail {

// S_ij = tau Q_i K_j^T, masked where the tile crosses the causal diagonal.  // (Br, Bc)
template <class T>
void score_tile(Mat<T>& S, const Mat<T>& Qi, const Mat<T>& Kj, T tau, const Problem& p, bool masked, int row0,
                int col0) {
  S.noalias() = Qi * Kj.transpose();
  S *= tau;
  if (masked) apply_causal_mask(S, p, row0, col0);
}

// P = exp(S - L) row by row, in place; L = -inf (a row that sees no key) gives P = 0.
template <class T>
void probabilities_from_lse(Mat<T>& S_to_P, const Col<T>& L) {
  S_to_P = (S_to_P.array().colwise() - finite_or_zero<T>(L)).exp().matrix();
}

template <class T>
void write_lse(HostTensor& lse, const Shape& s, int b, int h, int row0, const Col<T>& L) {
  for (Eigen::Index r = 0; r < L.size(); ++r)
    lse.data[(static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + row0 + r] = static_cast<double>(L(r));
}

template <class T>
Col<T> read_lse(const HostTensor& lse, const Shape& s, int b, int h) {
  Col<T> L(s.seq_q);
  for (int r = 0; r < s.seq_q; ++r)
    L(r) = static_cast<T>(lse.data[(static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + r]);
  return L;
}

// L = m + log(l), or -inf where l = 0 (the row saw no key).
template <class T>
Col<T> logsumexp(const Col<T>& m, const Col<T>& l) {
  return (l > T(0)).select(m + l.log(), Col<T>::Constant(l.size(), kNegInf<T>));
}
// 1 / l, or 0 where l = 0, so a fully masked row ends with O = 0 and never 0 / 0.
template <class T>
Col<T> safe_inverse(const Col<T>& l) {
  return (l > T(0)).select(l.inverse(), Col<T>::Zero(l.size()));
}

}  // namespace flashlab::detail
