// Tiled attention with online softmax on the CPU: FlashAttention's loop nests, written once.
//
// What changed from naive.cpp: S and P never exist as (S_q, S_k) matrices. Q, K, V are cut into
// blocks Q_i (Br, d) and K_j, V_j (Bc, d); each step computes one score tile S_ij (Br, Bc) "in
// SRAM", folds it into running row statistics (m, l) and a partial output, and throws it away.
// What that buys: O(N) extra memory instead of O(N^2), and HBM traffic Theta(N^2 d^2 / M) instead
// of Theta(N d + N^2) (the FlashAttention paper, Theorem 2).
//
// Two loop orders:
//  * FA1 (FlashAttention, Algorithms 1 and 4): the K/V block loop j is outer. Each inner step
//    reads O_i, l_i, m_i from HBM and writes them back, because Q_i's partial result must
//    survive while the next K_j, V_j is loaded.
//  * FA2 (FlashAttention-2, Algorithms 1 and 2): the Q block loop i is outer in the forward pass,
//    so O_i, l_i, m_i stay on chip and O is written once, normalized once, with L = m + log(l).
//    The backward pass keeps K/V outer (dK_j, dV_j accumulate on chip and are written once) and
//    read-modify-writes dQ_i at each step.
//
// Each nest is a template over kArith. kArith = true: the numbers (Eigen block products on
// contiguous tile copies, the tiles' "SRAM"). kArith = false: count-only, the same nest with every
// arithmetic block compiled out, so traffic for N = 128k is walked in milliseconds. Both report the
// same TileEvents (tensor, tile, bytes, direction, loop indices, pseudocode line, SRAM in use) to
// the observer; the tests check that the two streams are identical.
#include "cpu_reference/tiled.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_reference/attention_math.hpp"

namespace flashlab {

using detail::Col;
using detail::Mat;

namespace {

// ---------------------------------------------------------------------------------------------
// Pseudocode listings, in the papers' notation. Each enum gives the 1-based line numbers of the
// listing right below it; TileEvent::line uses them.

namespace standard_fwd {  // FlashAttention paper, Algorithm 0
enum Line : int { kRequire = 1, kScores, kSoftmax, kOutput, kReturn };
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM.",
    "Load Q, K by blocks from HBM, compute S = tau Q K^T, write S to HBM.",
    "Read S from HBM, compute P = softmax(S), write P to HBM.",
    "Load P and V by blocks from HBM, compute O = P V, write O to HBM.",
    "Return O.",
};
}  // namespace standard_fwd

namespace standard_bwd {  // FlashAttention paper, Algorithm 3
enum Line : int { kRequire = 1, kDV, kDP, kDS, kDQ, kDK, kReturn };
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V, dO in R^{N x d}, P in R^{N x N} in HBM.",
    "Load P, dO by blocks from HBM, compute dV = P^T dO, write dV to HBM.",
    "Load dO, V by blocks from HBM, compute dP = dO V^T, write dP to HBM.",
    "Read P, dP from HBM, compute dS where dS_ij = P_ij (dP_ij - sum_l P_il dP_il), write dS to HBM.",
    "Load dS and K by blocks from HBM, compute dQ = tau dS K, write dQ to HBM.",
    "Load dS and Q by blocks from HBM, compute dK = tau dS^T Q, write dK to HBM.",
    "Return dQ, dK, dV.",
};
}  // namespace standard_bwd

namespace fa1_fwd {  // FlashAttention paper, Algorithm 1 (dropout as in Algorithm 2)
enum Line : int {
  kRequire = 1, kBlockSizes, kInitHbm, kDivideQKV, kDivideOStats, kForJ, kLoadKV, kForI, kLoadQOStats,
  kScores, kLocalSoftmax, kNewStats, kDropout, kWriteO, kWriteStats, kEndI, kEndJ, kReturn
};
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM, on-chip SRAM of size M.",
    "Set block sizes Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).",
    "Initialize O = (0)_{N x d}, l = (0)_N, m = (-inf)_N in HBM.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_1..Q_Tr of size Br x d, and K, V into Tc = ceil(N / Bc) "
    "blocks K_1..K_Tc, V_1..V_Tc of size Bc x d.",
    "Divide O into Tr blocks O_i of size Br x d, l into Tr blocks l_i and m into Tr blocks m_i of size Br.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij).",
    "    On chip, compute m_i^new = max(m_i, m~_ij), l_i^new = e^{m_i - m_i^new} l_i + e^{m~_ij - m_i^new} l~_ij.",
    "    On chip, apply dropout: P~_ij <- P~_ij o Z_ij / (1 - p).",
    "    Write O_i <- diag(l_i^new)^-1 (diag(l_i) e^{m_i - m_i^new} O_i + e^{m~_ij - m_i^new} P~_ij V_j) to HBM.",
    "    Write l_i <- l_i^new, m_i <- m_i^new to HBM.",
    "  end for",
    "end for",
    "Return O, l, m.",
};
}  // namespace fa1_fwd

