#pragma once
// Internal to src/cpu_reference: the Eigen pieces naive.cpp and the tiled nests share, so that the mask,
// the dropout scaling and the (B, S, H, D) <-> per-head layout are written once. Not a public API.
#include <Eigen/Dense>
#include <cmath>
#include <limits>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab::detail {

// Row-major, so a block of rows of a per-head matrix (a tile Q_i, K_j, ...) is contiguous.
template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Col = Eigen::Array<T, Eigen::Dynamic, 1>;  // one value per row: m_i, l_i, L_i, D_i

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// The (S, D) matrix of head h of batch b from a (B, S, H, D) tensor.
template <class T>
Mat<T> gather_head(const HostTensor& t, int b, int h) {
  const auto S = t.dims[1], D = t.dims[3];
  Mat<T> m(S, D);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t d = 0; d < D; ++d) m(s, d) = static_cast<T>(t.at(b, s, h, d));
  return m;
}

// Writes (or, with accumulate, adds) rows [row0, row0 + m.rows()) of head h of batch b.
template <class T>
void scatter_rows(HostTensor& t, int b, int h, std::int64_t row0, const Mat<T>& m, bool accumulate = false) {
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index d = 0; d < m.cols(); ++d) {
      double& x = t.at(b, row0 + r, h, d);
      x = accumulate ? x + static_cast<double>(m(r, d)) : static_cast<double>(m(r, d));
    }
}

// Sets S(r, c) = -inf where global query row0 + r may not see key col0 + c (core/mask.hpp).
template <class T>
void apply_causal_mask(Mat<T>& S, const Problem& p, int row0, int col0) {
  const Shape& s = p.shape;
  for (Eigen::Index r = 0; r < S.rows(); ++r) {
    const int last = last_visible_key(p.options.causal, row0 + static_cast<int>(r), s.seq_q, s.seq_k);
    for (Eigen::Index c = std::max<Eigen::Index>(0, last + 1 - col0); c < S.cols(); ++c) S(r, c) = kNegInf<T>;
  }
}

// Sets S(a, c) = -inf where c > a + causal_offset: a block whose rows and columns are evenly spaced
// tokens (a ring's block pair, model/ring.hpp) meets the causal mask on a diagonal at that offset.
template <class T>
void apply_causal_offset(Mat<T>& S, int causal_offset) {
  for (Eigen::Index a = 0; a < S.rows(); ++a)
    for (Eigen::Index c = std::max<Eigen::Index>(0, a + causal_offset + 1); c < S.cols(); ++c) S(a, c) = kNegInf<T>;
}

// P <- P o Z / (1 - p): the dropout mask of core/philox.hpp, keyed by (seed, batch, query head,
// row, column), so every variant and loop order drops the same elements.
template <class T>
void apply_dropout(Mat<T>& P, const Problem& p, int b, int h, int row0, int col0) {
  const double prob = p.options.dropout_p;
  if (prob <= 0) return;
  const std::uint32_t threshold = dropout_threshold(prob);
  const T keep_scale = static_cast<T>(1.0 / (1.0 - prob));
  for (Eigen::Index r = 0; r < P.rows(); ++r)
    for (Eigen::Index c = 0; c < P.cols(); ++c)
      P(r, c) = dropout_keep(p.options.seed, threshold, b, h, row0 + static_cast<int>(r), col0 + static_cast<int>(c))
                    ? P(r, c) * keep_scale
                    : T(0);
}

// A row max of -inf means the row sees no key yet; subtracting 0 instead keeps exp(-inf - x) = 0
// and avoids exp(-inf + inf) = NaN.
template <class T>
Col<T> finite_or_zero(const Col<T>& m) {
  return (m == kNegInf<T>).select(Col<T>::Zero(m.size()), m);
}

}  // namespace flashlab::detail
