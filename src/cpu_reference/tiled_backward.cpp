// The backward loop nests: FA1 (FlashAttention, Algorithm 4) and FA2 (FlashAttention-2,
// Algorithm 2), each written once for the numbers and for count-only (tiled_nests.hpp says how).
//
// Both recompute S_ij and P_ij from the saved statistics instead of reading an (S_q, S_k) P, and
// both keep the K/V block loop j outer, so dK_j, dV_j accumulate on chip and are written once. They
// differ inside the step: FA1 reads Q_i, O_i, dO_i, dQ_i, l_i, m_i at every step and recomputes
// D_i = rowsum(dO_i o O_i) there; FA2 computes D_i once up front, reads Q_i, dO_i, L_i, D_i, and
// read-modify-writes dQ_i.
#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/tile_steps.hpp"
#include "cpu_reference/tiled_nests.hpp"
#include "model/pseudocode.hpp"

namespace flashlab::detail {

namespace {

// ---------------------------------------------------------------------------------------------
// What both nests share: one (batch, head)'s tensors, the key block's part of the outer loop and
// the arithmetic of a step once its inputs are on chip.

// The tiles of a step "in SRAM".
template <class T>
struct BackwardTiles {
  Mat<T> Qi, Kj, Vj, dOi, Oi, dQi, dKj, dVj;  // (Br or Bc, d)
  Mat<T> Pij, Pdrop, dPij;                     // (Br, Bc)
  Col<T> D_i;                                  // rowsum(dO_i o O_i), (Br)
};

// One (batch, head) of a backward nest: its tensors "in HBM" and the tiles on chip.
template <class T>
struct BackwardHead {
  Mat<T> Qh, Kh, Vh, Oh, dOh, dQh;
  // The saved logsumexp L = m + log(l). FA1's listing reads l_i and m_i and computes
  // P_ij = diag(l_i)^-1 exp(S_ij - m_i), which equals exp(S_ij - L_i): the numbers use L (the
  // forward pass saved nothing else), the events still move l_i and m_i as Algorithm 4 does.
  Col<T> Lh;
  BackwardTiles<T> t;