namespace fa1_bwd {  // FlashAttention paper, Algorithm 4
enum Line : int {
  kRequire = 1, kBlockSizes, kDivide, kInitHbm, kForJ, kLoadKV, kInitDKV, kForI, kLoadRow, kScores,
  kProbabilities, kDropout, kDV, kDP, kD, kDS, kDQ, kDK, kEndI, kWriteDKV, kEndJ, kReturn
};
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V, O, dO in R^{N x d} and vectors l, m in R^N in HBM, on-chip SRAM of size M.",
    "Set block sizes Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).",
    "Divide Q, O, dO into Tr blocks of size Br x d, K, V into Tc blocks of size Bc x d, l, m into Tr blocks.",
    "Initialize dQ = (0)_{N x d}, dK = (0)_{N x d}, dV = (0)_{N x d} in HBM.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  Initialize dK~_j = (0)_{Bc x d}, dV~_j = (0)_{Bc x d} on SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, O_i, dO_i, dQ_i, l_i, m_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute P_ij = diag(l_i)^-1 exp(S_ij - m_i) in R^{Br x Bc}.",
    "    On chip, compute the dropout mask Z_ij and P_ij^dropped = P_ij o Z_ij / (1 - p).",
    "    On chip, compute dV~_j <- dV~_j + (P_ij^dropped)^T dO_i in R^{Bc x d}.",
    "    On chip, compute dP_ij = (dO_i V_j^T) o Z_ij / (1 - p) in R^{Br x Bc}.",
    "    On chip, compute D_i = rowsum(dO_i o O_i) in R^{Br}.",
    "    On chip, compute dS_ij = P_ij o (dP_ij - D_i) in R^{Br x Bc}.",
    "    Write dQ_i <- dQ_i + tau dS_ij K_j in R^{Br x d} to HBM.",
    "    On chip, compute dK~_j <- dK~_j + tau dS_ij^T Q_i in R^{Bc x d}.",
    "  end for",
    "  Write dK_j <- dK~_j, dV_j <- dV~_j to HBM.",
    "end for",
    "Return dQ, dK, dV.",
};
}  // namespace fa1_bwd

namespace fa2_fwd {  // FlashAttention-2 paper, Algorithm 1
enum Line : int {
  kRequire = 1, kDivideQKV, kDivideOL, kForI, kLoadQ, kInitOnChip, kForJ, kLoadKV, kScores, kOnlineSoftmax,
  kAccumulate, kEndJ, kNormalize, kLse, kWriteO, kWriteL, kEndI, kReturn
};
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM, block sizes Bc, Br.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_1..Q_Tr of size Br x d, and K, V into Tc = ceil(N / Bc) "
    "blocks K_1..K_Tc, V_1..V_Tc of size Bc x d.",
    "Divide the output O into Tr blocks O_i of size Br x d, and the logsumexp L into Tr blocks L_i of size Br.",
    "for 1 <= i <= Tr do",
    "  Load Q_i from HBM to on-chip SRAM.",
    "  On chip, initialize O_i^(0) = (0)_{Br x d}, l_i^(0) = (0)_Br, m_i^(0) = (-inf)_Br.",
    "  for 1 <= j <= Tc do (causal: skip tiles that are fully masked)",
    "    Load K_j, V_j from HBM to on-chip SRAM.",
    "    On chip, compute S_ij^(j) = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute m_i^(j) = max(m_i^(j-1), rowmax(S_ij)), P~_ij = exp(S_ij - m_i^(j)), "
    "l_i^(j) = e^{m_i^(j-1) - m_i^(j)} l_i^(j-1) + rowsum(P~_ij).",
    "    On chip, compute O_i^(j) = diag(e^{m_i^(j-1) - m_i^(j)}) O_i^(j-1) + (P~_ij o Z_ij / (1 - p)) V_j.",
    "  end for",
    "  On chip, compute O_i = diag(l_i^(Tc))^-1 O_i^(Tc).",
    "  On chip, compute L_i = m_i^(Tc) + log(l_i^(Tc)).",
    "  Write O_i to HBM as the i-th block of O.",
    "  Write L_i to HBM as the i-th block of L.",
    "end for",
    "Return the output O and the logsumexp L.",
};
}  // namespace fa2_fwd

