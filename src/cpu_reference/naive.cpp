// Standard attention (Algorithm 0 of the FlashAttention paper, and its backward, Algorithm 3):
// S = tau Q K^T and P = softmax(S) are materialized as whole (S_q, S_k) matrices, one (batch, head)
// at a time, with Eigen. This is the ground truth every other variant is checked against (in
// double), and, in fp16/bf16, the baseline of the tolerance rule. Nothing is tiled here: what the
// tiled versions change is exactly that S and P never exist in full.
#include "cpu_reference/naive.hpp"

#include <cmath>
#include <limits>

#include "core/half.hpp"
#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/cpu_variants.hpp"
#include "cpu_reference/tiled.hpp"

namespace flashlab {

using detail::Col;
using detail::Mat;

namespace {

// Rounding after each matmul and softmax. Exact: the identity (the arithmetic is already in T).
// LowPrecision: to fp16 or bf16, the way a framework stores each intermediate in that dtype.
struct Exact {
  template <class M>
  void operator()(M&) const {}
};
struct LowPrecision {
  DType dtype;
  template <class M>
  void operator()(M& m) const {
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      for (Eigen::Index c = 0; c < m.cols(); ++c)
        m(r, c) = static_cast<float>(dtype == DType::F16 ? round_to_f16(m(r, c)) : round_to_bf16(m(r, c)));
  }
};

// Row-wise softmax of S into P, and the row's log-sum-exp. A row that sees no key (all -inf)
// gets P = 0 and LSE = -inf instead of NaN.
template <class T>
void softmax_rows(const Mat<T>& S, Mat<T>& P, Col<T>& lse) {
  const Col<T> m = S.rowwise().maxCoeff().array();
  P = (S.array().colwise() - detail::finite_or_zero<T>(m)).exp().matrix();  // (S_q, S_k)
  const Col<T> l = P.rowwise().sum().array();
  const Col<T> inv_l = (l > T(0)).select(l.inverse(), Col<T>::Zero(l.size()));
  P.array().colwise() *= inv_l;
  lse = (l > T(0)).select(m + l.log(), Col<T>::Constant(l.size(), detail::kNegInf<T>));
}

// S = tau Q K^T with the causal mask, then P = softmax(S): the two (S_q, S_k) matrices.
template <class T, class Round>
void scores_and_probabilities(const Problem& p, const Mat<T>& Q, const Mat<T>& K, const Round& round, Mat<T>& S,
                              Mat<T>& P, Col<T>& lse) {
  S.noalias() = Q * K.transpose();  // (S_q, S_k)
  S *= static_cast<T>(p.softmax_scale());
  round(S);
  if (p.options.causal != CausalAlign::None) detail::apply_causal_mask(S, p, 0, 0);
  softmax_rows(S, P, lse);
  round(P);
}

template <class T, class Round>
ForwardOut forward_impl(const Problem& p, const Qkv& in, const Round& round) {
  validate(p);
  check_dims(p.shape, in);
  const Shape& s = p.shape;
  ForwardOut out{HostTensor(q_dims(s)), HostTensor(lse_dims(s))};
  Mat<T> S, P;  // (S_q, S_k) each: the O(N^2) memory
  Col<T> lse;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int h_kv = h / s.group();
      const Mat<T> Q = detail::gather_head<T>(in.q, b, h);     // (S_q, d)
      const Mat<T> K = detail::gather_head<T>(in.k, b, h_kv);  // (S_k, d)
      const Mat<T> V = detail::gather_head<T>(in.v, b, h_kv);  // (S_k, d)
      scores_and_probabilities(p, Q, K, round, S, P, lse);
      // S is no longer needed: reuse it for the dropped-out P (the LSE stays that of plain P).
      S = P;
      detail::apply_dropout(S, p, b, h, 0, 0);
      round(S);
      Mat<T> O = S * V;  // (S_q, d)
      round(O);
      detail::scatter_rows(out.o, b, h, 0, O);
      for (int r = 0; r < s.seq_q; ++r)
        out.lse.data[(static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + r] = static_cast<double>(lse(r));
    }
  return out;
}

template <class T, class Round>
Grads backward_impl(const Problem& p, const Qkv& in, const HostTensor& dO_all, const Round& round) {
  validate(p);
  check_dims(p.shape, in, &dO_all);
  const Shape& s = p.shape;
  const T tau = static_cast<T>(p.softmax_scale());
  Grads g{HostTensor(q_dims(s)), HostTensor(kv_dims(s)), HostTensor(kv_dims(s))};
  Mat<T> S, P, dP, dS;  // (S_q, S_k) each
  Col<T> lse;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int h_kv = h / s.group();
      const Mat<T> Q = detail::gather_head<T>(in.q, b, h);        // (S_q, d)
      const Mat<T> K = detail::gather_head<T>(in.k, b, h_kv);     // (S_k, d)
      const Mat<T> V = detail::gather_head<T>(in.v, b, h_kv);     // (S_k, d)
      const Mat<T> dO = detail::gather_head<T>(dO_all, b, h);     // (S_q, d)
      scores_and_probabilities(p, Q, K, round, S, P, lse);
      S = P;  // S now holds P o Z / (1 - p)
      detail::apply_dropout(S, p, b, h, 0, 0);
      round(S);
      Mat<T> dV = S.transpose() * dO;  // (S_k, d)
      round(dV);
      dP.noalias() = dO * V.transpose();  // (S_q, S_k): gradient of the dropped-out P ...
      round(dP);
      detail::apply_dropout(dP, p, b, h, 0, 0);  // ... and of P, through the same mask
      round(dP);
      // D_i = sum_j P_ij dP_ij (= rowsum(dO o O)); dS = P o (dP - D).
      const Col<T> D = (P.array() * dP.array()).rowwise().sum();
      dS = (P.array() * (dP.array().colwise() - D)).matrix();
      round(dS);
      Mat<T> dQ = tau * (dS * K);  // (S_q, d)
      round(dQ);
      Mat<T> dK = tau * (dS.transpose() * Q);  // (S_k, d)
      round(dK);
      detail::scatter_rows(g.dq, b, h, 0, dQ);
      // GQA: the query heads of a group share K and V, so their gradients add up.
      detail::scatter_rows(g.dk, b, h_kv, 0, dK, true);
      detail::scatter_rows(g.dv, b, h_kv, 0, dV, true);
    }
  return g;
}

LowPrecision low_precision(DType dtype, const char* who) {
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw InputError(std::string(who) + " rounds to f16 or bf16, not " + to_string(dtype));
  return LowPrecision{dtype};
}

}  // namespace

