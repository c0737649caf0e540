// The forward loop nests: FA1 (FlashAttention, Algorithm 1) and FA2 (FlashAttention-2, Algorithm 1),
// each written once for the numbers and for count-only (tiled_nests.hpp says how).
//
// What changed from naive.cpp: S and P never exist as (S_q, S_k) matrices. Q, K, V are cut into
// blocks Q_i (Br, d) and K_j, V_j (Bc, d); each step computes one score tile S_ij (Br, Bc) "in
// SRAM", folds it into running row statistics (m, l) and a partial output, and throws it away.
// What that buys: O(N) extra memory instead of O(N^2), and HBM traffic Theta(N^2 d^2 / M) instead
// of Theta(N d + N^2) (the FlashAttention paper, Theorem 2).
//
// The two differ in loop order:
//  * FA1: the K/V block loop j is outer. Each inner step reads O_i, l_i, m_i from HBM and writes
//    them back, because Q_i's partial result must survive while the next K_j, V_j is loaded.
//  * FA2: the Q block loop i is outer, so O_i, l_i, m_i stay on chip and O is written once,
//    normalized once, with L = m + log(l).
#include <algorithm>
#include <cmath>

#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/tile_steps.hpp"
#include "cpu_reference/tiled_nests.hpp"
#include "model/pseudocode.hpp"