// FlashAttention-2 paper, Algorithm 2. Its inner-loop load line also lists O_i (never used once D
// is known) and dQ_i (loaded again by the dQ line); here each is loaded only where it is used.
namespace fa2_bwd {
enum Line : int {
  kRequire = 1, kDivideQKV, kDivideOL, kInitDQ, kComputeD, kForJ, kLoadKV, kInitDKV, kForI, kLoadRow,
  kScores, kProbabilities, kDV, kDP, kDS, kDQ, kDK, kEndI, kWriteDKV, kEndJ, kReturn
};
const std::vector<std::string> listing = {
    "Require: Matrices Q, K, V, O, dO in R^{N x d} in HBM, vector L in R^N in HBM, block sizes Bc, Br.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_i of size Br x d, and K, V into Tc = ceil(N / Bc) blocks "
    "K_j, V_j of size Bc x d.",
    "Divide O, dO into Tr blocks O_i, dO_i of size Br x d, and L into Tr blocks L_i of size Br.",
    "Initialize dQ = (0)_{N x d} in HBM and divide it into Tr blocks dQ_i; divide dK, dV into Tc blocks.",
    "Compute D = rowsum(dO o O) in R^N (load O_i, dO_i; write D_i to HBM), divide it into Tr blocks D_i.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  Initialize dK_j = (0)_{Bc x d}, dV_j = (0)_{Bc x d} on SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, dO_i, L_i, D_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute P_ij = exp(S_ij - L_i) in R^{Br x Bc}.",
    "    On chip, compute dV_j <- dV_j + (P_ij o Z_ij / (1 - p))^T dO_i in R^{Bc x d}.",
    "    On chip, compute dP_ij = (dO_i V_j^T) o Z_ij / (1 - p) in R^{Br x Bc}.",
    "    On chip, compute dS_ij = P_ij o (dP_ij - D_i) in R^{Br x Bc}.",
    "    Load dQ_i from HBM to SRAM, then on chip update dQ_i <- dQ_i + tau dS_ij K_j, and write it back to HBM.",
    "    On chip, compute dK_j <- dK_j + tau dS_ij^T Q_i in R^{Bc x d}.",
    "  end for",
    "  Write dK_j, dV_j to HBM.",
    "end for",
    "Return dQ, dK, dV.",
};
}  // namespace fa2_bwd

// ---------------------------------------------------------------------------------------------
// Block geometry: Tr x Tc tiles, the last row/column block possibly ragged.

struct Blocks {
  int Br, Bc, Tr, Tc, seq_q, seq_k, d;
  Blocks(const Shape& s, Tiling t)
      : Br(t.Br), Bc(t.Bc), Tr((s.seq_q + t.Br - 1) / t.Br), Tc((s.seq_k + t.Bc - 1) / t.Bc), seq_q(s.seq_q),
        seq_k(s.seq_k), d(s.head_dim) {}
  int row0(int i) const { return i * Br; }
  int col0(int j) const { return j * Bc; }
  int rows(int i) const { return std::min(Br, seq_q - i * Br); }
  int cols(int j) const { return std::min(Bc, seq_k - j * Bc); }
};

// Causal attention never visits a tile whose every element is masked (core/mask.hpp).
bool skip_tile(const Problem& p, const Blocks& bk, int i, int j) {
  return p.options.causal != CausalAlign::None &&
         tile_fully_masked(p.options.causal, bk.row0(i), bk.row0(i) + bk.rows(i), bk.col0(j), bk.seq_q, bk.seq_k);
}
bool tile_has_mask(const Problem& p, const Blocks& bk, int i, int j) {
  return p.options.causal != CausalAlign::None &&
         tile_needs_mask(p.options.causal, bk.row0(i), bk.col0(j) + bk.cols(j), bk.seq_q, bk.seq_k);
}

// ---------------------------------------------------------------------------------------------
// The event side of a nest: one call per HBM <-> SRAM transfer or pseudocode step. Keeps the SRAM
// ledger (bytes resident). With no observer every call returns at once, so the arithmetic run pays
// nothing for it.

struct TileRef {
  TensorId tensor;
  int tile_row, tile_col, rows, cols;
};

class TileTrace {
 public:
  TileTrace(TrafficObserver* observer, Algorithm algorithm, Pass pass, int bytes_per_element)
      : observer_(observer), bytes_per_element_(bytes_per_element) {
    event_.algorithm = algorithm;
    event_.pass = pass;
  }
  // Where the nest is: (batch * heads_q + head) and the loop indices (-1 outside that loop).
  void at(int bh, int i, int j) {
    event_.bh = bh;
    event_.i = i;
    event_.j = j;
  }
  void load(const TileRef& t, int line) { emit(t, Direction::Load, line, +1, true); }   // HBM -> SRAM
  void store(const TileRef& t, int line) { emit(t, Direction::Store, line, -1, true); } // SRAM -> HBM, leaves
  void create(const TileRef& t, int line) { emit(t, Direction::Compute, line, +1, false); }  // new on chip
  void compute(const TileRef& t, int line) { emit(t, Direction::Compute, line, 0, false); }  // update on chip
  void free(const TileRef& t, int line) { emit(t, Direction::Free, line, -1, false); }       // leaves, no write

 private:
  void emit(const TileRef& t, Direction direction, int line, int sram_sign, bool moves_bytes) {
    if (!observer_) return;
    const std::int64_t tile_bytes = std::int64_t{t.rows} * t.cols * bytes_per_element_;
    sram_bytes_ += sram_sign * tile_bytes;
    event_.tensor = t.tensor;
    event_.direction = direction;
    event_.tile_row = t.tile_row;
    event_.tile_col = t.tile_col;
    event_.rows = t.rows;
    event_.cols = t.cols;
    event_.bytes = moves_bytes ? tile_bytes : 0;
    event_.line = line;
    event_.sram_bytes = sram_bytes_;
    observer_->on_event(event_);
    ++event_.index;
  }