template <class T>
ForwardOut naive_forward(const Problem& p, const Qkv& in, TrafficObserver* observer) {
  ForwardOut out = forward_impl<T>(p, in, Exact{});
  if (observer)
    count_traffic(Algorithm::Standard, Pass::Forward, p, cpu_variant_tiling(p.shape.head_dim),
                  static_cast<int>(sizeof(T)), *observer);
  return out;
}

template <class T>
Grads naive_backward(const Problem& p, const Qkv& in, const ForwardOut&, const HostTensor& dO) {
  // Standard attention's backward keeps P (here: recomputes it) and never needs O: D = rowsum(P o dP).
  return backward_impl<T>(p, in, dO, Exact{});
}

template ForwardOut naive_forward<double>(const Problem&, const Qkv&, TrafficObserver*);
template ForwardOut naive_forward<float>(const Problem&, const Qkv&, TrafficObserver*);
template Grads naive_backward<double>(const Problem&, const Qkv&, const ForwardOut&, const HostTensor&);
template Grads naive_backward<float>(const Problem&, const Qkv&, const ForwardOut&, const HostTensor&);

ForwardOut naive_forward_lowp(const Problem& p, DType dtype, const Qkv& in) {
  ForwardOut out = forward_impl<float>(p, in, low_precision(dtype, "naive_forward_lowp"));
  return out;
}

Grads naive_backward_lowp(const Problem& p, DType dtype, const Qkv& in, const ForwardOut&, const HostTensor& dO) {
  Grads g = backward_impl<float>(p, in, dO, low_precision(dtype, "naive_backward_lowp"));
  // The group's per-head contributions were summed in double: store the sum in dtype, too.
  round_to(g.dk, dtype);
  round_to(g.dv, dtype);
  return g;
}


}  // namespace flashlab