namespace flashlab::detail {

namespace {

// FA1 forward: K/V outer, Q inner; O_i, l_i, m_i make a round trip to HBM at every inner step.

template <class T, bool kArith>
void fa1_forward_nest(const Problem& p, const Blocks& bk, const ForwardArgs& a, TileTrace& tr, const NestRange& r) {
  using namespace lines::fa1_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh, Oh;                     // this head's Q, K, V, O "in HBM"
  Col<T> lh, mh;                             // this head's l, m "in HBM"
  Mat<T> Qi, Kj, Vj, Oi, Sij;                // on chip
  Col<T> li, mi, m_tilde, l_tilde, m_new, l_new, alpha, beta;
  for (int bh = r.bh_begin; bh < std::min(r.bh_end, s.batch * s.heads_q); ++bh) {
    const int b = bh / s.heads_q, h = bh % s.heads_q, h_kv = h / s.group();
    tr.at(bh, -1, -1);
    tr.compute({TensorId::O, 0, 0, s.seq_q, d}, kInitHbm);
    if constexpr (kArith) {
      Qh = gather_head<T>(a.in->q, b, h);     // (S_q, d)
      Kh = gather_head<T>(a.in->k, b, h_kv);  // (S_k, d)
      Vh = gather_head<T>(a.in->v, b, h_kv);  // (S_k, d)
      Oh.setZero(s.seq_q, d);
      lh.setZero(s.seq_q);
      mh.setConstant(s.seq_q, kNegInf<T>);
    }
    for (int j = 0; j < bk.Tc; ++j) {
      const int c0 = bk.col0(j), cj = bk.cols(j);
      const TileRef K_j{TensorId::K, 0, j, cj, d}, V_j{TensorId::V, 0, j, cj, d};
      tr.at(bh, -1, j);
      tr.load(K_j, kLoadKV);
      tr.load(V_j, kLoadKV);
      if constexpr (kArith) {
        Kj = Kh.middleRows(c0, cj);  // (Bc, d)
        Vj = Vh.middleRows(c0, cj);  // (Bc, d)
      }
      for (int i = 0; i < bk.Tr; ++i) {
        if (skip_tile(p, bk, i, j)) continue;
        const int r0 = bk.row0(i), ri = bk.rows(i);
        const TileRef Q_i{TensorId::Q, i, 0, ri, d}, O_i{TensorId::O, i, 0, ri, d};
        const TileRef l_i{TensorId::l, i, 0, ri, 1}, m_i{TensorId::m, i, 0, ri, 1};
        const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
        tr.at(bh, i, j);
        tr.load(Q_i, kLoadQOStats);
        tr.load(O_i, kLoadQOStats);
        tr.load(l_i, kLoadQOStats);
        tr.load(m_i, kLoadQOStats);
        tr.create(S_ij, kScores);
        tr.compute(P_ij, kLocalSoftmax);
        tr.compute(m_i, kNewStats);
        if (p.options.dropout_p > 0) tr.compute(P_ij, kDropout);
        tr.compute(O_i, kWriteO);
        if constexpr (kArith) {
          Qi = Qh.middleRows(r0, ri);  // (Br, d)
          Oi = Oh.middleRows(r0, ri);  // (Br, d)
          li = lh.segment(r0, ri);
          mi = mh.segment(r0, ri);
          score_tile(Sij, Qi, Kj, tau, p, tile_has_mask(p, bk, i, j), r0, c0);  // (Br, Bc)
          // Line 11: the tile's own softmax statistics; P~ overwrites S.
          m_tilde = Sij.rowwise().maxCoeff().array();
          Sij = (Sij.array().colwise() - finite_or_zero<T>(m_tilde)).exp().matrix();
          l_tilde = Sij.rowwise().sum().array();
          // Line 12: merge them with the running ones.
          m_new = mi.max(m_tilde);
          const Col<T> m_ref = finite_or_zero<T>(m_new);
          alpha = (mi - m_ref).exp();       // e^{m_i - m_i^new}
          beta = (m_tilde - m_ref).exp();   // e^{m~_ij - m_i^new}
          l_new = alpha * li + beta * l_tilde;
          apply_dropout(Sij, p, b, h, r0, c0);  // line 13
          // Line 14: O_i <- diag(l_new)^-1 (diag(l_i alpha) O_i + diag(beta) P~_ij V_j).
          const Col<T> inv_l_new = safe_inverse<T>(l_new);
          Oi.array().colwise() *= li * alpha * inv_l_new;
          Sij.array().colwise() *= beta * inv_l_new;
          Oi.noalias() += Sij * Vj;
          Oh.middleRows(r0, ri) = Oi;
          lh.segment(r0, ri) = l_new;
          mh.segment(r0, ri) = m_new;
        }
        tr.store(O_i, kWriteO);
        tr.store(l_i, kWriteStats);
        tr.store(m_i, kWriteStats);
        tr.free(S_ij, kEndI);
        tr.free(Q_i, kEndI);
      }
      tr.at(bh, -1, j);
      tr.free(K_j, kEndJ);
      tr.free(V_j, kEndJ);
    }
    if constexpr (kArith) {
      // FA1's saved statistics are l and m; ForwardOut keeps them as L = m + log(l), which carries
      // the same information (diag(l)^-1 exp(S - m) = exp(S - L)). Bookkeeping, not a transfer.
      scatter_rows(a.out->o, b, h, 0, Oh);
      write_lse(a.out->lse, s, b, h, 0, Col<T>(logsumexp<T>(mh, lh)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// FA2 forward: Q outer, K/V inner; O_i, l_i, m_i live on chip, O_i is normalized and written once.

template <class T, bool kArith>
void fa2_forward_nest(const Problem& p, const Blocks& bk, const ForwardArgs& a, TileTrace& tr, const NestRange& r) {
  using namespace lines::fa2_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh;          // this head's Q, K, V "in HBM"
  Mat<T> Qi, Kj, Vj, Oi, Sij; // on chip
  Col<T> mi, li, m_new, alpha;
  for (int bh = r.bh_begin; bh < std::min(r.bh_end, s.batch * s.heads_q); ++bh) {
    const int b = bh / s.heads_q, h = bh % s.heads_q, h_kv = h / s.group();
    if constexpr (kArith) {
      Qh = gather_head<T>(a.in->q, b, h);     // (S_q, d)
      Kh = gather_head<T>(a.in->k, b, h_kv);  // (S_k, d)
      Vh = gather_head<T>(a.in->v, b, h_kv);  // (S_k, d)
    }
    for (int i = r.i_begin; i < std::min(r.i_end, bk.Tr); ++i) {
      const int r0 = bk.row0(i), ri = bk.rows(i);
      const TileRef Q_i{TensorId::Q, i, 0, ri, d}, O_i{TensorId::O, i, 0, ri, d};
      const TileRef m_i{TensorId::m, i, 0, ri, 1}, l_i{TensorId::l, i, 0, ri, 1}, L_i{TensorId::LSE, i, 0, ri, 1};
      tr.at(bh, i, -1);
      tr.load(Q_i, kLoadQ);
      tr.create(O_i, kInitOnChip);
      tr.create(l_i, kInitOnChip);
      tr.create(m_i, kInitOnChip);
      if constexpr (kArith) {
        Qi = Qh.middleRows(r0, ri);  // (Br, d)
        Oi.setZero(ri, d);           // (Br, d)
        li.setZero(ri);
        mi.setConstant(ri, kNegInf<T>);
      }
      for (int j = 0; j < bk.Tc; ++j) {
        if (skip_tile(p, bk, i, j)) continue;
        const int c0 = bk.col0(j), cj = bk.cols(j);
        const TileRef K_j{TensorId::K, 0, j, cj, d}, V_j{TensorId::V, 0, j, cj, d};
        const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
        tr.at(bh, i, j);
        tr.load(K_j, kLoadKV);
        tr.load(V_j, kLoadKV);
        tr.create(S_ij, kScores);
        tr.compute(P_ij, kOnlineSoftmax);
        tr.compute(O_i, kAccumulate);
        if constexpr (kArith) {
          Kj = Kh.middleRows(c0, cj);  // (Bc, d)
          Vj = Vh.middleRows(c0, cj);  // (Bc, d)
          score_tile(Sij, Qi, Kj, tau, p, tile_has_mask(p, bk, i, j), r0, c0);  // (Br, Bc)
          // Line 10: running max, P~ (overwriting S) and running sum.
          m_new = mi.max(Sij.rowwise().maxCoeff().array());
          const Col<T> m_ref = finite_or_zero<T>(m_new);
          Sij = (Sij.array().colwise() - m_ref).exp().matrix();
          alpha = (mi - m_ref).exp();  // e^{m_i^(j-1) - m_i^(j)}: rescales what was summed so far
          li = alpha * li + Sij.rowwise().sum().array();
          mi = m_new;
          // Line 11: l keeps the undropped sum; only the P~ that multiplies V is dropped out.
          apply_dropout(Sij, p, b, h, r0, c0);
          Oi.array().colwise() *= alpha;
          Oi.noalias() += Sij * Vj;
        }
        tr.free(S_ij, kEndJ);
        tr.free(K_j, kEndJ);
        tr.free(V_j, kEndJ);
      }
      tr.at(bh, i, -1);
      tr.compute(O_i, kNormalize);
      tr.create(L_i, kLse);
      tr.free(l_i, kLse);
      tr.free(m_i, kLse);
      if constexpr (kArith) {
        Oi.array().colwise() *= safe_inverse<T>(li);
        scatter_rows(a.out->o, b, h, r0, Oi);
        write_lse(a.out->lse, s, b, h, r0, Col<T>(logsumexp<T>(mi, li)));
      }
      tr.store(O_i, kWriteO);
      tr.store(L_i, kWriteL);
      tr.free(Q_i, kEndI);
    }
  }
}

}  // namespace

template <class T, bool kArith>
void forward_nest(Algorithm algorithm, const Problem& p, const Blocks& bk, const ForwardArgs& a, TileTrace& tr,
                  const NestRange& r) {
  if (algorithm == Algorithm::FA1)
    fa1_forward_nest<T, kArith>(p, bk, a, tr, r);
  else
    fa2_forward_nest<T, kArith>(p, bk, a, tr, r);
}

template void forward_nest<double, true>(Algorithm, const Problem&, const Blocks&, const ForwardArgs&, TileTrace&,
                                         const NestRange&);
template void forward_nest<float, true>(Algorithm, const Problem&, const Blocks&, const ForwardArgs&, TileTrace&,
                                        const NestRange&);
template void forward_nest<double, false>(Algorithm, const Problem&, const Blocks&, const ForwardArgs&, TileTrace&,
                                          const NestRange&);

}  // namespace flashlab::detail