  TrafficObserver* observer_;
  int bytes_per_element_;
  std::int64_t sram_bytes_ = 0;
  TileEvent event_;
};

// ---------------------------------------------------------------------------------------------
// Small arithmetic steps, named after the pseudocode line they implement.

// S_ij = tau Q_i K_j^T, masked where the tile crosses the causal diagonal.  // (Br, Bc)
template <class T>
void score_tile(Mat<T>& S, const Mat<T>& Qi, const Mat<T>& Kj, T tau, const Problem& p, bool masked, int row0,
                int col0) {
  S.noalias() = Qi * Kj.transpose();
  S *= tau;
  if (masked) detail::apply_causal_mask(S, p, row0, col0);
}

// P = exp(S - L) row by row, in place; L = -inf (a row that sees no key) gives P = 0.
template <class T>
void probabilities_from_lse(Mat<T>& S_to_P, const Col<T>& L) {
  S_to_P = (S_to_P.array().colwise() - detail::finite_or_zero<T>(L)).exp().matrix();
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
  return (l > T(0)).select(m + l.log(), Col<T>::Constant(l.size(), detail::kNegInf<T>));
}
// 1 / l, or 0 where l = 0, so a fully masked row ends with O = 0 and never 0 / 0.
template <class T>
Col<T> safe_inverse(const Col<T>& l) {
  return (l > T(0)).select(l.inverse(), Col<T>::Zero(l.size()));
}

// Arguments of a nest. In count-only mode every pointer is null and nothing is read.
struct ForwardArgs {
  const Qkv* in = nullptr;
  ForwardOut* out = nullptr;
};
struct BackwardArgs {
  const Qkv* in = nullptr;
  const ForwardOut* fwd = nullptr;
  const HostTensor* dO = nullptr;
  Grads* grads = nullptr;
};

// ---------------------------------------------------------------------------------------------
// FA1 forward: K/V outer, Q inner; O_i, l_i, m_i make a round trip to HBM at every inner step.

template <class T, bool kArith>
void fa1_forward_nest(const Problem& p, const Blocks& bk, const ForwardArgs& a, TileTrace& tr) {
  using namespace fa1_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh, Oh;                     // this head's Q, K, V, O "in HBM"
  Col<T> lh, mh;                             // this head's l, m "in HBM"
  Mat<T> Qi, Kj, Vj, Oi, Sij;                // on chip
  Col<T> li, mi, m_tilde, l_tilde, m_new, l_new, alpha, beta;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h, h_kv = h / s.group();
      tr.at(bh, -1, -1);
      tr.compute({TensorId::O, 0, 0, s.seq_q, d}, kInitHbm);
      if constexpr (kArith) {
        Qh = detail::gather_head<T>(a.in->q, b, h);     // (S_q, d)
        Kh = detail::gather_head<T>(a.in->k, b, h_kv);  // (S_k, d)
        Vh = detail::gather_head<T>(a.in->v, b, h_kv);  // (S_k, d)
        Oh.setZero(s.seq_q, d);
        lh.setZero(s.seq_q);
        mh.setConstant(s.seq_q, detail::kNegInf<T>);
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
          const TileRef l_i{TensorId::L, i, 0, ri, 1}, m_i{TensorId::M, i, 0, ri, 1};
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
            Sij = (Sij.array().colwise() - detail::finite_or_zero<T>(m_tilde)).exp().matrix();
            l_tilde = Sij.rowwise().sum().array();
            // Line 12: merge them with the running ones.
            m_new = mi.max(m_tilde);
            const Col<T> m_ref = detail::finite_or_zero<T>(m_new);
            alpha = (mi - m_ref).exp();       // e^{m_i - m_i^new}
            beta = (m_tilde - m_ref).exp();   // e^{m~_ij - m_i^new}
            l_new = alpha * li + beta * l_tilde;
            detail::apply_dropout(Sij, p, b, h, r0, c0);  // line 13
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
        detail::scatter_rows(a.out->o, b, h, 0, Oh);
        write_lse(a.out->lse, s, b, h, 0, Col<T>(logsumexp<T>(mh, lh)));
      }
    }
}

// ---------------------------------------------------------------------------------------------
// FA2 forward: Q outer, K/V inner; O_i, l_i, m_i live on chip, O_i is normalized and written once.

