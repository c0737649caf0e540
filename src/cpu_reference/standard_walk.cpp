// Standard attention's traffic (FlashAttention paper, Algorithms 0 and 3), walked blockwise with the
// same tiles as the FlashAttention nests: every phase is a separate kernel, so S, P, dP and dS make a
// round trip through HBM. Count-only: the numbers come from naive.cpp, whose whole-matrix Eigen
// products are what these blocks model. The softmax and dS phases stream tile by tile; a real
// row-softmax kernel keeps the row's running max and sum on chip, so each element of S (P, dP) is
// read once and P (dS) written once. The forward walk can be cut into its three phases, one per kernel
// of a GPU's standard attention (NestRange).
#include "cpu_reference/tiled_nests.hpp"
#include "model/pseudocode.hpp"

namespace flashlab::detail {

namespace {

void standard_forward_walk(const Problem& p, const Blocks& bk, TileTrace& tr, const NestRange& r) {
  using namespace lines::standard_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const int i_begin = r.i_begin, i_end = std::min(r.i_end, bk.Tr);
  for (int bh = r.bh_begin; bh < std::min(r.bh_end, s.batch * s.heads_q); ++bh) {
    for (int i = i_begin; i < i_end && r.walks(NestPhase::Scores); ++i) {  // S = tau Q K^T
      const TileRef Q_i{TensorId::Q, i, 0, bk.rows(i), d};
      tr.at(bh, i, -1);
      tr.load(Q_i, kScores);
      for (int j = 0; j < bk.Tc; ++j) {
        const TileRef K_j{TensorId::K, 0, j, bk.cols(j), d}, S_ij{TensorId::S, i, j, bk.rows(i), bk.cols(j)};
        tr.at(bh, i, j);
        tr.load(K_j, kScores);
        tr.create(S_ij, kScores);
        tr.store(S_ij, kScores);
        tr.free(K_j, kScores);
      }
      tr.at(bh, i, -1);
      tr.free(Q_i, kScores);
    }
    for (int i = i_begin; i < i_end && r.walks(NestPhase::Softmax); ++i)  // P = softmax(S)
      for (int j = 0; j < bk.Tc; ++j) {
        const TileRef S_ij{TensorId::S, i, j, bk.rows(i), bk.cols(j)}, P_ij{TensorId::P, i, j, bk.rows(i), bk.cols(j)};
        tr.at(bh, i, j);
        tr.load(S_ij, kSoftmax);
        tr.compute(P_ij, kSoftmax);  // P_ij takes S_ij's place on chip
        tr.store(P_ij, kSoftmax);
      }
    for (int i = i_begin; i < i_end && r.walks(NestPhase::Output); ++i) {  // O = P V
      const TileRef O_i{TensorId::O, i, 0, bk.rows(i), d};
      tr.at(bh, i, -1);
      tr.create(O_i, kOutput);
      for (int j = 0; j < bk.Tc; ++j) {
        const TileRef P_ij{TensorId::P, i, j, bk.rows(i), bk.cols(j)}, V_j{TensorId::V, 0, j, bk.cols(j), d};
        tr.at(bh, i, j);
        tr.load(P_ij, kOutput);
        tr.load(V_j, kOutput);
        tr.compute(O_i, kOutput);
        tr.free(P_ij, kOutput);
        tr.free(V_j, kOutput);
      }
      tr.at(bh, i, -1);
      tr.store(O_i, kOutput);
    }
  }
}

void standard_backward_walk(const Problem& p, const Blocks& bk, TileTrace& tr) {
  using namespace lines::standard_bwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  auto q_rows = [&](TensorId t, int i) { return TileRef{t, i, 0, bk.rows(i), d}; };
  auto kv_rows = [&](TensorId t, int j) { return TileRef{t, 0, j, bk.cols(j), d}; };
  auto square = [&](TensorId t, int i, int j) { return TileRef{t, i, j, bk.rows(i), bk.cols(j)}; };
  // out_j = sum_i A_ij^T B_i (dV = P^T dO, dK = tau dS^T Q): one output block per key block j.
  auto key_side_product = [&](int bh, TensorId A, TensorId B, TensorId out, int line) {
    for (int j = 0; j < bk.Tc; ++j) {
      tr.at(bh, -1, j);
      tr.create(kv_rows(out, j), line);
      for (int i = 0; i < bk.Tr; ++i) {
        tr.at(bh, i, j);
        tr.load(square(A, i, j), line);
        tr.load(q_rows(B, i), line);
        tr.compute(kv_rows(out, j), line);
        tr.free(square(A, i, j), line);
        tr.free(q_rows(B, i), line);
      }
      tr.at(bh, -1, j);
      tr.store(kv_rows(out, j), line);
    }
  };
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    key_side_product(bh, TensorId::P, TensorId::dO, TensorId::dV, kDV);
    for (int i = 0; i < bk.Tr; ++i) {  // dP = dO V^T
      tr.at(bh, i, -1);
      tr.load(q_rows(TensorId::dO, i), kDP);
      for (int j = 0; j < bk.Tc; ++j) {
        tr.at(bh, i, j);
        tr.load(kv_rows(TensorId::V, j), kDP);
        tr.create(square(TensorId::dP, i, j), kDP);
        tr.store(square(TensorId::dP, i, j), kDP);
        tr.free(kv_rows(TensorId::V, j), kDP);
      }
      tr.at(bh, i, -1);
      tr.free(q_rows(TensorId::dO, i), kDP);
    }
    for (int i = 0; i < bk.Tr; ++i)  // dS = P o (dP - rowsum(P o dP))
      for (int j = 0; j < bk.Tc; ++j) {
        tr.at(bh, i, j);
        tr.load(square(TensorId::P, i, j), kDS);
        tr.load(square(TensorId::dP, i, j), kDS);
        tr.compute(square(TensorId::dS, i, j), kDS);  // in dP_ij's place
        tr.store(square(TensorId::dS, i, j), kDS);
        tr.free(square(TensorId::P, i, j), kDS);
      }
    for (int i = 0; i < bk.Tr; ++i) {  // dQ = tau dS K
      tr.at(bh, i, -1);
      tr.create(q_rows(TensorId::dQ, i), kDQ);
      for (int j = 0; j < bk.Tc; ++j) {
        tr.at(bh, i, j);
        tr.load(square(TensorId::dS, i, j), kDQ);
        tr.load(kv_rows(TensorId::K, j), kDQ);
        tr.compute(q_rows(TensorId::dQ, i), kDQ);
        tr.free(square(TensorId::dS, i, j), kDQ);
        tr.free(kv_rows(TensorId::K, j), kDQ);
      }
      tr.at(bh, i, -1);
      tr.store(q_rows(TensorId::dQ, i), kDQ);
    }
    key_side_product(bh, TensorId::dS, TensorId::Q, TensorId::dK, kDK);
  }
}

}  // namespace

void standard_walk(Pass pass, const Problem& p, const Blocks& bk, TileTrace& tr, const NestRange& r) {
  pass == Pass::Forward ? standard_forward_walk(p, bk, tr, r) : standard_backward_walk(p, bk, tr);
}

}  // namespace flashlab::detail