  void gather(const BackwardArgs& a, const Shape& s, int b, int h) {
    const int h_kv = h / s.group();
    Qh = gather_head<T>(a.in->q, b, h);
    Kh = gather_head<T>(a.in->k, b, h_kv);
    Vh = gather_head<T>(a.in->v, b, h_kv);
    Oh = gather_head<T>(a.fwd->o, b, h);
    dOh = gather_head<T>(*a.dO, b, h);
    Lh = read_lse<T>(a.fwd->lse, s, b, h);
    dQh.setZero(s.seq_q, s.head_dim);
  }
};

// Key block j: Algorithms 4 and 2 agree line for line on this part of the outer loop. K_j, V_j are
// loaded once and stay on chip through the inner loop; dK_j, dV_j start at 0 on chip, accumulate
// over i, and are written once after it.
struct KeyBlock {
  int c0, cj;
  TileRef K_j, V_j, dK_j, dV_j;
  KeyBlock(const Blocks& bk, int j)
      : c0(bk.col0(j)), cj(bk.cols(j)), K_j{TensorId::K, 0, j, cj, bk.d}, V_j{TensorId::V, 0, j, cj, bk.d},
        dK_j{TensorId::dK, 0, j, cj, bk.d}, dV_j{TensorId::dV, 0, j, cj, bk.d} {}
};

template <class T, bool kArith>
void open_key_block(const KeyBlock& kb, BackwardHead<T>& hd, TileTrace& tr, int load_line, int init_line) {
  tr.load(kb.K_j, load_line);
  tr.load(kb.V_j, load_line);
  tr.create(kb.dK_j, init_line);
  tr.create(kb.dV_j, init_line);
  if constexpr (kArith) {
    hd.t.Kj = hd.Kh.middleRows(kb.c0, kb.cj);
    hd.t.Vj = hd.Vh.middleRows(kb.c0, kb.cj);
    hd.t.dKj.setZero(kb.cj, kb.dK_j.cols);
    hd.t.dVj.setZero(kb.cj, kb.dV_j.cols);
  }
}

template <class T, bool kArith>
void close_key_block(const KeyBlock& kb, BackwardHead<T>& hd, const BackwardArgs& a, const Shape& s, int b, int h,
                     TileTrace& tr, int write_line, int end_line) {
  tr.store(kb.dK_j, write_line);
  tr.store(kb.dV_j, write_line);
  tr.free(kb.K_j, end_line);
  tr.free(kb.V_j, end_line);
  if constexpr (kArith) {
    // GQA: the query heads of a group share K_j, V_j, so their gradients add up.
    const int h_kv = h / s.group();
    scatter_rows(a.grads->dk, b, h_kv, kb.c0, hd.t.dKj, true);
    scatter_rows(a.grads->dv, b, h_kv, kb.c0, hd.t.dVj, true);
  }
}

// The step of either listing once Q_i, dO_i, D_i (and K_j, V_j) are on chip: S_ij, then
// P_ij = exp(S_ij - L_i), then the lines dV, dP, dS, dQ, dK. dQ_i is read, updated and written
// back; dK_j and dV_j accumulate on chip.
template <class T>
void backward_step(BackwardHead<T>& hd, const Problem& p, const Blocks& bk, T tau, int b, int h, int i, int j) {
  BackwardTiles<T>& t = hd.t;
  const int r0 = bk.row0(i), ri = bk.rows(i), c0 = bk.col0(j);
  score_tile(t.Pij, t.Qi, t.Kj, tau, p, tile_has_mask(p, bk, i, j), r0, c0);
  probabilities_from_lse<T>(t.Pij, hd.Lh.segment(r0, ri));
  t.dQi = hd.dQh.middleRows(r0, ri);
  const bool dropout = p.options.dropout_p > 0;
  if (dropout) {
    t.Pdrop = t.Pij;
    apply_dropout(t.Pdrop, p, b, h, r0, c0);
    t.dVj.noalias() += t.Pdrop.transpose() * t.dOi;  // (Bc, d)
  } else {
    t.dVj.noalias() += t.Pij.transpose() * t.dOi;
  }
  t.dPij.noalias() = t.dOi * t.Vj.transpose();  // (Br, Bc)
  apply_dropout(t.dPij, p, b, h, r0, c0);
  // dS_ij = P_ij o (dP_ij - D_i), in place of dP_ij.
  t.dPij = (t.Pij.array() * (t.dPij.array().colwise() - t.D_i)).matrix();
  t.dQi.noalias() += tau * (t.dPij * t.Kj);               // (Br, d)
  t.dKj.noalias() += tau * (t.dPij.transpose() * t.Qi);   // (Bc, d)
  hd.dQh.middleRows(r0, ri) = t.dQi;
}

// ---------------------------------------------------------------------------------------------
// FA1 backward (Algorithm 4): K/V outer; Q_i, O_i, dO_i, dQ_i, l_i, m_i are read at every step and
// dQ_i is written back; D_i is recomputed from dO_i and O_i inside the step.

template <class T, bool kArith>
void fa1_backward_nest(const Problem& p, const Blocks& bk, const BackwardArgs& a, TileTrace& tr) {
  using namespace lines::fa1_bwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  BackwardHead<T> hd;
  BackwardTiles<T>& t = hd.t;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h;
      tr.at(bh, -1, -1);
      tr.compute({TensorId::dQ, 0, 0, s.seq_q, d}, kInitHbm);
      if constexpr (kArith) hd.gather(a, s, b, h);
      for (int j = 0; j < bk.Tc; ++j) {
        const KeyBlock kb(bk, j);
        tr.at(bh, -1, j);
        open_key_block<T, kArith>(kb, hd, tr, kLoadKV, kInitDKV);
        for (int i = 0; i < bk.Tr; ++i) {
          if (skip_tile(p, bk, i, j)) continue;
          const int r0 = bk.row0(i), ri = bk.rows(i), cj = kb.cj;
          const TileRef Q_i{TensorId::Q, i, 0, ri, d}, O_i{TensorId::O, i, 0, ri, d};
          const TileRef dO_i{TensorId::dO, i, 0, ri, d}, dQ_i{TensorId::dQ, i, 0, ri, d};
          const TileRef l_i{TensorId::l, i, 0, ri, 1}, m_i{TensorId::m, i, 0, ri, 1}, D_i{TensorId::D, i, 0, ri, 1};
          const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
          const TileRef dP_ij{TensorId::dP, i, j, ri, cj}, dS_ij{TensorId::dS, i, j, ri, cj};
          tr.at(bh, i, j);
          for (const TileRef& x : {Q_i, O_i, dO_i, dQ_i, l_i, m_i}) tr.load(x, kLoadRow);
          tr.create(S_ij, kScores);
          tr.compute(P_ij, kProbabilities);
          if (p.options.dropout_p > 0) tr.compute(P_ij, kDropout);
          tr.compute(kb.dV_j, kDV);
          tr.create(dP_ij, kDP);
          tr.create(D_i, kD);
          tr.compute(dS_ij, kDS);
          tr.compute(dQ_i, kDQ);
          tr.compute(kb.dK_j, kDK);
          if constexpr (kArith) {
            t.Qi = hd.Qh.middleRows(r0, ri);
            t.Oi = hd.Oh.middleRows(r0, ri);
            t.dOi = hd.dOh.middleRows(r0, ri);
            t.D_i = (t.dOi.array() * t.Oi.array()).rowwise().sum();  // line 15
            backward_step(hd, p, bk, tau, b, h, i, j);
          }
          tr.store(dQ_i, kDQ);
          for (const TileRef& x : {dP_ij, D_i, S_ij, Q_i, O_i, dO_i, l_i, m_i}) tr.free(x, kEndI);
        }
        tr.at(bh, -1, j);
        close_key_block<T, kArith>(kb, hd, a, s, b, h, tr, kWriteDKV, kEndJ);
      }
      if constexpr (kArith) scatter_rows(a.grads->dq, b, h, 0, hd.dQh);
    }
}

// ---------------------------------------------------------------------------------------------
// FA2 backward (FlashAttention-2, Algorithm 2): D = rowsum(dO o O) once up front, then K/V outer;
// P_ij comes straight from L_i, dQ_i is read-modify-written per step, dK_j, dV_j written once.

template <class T, bool kArith>
void fa2_backward_nest(const Problem& p, const Blocks& bk, const BackwardArgs& a, TileTrace& tr) {
  using namespace lines::fa2_bwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  BackwardHead<T> hd;
  BackwardTiles<T>& t = hd.t;
  Col<T> Dh;  // this head's D "in HBM"
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h;
      tr.at(bh, -1, -1);
      tr.compute({TensorId::dQ, 0, 0, s.seq_q, d}, kInitDQ);
      if constexpr (kArith) {
        hd.gather(a, s, b, h);
        Dh.resize(s.seq_q);
      }
      // Line 5: D = rowsum(dO o O), one pass over O and dO.
      for (int i = 0; i < bk.Tr; ++i) {
        const int r0 = bk.row0(i), ri = bk.rows(i);
        const TileRef O_i{TensorId::O, i, 0, ri, d}, dO_i{TensorId::dO, i, 0, ri, d}, D_i{TensorId::D, i, 0, ri, 1};
        tr.at(bh, i, -1);
        tr.load(O_i, kComputeD);
        tr.load(dO_i, kComputeD);
        tr.create(D_i, kComputeD);
        if constexpr (kArith) {
          Dh.segment(r0, ri) = (hd.Oh.middleRows(r0, ri).array() * hd.dOh.middleRows(r0, ri).array()).rowwise().sum();
        }
        tr.store(D_i, kComputeD);
        tr.free(O_i, kComputeD);
        tr.free(dO_i, kComputeD);
      }
      for (int j = 0; j < bk.Tc; ++j) {
        const KeyBlock kb(bk, j);
        tr.at(bh, -1, j);
        open_key_block<T, kArith>(kb, hd, tr, kLoadKV, kInitDKV);
        for (int i = 0; i < bk.Tr; ++i) {
          if (skip_tile(p, bk, i, j)) continue;
          const int r0 = bk.row0(i), ri = bk.rows(i), cj = kb.cj;
          const TileRef Q_i{TensorId::Q, i, 0, ri, d}, dO_i{TensorId::dO, i, 0, ri, d};
          const TileRef dQ_i{TensorId::dQ, i, 0, ri, d};
          const TileRef L_i{TensorId::LSE, i, 0, ri, 1}, D_i{TensorId::D, i, 0, ri, 1};
          const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
          const TileRef dP_ij{TensorId::dP, i, j, ri, cj}, dS_ij{TensorId::dS, i, j, ri, cj};
          tr.at(bh, i, j);
          for (const TileRef& x : {Q_i, dO_i, L_i, D_i}) tr.load(x, kLoadRow);
          tr.create(S_ij, kScores);
          tr.compute(P_ij, kProbabilities);
          tr.compute(kb.dV_j, kDV);
          tr.create(dP_ij, kDP);
          tr.compute(dS_ij, kDS);
          tr.load(dQ_i, kDQ);
          tr.compute(dQ_i, kDQ);
          tr.compute(kb.dK_j, kDK);
          if constexpr (kArith) {
            t.Qi = hd.Qh.middleRows(r0, ri);
            t.dOi = hd.dOh.middleRows(r0, ri);
            t.D_i = Dh.segment(r0, ri);
            backward_step(hd, p, bk, tau, b, h, i, j);
          }
          tr.store(dQ_i, kDQ);
          for (const TileRef& x : {dP_ij, S_ij, Q_i, dO_i, L_i, D_i}) tr.free(x, kEndI);
        }
        tr.at(bh, -1, j);
        close_key_block<T, kArith>(kb, hd, a, s, b, h, tr, kWriteDKV, kEndJ);
      }
      if constexpr (kArith) scatter_rows(a.grads->dq, b, h, 0, hd.dQh);
    }
}

}  // namespace

template <class T, bool kArith>
void backward_nest(Algorithm algorithm, const Problem& p, const Blocks& bk, const BackwardArgs& a, TileTrace& tr) {
  if (algorithm == Algorithm::FA1)
    fa1_backward_nest<T, kArith>(p, bk, a, tr);
  else
    fa2_backward_nest<T, kArith>(p, bk, a, tr);
}

template void backward_nest<double, true>(Algorithm, const Problem&, const Blocks&, const BackwardArgs&, TileTrace&);
template void backward_nest<float, true>(Algorithm, const Problem&, const Blocks&, const BackwardArgs&, TileTrace&);
template void backward_nest<double, false>(Algorithm, const Problem&, const Blocks&, const BackwardArgs&, TileTrace&);

}  // namespace flashlab::detail