template <class T, bool kArith>
void fa2_forward_nest(const Problem& p, const Blocks& bk, const ForwardArgs& a, TileTrace& tr) {
  using namespace fa2_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh;          // this head's Q, K, V "in HBM"
  Mat<T> Qi, Kj, Vj, Oi, Sij; // on chip
  Col<T> mi, li, m_new, alpha;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h, h_kv = h / s.group();
      if constexpr (kArith) {
        Qh = detail::gather_head<T>(a.in->q, b, h);     // (S_q, d)
        Kh = detail::gather_head<T>(a.in->k, b, h_kv);  // (S_k, d)
        Vh = detail::gather_head<T>(a.in->v, b, h_kv);  // (S_k, d)
      }
      for (int i = 0; i < bk.Tr; ++i) {
        const int r0 = bk.row0(i), ri = bk.rows(i);
        const TileRef Q_i{TensorId::Q, i, 0, ri, d}, O_i{TensorId::O, i, 0, ri, d};
        const TileRef m_i{TensorId::M, i, 0, ri, 1}, l_i{TensorId::L, i, 0, ri, 1}, L_i{TensorId::LSE, i, 0, ri, 1};
        tr.at(bh, i, -1);
        tr.load(Q_i, kLoadQ);
        tr.create(O_i, kInitOnChip);
        tr.create(l_i, kInitOnChip);
        tr.create(m_i, kInitOnChip);
        if constexpr (kArith) {
          Qi = Qh.middleRows(r0, ri);  // (Br, d)
          Oi.setZero(ri, d);           // (Br, d)
          li.setZero(ri);
          mi.setConstant(ri, detail::kNegInf<T>);
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
            const Col<T> m_ref = detail::finite_or_zero<T>(m_new);
            Sij = (Sij.array().colwise() - m_ref).exp().matrix();
            alpha = (mi - m_ref).exp();  // e^{m_i^(j-1) - m_i^(j)}: rescales what was summed so far
            li = alpha * li + Sij.rowwise().sum().array();
            mi = m_new;
            // Line 11: l keeps the undropped sum; only the P~ that multiplies V is dropped out.
            detail::apply_dropout(Sij, p, b, h, r0, c0);
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
          detail::scatter_rows(a.out->o, b, h, r0, Oi);
          write_lse(a.out->lse, s, b, h, r0, Col<T>(logsumexp<T>(mi, li)));
        }
        tr.store(O_i, kWriteO);
        tr.store(L_i, kWriteL);
        tr.free(Q_i, kEndI);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// The backward step both loop orders share, once P_ij is known (lines dV, dP, dS, dQ, dK of either
// listing). dQ_i is updated in place; dK_j and dV_j accumulate on chip.

template <class T>
struct BackwardTiles {
  Mat<T> Qi, Kj, Vj, dOi, Oi, dQi, dKj, dVj;  // (Br or Bc, d)
  Mat<T> Pij, Pdrop, dPij;                     // (Br, Bc)
  Col<T> Li, Di;
};

template <class T>
void backward_step(BackwardTiles<T>& t, const Problem& p, T tau, int b, int h, int r0, int c0) {
  const bool dropout = p.options.dropout_p > 0;
  if (dropout) {
    t.Pdrop = t.Pij;
    detail::apply_dropout(t.Pdrop, p, b, h, r0, c0);
    t.dVj.noalias() += t.Pdrop.transpose() * t.dOi;  // (Bc, d)
  } else {
    t.dVj.noalias() += t.Pij.transpose() * t.dOi;
  }
  t.dPij.noalias() = t.dOi * t.Vj.transpose();  // (Br, Bc)
  detail::apply_dropout(t.dPij, p, b, h, r0, c0);
  // dS_ij = P_ij o (dP_ij - D_i), in place of dP_ij.
  t.dPij = (t.Pij.array() * (t.dPij.array().colwise() - t.Di)).matrix();
  t.dQi.noalias() += tau * (t.dPij * t.Kj);               // (Br, d)
  t.dKj.noalias() += tau * (t.dPij.transpose() * t.Qi);   // (Bc, d)
}

// ---------------------------------------------------------------------------------------------
// FA1 backward (Algorithm 4): K/V outer; Q_i, O_i, dO_i, dQ_i, l_i, m_i are read at every step and
// dQ_i is written back; D_i is recomputed from dO_i and O_i inside the step.

template <class T, bool kArith>
void fa1_backward_nest(const Problem& p, const Blocks& bk, const BackwardArgs& a, TileTrace& tr) {
  using namespace fa1_bwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh, Oh, dOh, dQh;  // this head's tensors "in HBM"
  Col<T> mh;                        // m: here the saved L (with l = 1), see fa1_forward_nest
  BackwardTiles<T> t;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h, h_kv = h / s.group();
      tr.at(bh, -1, -1);
      tr.compute({TensorId::dQ, 0, 0, s.seq_q, d}, kInitHbm);
      if constexpr (kArith) {
        Qh = detail::gather_head<T>(a.in->q, b, h);
        Kh = detail::gather_head<T>(a.in->k, b, h_kv);
        Vh = detail::gather_head<T>(a.in->v, b, h_kv);
        Oh = detail::gather_head<T>(a.fwd->o, b, h);
        dOh = detail::gather_head<T>(*a.dO, b, h);
        mh = read_lse<T>(a.fwd->lse, s, b, h);
        dQh.setZero(s.seq_q, d);
      }
      for (int j = 0; j < bk.Tc; ++j) {
        const int c0 = bk.col0(j), cj = bk.cols(j);
        const TileRef K_j{TensorId::K, 0, j, cj, d}, V_j{TensorId::V, 0, j, cj, d};
        const TileRef dK_j{TensorId::dK, 0, j, cj, d}, dV_j{TensorId::dV, 0, j, cj, d};
        tr.at(bh, -1, j);
        tr.load(K_j, kLoadKV);
        tr.load(V_j, kLoadKV);
        tr.create(dK_j, kInitDKV);
        tr.create(dV_j, kInitDKV);
        if constexpr (kArith) {
          t.Kj = Kh.middleRows(c0, cj);
          t.Vj = Vh.middleRows(c0, cj);
          t.dKj.setZero(cj, d);
          t.dVj.setZero(cj, d);
        }
        for (int i = 0; i < bk.Tr; ++i) {
          if (skip_tile(p, bk, i, j)) continue;
          const int r0 = bk.row0(i), ri = bk.rows(i);
          const TileRef Q_i{TensorId::Q, i, 0, ri, d}, O_i{TensorId::O, i, 0, ri, d};
          const TileRef dO_i{TensorId::dO, i, 0, ri, d}, dQ_i{TensorId::dQ, i, 0, ri, d};
          const TileRef l_i{TensorId::L, i, 0, ri, 1}, m_i{TensorId::M, i, 0, ri, 1}, D_i{TensorId::D, i, 0, ri, 1};
          const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
          const TileRef dP_ij{TensorId::dP, i, j, ri, cj}, dS_ij{TensorId::dS, i, j, ri, cj};
          tr.at(bh, i, j);
          for (const TileRef& x : {Q_i, O_i, dO_i, dQ_i, l_i, m_i}) tr.load(x, kLoadRow);
          tr.create(S_ij, kScores);
          tr.compute(P_ij, kProbabilities);
          if (p.options.dropout_p > 0) tr.compute(P_ij, kDropout);
          tr.compute(dV_j, kDV);
          tr.create(dP_ij, kDP);
          tr.create(D_i, kD);
          tr.compute(dS_ij, kDS);
          tr.compute(dQ_i, kDQ);
          tr.compute(dK_j, kDK);
          if constexpr (kArith) {
            t.Qi = Qh.middleRows(r0, ri);
            t.Oi = Oh.middleRows(r0, ri);
            t.dOi = dOh.middleRows(r0, ri);
            t.dQi = dQh.middleRows(r0, ri);
            score_tile(t.Pij, t.Qi, t.Kj, tau, p, tile_has_mask(p, bk, i, j), r0, c0);
            // Line 11 with m_i = L_i and l_i = 1 (see above).
            probabilities_from_lse<T>(t.Pij, mh.segment(r0, ri));
            t.Di = (t.dOi.array() * t.Oi.array()).rowwise().sum();  // line 15
            backward_step(t, p, tau, b, h, r0, c0);
            dQh.middleRows(r0, ri) = t.dQi;
          }
          tr.store(dQ_i, kDQ);
          for (const TileRef& x : {dP_ij, D_i, S_ij, Q_i, O_i, dO_i, l_i, m_i}) tr.free(x, kEndI);
        }
        tr.at(bh, -1, j);
        tr.store(dK_j, kWriteDKV);
        tr.store(dV_j, kWriteDKV);
        tr.free(K_j, kEndJ);
        tr.free(V_j, kEndJ);
        if constexpr (kArith) {
          // GQA: the query heads of a group share K_j, V_j, so their gradients add up.
          detail::scatter_rows(a.grads->dk, b, h_kv, c0, t.dKj, true);
          detail::scatter_rows(a.grads->dv, b, h_kv, c0, t.dVj, true);
        }
      }
      if constexpr (kArith) detail::scatter_rows(a.grads->dq, b, h, 0, dQh);
    }
}

// ---------------------------------------------------------------------------------------------
// FA2 backward (FlashAttention-2, Algorithm 2): D = rowsum(dO o O) once up front, then K/V outer;
// P_ij comes straight from L_i, dQ_i is read-modify-written per step, dK_j, dV_j written once.

template <class T, bool kArith>
void fa2_backward_nest(const Problem& p, const Blocks& bk, const BackwardArgs& a, TileTrace& tr) {
  using namespace fa2_bwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  const T tau = static_cast<T>(p.softmax_scale());
  Mat<T> Qh, Kh, Vh, Oh, dOh, dQh;  // this head's tensors "in HBM"
  Col<T> Lh, Dh;
  BackwardTiles<T> t;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int bh = b * s.heads_q + h, h_kv = h / s.group();
      tr.at(bh, -1, -1);
      tr.compute({TensorId::dQ, 0, 0, s.seq_q, d}, kInitDQ);
      if constexpr (kArith) {
        Qh = detail::gather_head<T>(a.in->q, b, h);
        Kh = detail::gather_head<T>(a.in->k, b, h_kv);
        Vh = detail::gather_head<T>(a.in->v, b, h_kv);
        Oh = detail::gather_head<T>(a.fwd->o, b, h);
        dOh = detail::gather_head<T>(*a.dO, b, h);
        Lh = read_lse<T>(a.fwd->lse, s, b, h);
        Dh.resize(s.seq_q);
        dQh.setZero(s.seq_q, d);
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
          Dh.segment(r0, ri) = (Oh.middleRows(r0, ri).array() * dOh.middleRows(r0, ri).array()).rowwise().sum();
        }
        tr.store(D_i, kComputeD);
        tr.free(O_i, kComputeD);
        tr.free(dO_i, kComputeD);
      }
      for (int j = 0; j < bk.Tc; ++j) {
        const int c0 = bk.col0(j), cj = bk.cols(j);
        const TileRef K_j{TensorId::K, 0, j, cj, d}, V_j{TensorId::V, 0, j, cj, d};
        const TileRef dK_j{TensorId::dK, 0, j, cj, d}, dV_j{TensorId::dV, 0, j, cj, d};
        tr.at(bh, -1, j);
        tr.load(K_j, kLoadKV);
        tr.load(V_j, kLoadKV);
        tr.create(dK_j, kInitDKV);
        tr.create(dV_j, kInitDKV);
        if constexpr (kArith) {
          t.Kj = Kh.middleRows(c0, cj);
          t.Vj = Vh.middleRows(c0, cj);
          t.dKj.setZero(cj, d);
          t.dVj.setZero(cj, d);
        }
        for (int i = 0; i < bk.Tr; ++i) {
          if (skip_tile(p, bk, i, j)) continue;
          const int r0 = bk.row0(i), ri = bk.rows(i);
          const TileRef Q_i{TensorId::Q, i, 0, ri, d}, dO_i{TensorId::dO, i, 0, ri, d};
          const TileRef dQ_i{TensorId::dQ, i, 0, ri, d};
          const TileRef L_i{TensorId::LSE, i, 0, ri, 1}, D_i{TensorId::D, i, 0, ri, 1};
          const TileRef S_ij{TensorId::S, i, j, ri, cj}, P_ij{TensorId::P, i, j, ri, cj};
          const TileRef dP_ij{TensorId::dP, i, j, ri, cj}, dS_ij{TensorId::dS, i, j, ri, cj};
          tr.at(bh, i, j);
          for (const TileRef& x : {Q_i, dO_i, L_i, D_i}) tr.load(x, kLoadRow);
          tr.create(S_ij, kScores);
          tr.compute(P_ij, kProbabilities);
          tr.compute(dV_j, kDV);
          tr.create(dP_ij, kDP);
          tr.compute(dS_ij, kDS);
          tr.load(dQ_i, kDQ);
          tr.compute(dQ_i, kDQ);
          tr.compute(dK_j, kDK);
          if constexpr (kArith) {
            t.Qi = Qh.middleRows(r0, ri);
            t.dOi = dOh.middleRows(r0, ri);
            t.Di = Dh.segment(r0, ri);
            score_tile(t.Pij, t.Qi, t.Kj, tau, p, tile_has_mask(p, bk, i, j), r0, c0);
            probabilities_from_lse<T>(t.Pij, Lh.segment(r0, ri));
            t.dQi = dQh.middleRows(r0, ri);
            backward_step(t, p, tau, b, h, r0, c0);
            dQh.middleRows(r0, ri) = t.dQi;
          }
          tr.store(dQ_i, kDQ);
          for (const TileRef& x : {dP_ij, S_ij, Q_i, dO_i, L_i, D_i}) tr.free(x, kEndI);
        }
        tr.at(bh, -1, j);
        tr.store(dK_j, kWriteDKV);
        tr.store(dV_j, kWriteDKV);
        tr.free(K_j, kEndJ);
        tr.free(V_j, kEndJ);
        if constexpr (kArith) {
          detail::scatter_rows(a.grads->dk, b, h_kv, c0, t.dKj, true);
          detail::scatter_rows(a.grads->dv, b, h_kv, c0, t.dVj, true);
        }
      }
      if constexpr (kArith) detail::scatter_rows(a.grads->dq, b, h, 0, dQh);
    }
}

// ---------------------------------------------------------------------------------------------
// Standard attention's traffic (Algorithms 0 and 3), walked blockwise with the same tiles: every
// phase is a separate kernel, so S, P, dP and dS make a round trip through HBM. Count-only: the
// numbers come from naive.cpp, whose whole-matrix Eigen products are what these blocks model.
// The softmax and dS phases stream tile by tile; a real row-softmax kernel keeps the row's running
// max and sum on chip, so each element of S (P, dP) is read once and P (dS) written once.

void standard_forward_walk(const Problem& p, const Blocks& bk, TileTrace& tr) {
  using namespace standard_fwd;
  const Shape& s = p.shape;
  const int d = s.head_dim;
  for (int bh = 0; bh < s.batch * s.heads_q; ++bh) {
    for (int i = 0; i < bk.Tr; ++i) {  // S = tau Q K^T
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
    for (int i = 0; i < bk.Tr; ++i)  // P = softmax(S)
      for (int j = 0; j < bk.Tc; ++j) {
        const TileRef S_ij{TensorId::S, i, j, bk.rows(i), bk.cols(j)}, P_ij{TensorId::P, i, j, bk.rows(i), bk.cols(j)};
        tr.at(bh, i, j);
        tr.load(S_ij, kSoftmax);
        tr.compute(P_ij, kSoftmax);  // P_ij takes S_ij's place on chip
        tr.store(P_ij, kSoftmax);
      }
    for (int i = 0; i < bk.Tr; ++i) {  // O = P V
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
  using namespace standard_bwd;
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

void check_tiling(Tiling t, int bytes_per_element) {
  if (t.Br < 1 || t.Bc < 1)
    throw InputError("block sizes must be positive, got Br = " + std::to_string(t.Br) +
                     " and Bc = " + std::to_string(t.Bc));
  if (bytes_per_element < 1)
    throw InputError("bytes per element must be positive, got " + std::to_string(bytes_per_element));
}

Algorithm algorithm_of(LoopOrder order) { return order == LoopOrder::FA1 ? Algorithm::FA1 : Algorithm::FA2; }

void check_forward_out(const Shape& s, const ForwardOut& fwd) {
  if (fwd.o.dims != q_dims(s) || fwd.lse.dims != lse_dims(s))
    throw InputError("the forward outputs have shapes O " + fwd.o.dims_string() + " and LSE " +
                     fwd.lse.dims_string() + ", which do not match the problem");
}

}  // namespace

// ---------------------------------------------------------------------------------------------


template <class T>
ForwardOut tiled_forward(LoopOrder order, const Problem& p, const Qkv& in, Tiling t, TrafficObserver* observer,
                         int bytes_per_element) {
  validate(p);
  check_dims(p.shape, in);
  check_tiling(t, bytes_per_element);
  ForwardOut out{HostTensor(q_dims(p.shape)), HostTensor(lse_dims(p.shape))};
  TileTrace tr(observer, algorithm_of(order), Pass::Forward, bytes_per_element);
  const Blocks bk(p.shape, t);
  const ForwardArgs args{&in, &out};
  if (order == LoopOrder::FA1)
    fa1_forward_nest<T, true>(p, bk, args, tr);
  else
    fa2_forward_nest<T, true>(p, bk, args, tr);
  return out;
}

template <class T>
Grads tiled_backward(LoopOrder order, const Problem& p, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO,
                     Tiling t, TrafficObserver* observer, int bytes_per_element) {
  validate(p);
  check_dims(p.shape, in, &dO);
  check_forward_out(p.shape, fwd);
  check_tiling(t, bytes_per_element);
  Grads g{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape)), HostTensor(kv_dims(p.shape))};
  TileTrace tr(observer, algorithm_of(order), Pass::Backward, bytes_per_element);
  const Blocks bk(p.shape, t);
  const BackwardArgs args{&in, &fwd, &dO, &g};
  if (order == LoopOrder::FA1)
    fa1_backward_nest<T, true>(p, bk, args, tr);
  else
    fa2_backward_nest<T, true>(p, bk, args, tr);
  return g;
}

template ForwardOut tiled_forward<double>(LoopOrder, const Problem&, const Qkv&, Tiling, TrafficObserver*, int);
template ForwardOut tiled_forward<float>(LoopOrder, const Problem&, const Qkv&, Tiling, TrafficObserver*, int);
template Grads tiled_backward<double>(LoopOrder, const Problem&, const Qkv&, const ForwardOut&, const HostTensor&,
                                      Tiling, TrafficObserver*, int);
template Grads tiled_backward<float>(LoopOrder, const Problem&, const Qkv&, const ForwardOut&, const HostTensor&,
                                     Tiling, TrafficObserver*, int);

void count_traffic(Algorithm algorithm, Pass pass, const Problem& p, Tiling t, int bytes_per_element,
                   TrafficObserver& observer) {
  validate(p);
  check_tiling(t, bytes_per_element);
  TileTrace tr(&observer, algorithm, pass, bytes_per_element);
  const Blocks bk(p.shape, t);
  const bool forward = pass == Pass::Forward;
  switch (algorithm) {
    case Algorithm::Standard:
      forward ? standard_forward_walk(p, bk, tr) : standard_backward_walk(p, bk, tr);
      return;
    case Algorithm::FA1:
      forward ? fa1_forward_nest<double, false>(p, bk, {}, tr) : fa1_backward_nest<double, false>(p, bk, {}, tr);
      return;
    case Algorithm::FA2:
      forward ? fa2_forward_nest<double, false>(p, bk, {}, tr) : fa2_backward_nest<double, false>(p, bk, {}, tr);
      return;
  }
}

const std::vector<std::string>& pseudocode(Algorithm algorithm, Pass pass) {
  const bool forward = pass == Pass::Forward;
  switch (algorithm) {
    case Algorithm::Standard: return forward ? standard_fwd::listing : standard_bwd::listing;
    case Algorithm::FA1: return forward ? fa1_fwd::listing : fa1_bwd::listing;
    case Algorithm::FA2: break;
  }
  return forward ? fa2_fwd::listing : fa2_bwd::listing;
}

}  // namespace flashlab
