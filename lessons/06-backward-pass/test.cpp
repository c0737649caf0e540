// Lesson 06's test: your row_dot, recompute_p, tiled_backward and add_in_order (lesson.hpp) against the
// project's reference implementation (src/cpu_reference: naive_forward<double> for O, L and P;
// naive_backward<double> and tiled_backward<double> in the FA2 loop order for dQ, dK, dV; the FA2 backward
// loop nest's own count of the tiles it visits). The steps are checked in the order the backward pass
// needs them, D, then P, then dV, then dQ and dK, so a failure names the first broken step, in words.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/tiled.hpp"
#include "lesson.hpp"
#include "model/traffic.hpp"

using namespace flashlab;
namespace lesson = flashlab::lesson06;

namespace {

// f64 against the double reference: the project's tolerance rule (relative error <= 1e-12).
const Bound kF64Bound = tolerance(DType::F64, Quantity::Gradient, ErrorStats{}, nullptr);

// ||a - b|| / ||b||, the project's metric (core/tolerance.hpp); inf when the sizes differ or a NaN shows up.
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  HostTensor ta({static_cast<std::int64_t>(a.size())}), tb({static_cast<std::int64_t>(b.size())});
  ta.data = a;
  tb.data = b;
  const ErrorStats e = compare(ta, tb);
  return e.has_nan ? INFINITY : e.rel;
}
bool close(const std::vector<double>& a, const std::vector<double>& b) { return rel_error(a, b) <= kF64Bound.limit; }

bool all_zero(const std::vector<double>& x) {
  for (double v : x)
    if (v != 0.0) return false;
  return true;
}
bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}
std::vector<double> times(const std::vector<double>& x, double f) {
  std::vector<double> y = x;
  for (double& v : y) v *= f;
  return y;
}

// ---------------------------------------------------------------------------------------------
// One head's problem: random Q, K, V and dO, and the forward pass's O and L from the reference.

struct HeadCase {
  Problem p;
  Qkv in;
  ForwardOut fwd;  // naive_forward<double>: O and L (the LSE)
  HostTensor dO;
};

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, D) row-major arrays. Causal: top-left,
// query r sees keys c <= r.
HeadCase make_case(int seq_q, int seq_k, int d, bool causal, std::uint64_t seed) {
  HeadCase c;
  c.p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  c.p.options.causal = causal ? CausalAlign::TopLeft : CausalAlign::None;
  c.in = random_qkv(c.p.shape, DType::F64, seed);
  c.fwd = naive_forward<double>(c.p, c.in);
  c.dO = random_like_o(c.p.shape, DType::F64, seed + 1000);
  return c;
}

lesson::Head head_of(const HeadCase& c) {
  const Shape& s = c.p.shape;
  return lesson::Head{.Q = c.in.q.data,
                      .K = c.in.k.data,
                      .V = c.in.v.data,
                      .O = c.fwd.o.data,
                      .dO = c.dO.data,
                      .L = c.fwd.lse.data,
                      .seq_q = s.seq_q,
                      .seq_k = s.seq_k,
                      .d = s.head_dim,
                      .scale = c.p.softmax_scale(),
                      .causal = c.p.options.causal != CausalAlign::None};
}

// The reference's P, (seq_q, seq_k), through naive_forward itself: pad Q and K with zero columns to
// width w = max(d, seq_k) (the scores do not change; the scale is given explicitly) and take V = I, (seq_k, w).
// Then O = P V is P, in its first seq_k columns.
std::vector<double> reference_p(const HeadCase& c) {
  const Shape& s = c.p.shape;
  const int w = std::max(s.head_dim, s.seq_k);
  Problem wide = c.p;
  wide.shape.head_dim = w;
  wide.options.scale = c.p.softmax_scale();
  Qkv in{HostTensor(q_dims(wide.shape)), HostTensor(kv_dims(wide.shape)), HostTensor(kv_dims(wide.shape))};
  for (int r = 0; r < s.seq_q; ++r)
    for (int k = 0; k < s.head_dim; ++k) in.q.at(0, r, 0, k) = c.in.q.at(0, r, 0, k);
  for (int j = 0; j < s.seq_k; ++j) {
    for (int k = 0; k < s.head_dim; ++k) in.k.at(0, j, 0, k) = c.in.k.at(0, j, 0, k);
    in.v.at(0, j, 0, j) = 1.0;
  }
  const ForwardOut out = naive_forward<double>(wide, in);
  std::vector<double> P(static_cast<std::size_t>(s.seq_q) * s.seq_k);
  for (int r = 0; r < s.seq_q; ++r)
    for (int j = 0; j < s.seq_k; ++j) P[static_cast<std::size_t>(r) * s.seq_k + j] = out.o.at(0, r, 0, j);
  return P;
}

// D_i the other way, the way the softmax's Jacobian first gives it: rowsum(P o dP), with P the reference's
// and dP = dO V^T. README.md shows why it equals rowsum(dO o O).
std::vector<double> d_from_p(const HeadCase& c, const std::vector<double>& P) {
  const Shape& s = c.p.shape;
  std::vector<double> D(static_cast<std::size_t>(s.seq_q), 0.0);
  for (int r = 0; r < s.seq_q; ++r)
    for (int j = 0; j < s.seq_k; ++j) {
      double dP = 0.0;
      for (int k = 0; k < s.head_dim; ++k) dP += c.dO.at(0, r, 0, k) * c.in.v.at(0, j, 0, k);
      D[r] += P[static_cast<std::size_t>(r) * s.seq_k + j] * dP;
    }
  return D;
}

// Every diagnose_* function returns "" when your result is right, else plain words saying what is wrong
// and where to look; the test cases CHECK that it is empty.

std::string diagnose_d(const HeadCase& c, const std::vector<double>& P_ref) {
  const Shape& s = c.p.shape;
  const std::vector<double> D = lesson::row_dot(c.dO.data, c.fwd.o.data, s.seq_q, s.head_dim);
  const std::vector<double> want = d_from_p(c, P_ref);
  std::ostringstream why;
  if (D.size() != want.size()) {
    why << "your row_dot returned " << D.size() << " numbers; D has one per query row, seq_q = " << want.size();
    return why.str();
  }
  if (all_zero(D)) return "your D is all zeros (TODO 1): D[r] = sum over k < d of dO[r * d + k] * O[r * d + k]";
  if (!all_finite(D)) return "your D has inf or NaN: it is a plain dot product of two finite rows";
  if (close(D, want)) return "";
  std::size_t worst = 0;
  for (std::size_t r = 0; r < D.size(); ++r)
    if (std::abs(D[r] - want[r]) > std::abs(D[worst] - want[worst])) worst = r;
  why << "your D differs from rowsum(P o dP) computed from the reference's P (relative error " << rel_error(D, want)
      << ", allowed: " << kF64Bound.rule << "); worst at row " << worst << ": yours " << D[worst] << ", expected "
      << want[worst] << ". D[r] is the dot product of row r of dO with the SAME row r of O, over its d columns";
  return why.str();
}

// Your recompute_p on every (Br, Bc) tile (the masked ones too) against the reference's P. A P entry
// is in [0, 1]: 1e-12 absolute is rounding level.
constexpr double kPSlack = 1e-12;

std::string diagnose_p(const HeadCase& c, const std::vector<double>& P_ref, int Br, int Bc) {
  const Shape& s = c.p.shape;
  const lesson::Head h = head_of(c);
  const bool causal = h.causal;
  bool tile00_right = false;
  for (int row0 = 0; row0 < s.seq_q; row0 += Br)
    for (int col0 = 0; col0 < s.seq_k; col0 += Bc) {
      const int rows = std::min(Br, s.seq_q - row0), cols = std::min(Bc, s.seq_k - col0);
      const std::vector<double> P = lesson::recompute_p(h, row0, rows, col0, cols);
      std::ostringstream why;
      why << "tile (i, j) = (" << row0 / Br << ", " << col0 / Bc << "), query rows " << row0 << ".."
          << row0 + rows - 1 << ", keys " << col0 << ".." << col0 + cols - 1 << ": ";
      if (P.size() != static_cast<std::size_t>(rows) * cols) {
        why << "your recompute_p returned " << P.size() << " numbers; P_ij is (rows, cols) = " << rows * cols;
        return why.str();
      }
      int bad_r = -1, bad_c = -1;
      bool tile_has_mass = false, masked_nonzero = false;
      for (int r = 0; r < rows; ++r)
        for (int col = 0; col < cols; ++col) {
          const double want = P_ref[static_cast<std::size_t>(row0 + r) * s.seq_k + col0 + col];
          const double got = P[static_cast<std::size_t>(r) * cols + col];
          tile_has_mass = tile_has_mass || want != 0.0;
          if (causal && col0 + col > row0 + r && got != 0.0) masked_nonzero = true;
          if (bad_r < 0 && !(std::abs(got - want) <= kPSlack)) bad_r = r, bad_c = col;
        }
      if (bad_r < 0) {
        if (row0 == 0 && col0 == 0) tile00_right = true;
        continue;
      }
      const double got = P[static_cast<std::size_t>(bad_r) * cols + bad_c];
      const double want = P_ref[static_cast<std::size_t>(row0 + bad_r) * s.seq_k + col0 + bad_c];
      if (all_zero(P) && tile_has_mass)
        why << "your P_ij is all zeros (TODO 2): P_ij[r][c] = exp(scale * (Q row row0 + r . K row col0 + c) - L[row0 + r])";
      else if (masked_nonzero)
        why << "your P_ij is nonzero where the key comes after the query (key col0 + c > query row0 + r): under the "
               "causal mask S = -inf there, so P = exp(-inf) = 0; leave those entries 0";
      else if (!std::isfinite(got))
        why << "your P_ij has " << got << " at [" << bad_r << "][" << bad_c
            << "]: exp(S - L) never overflows, since L is the row's logsumexp and S <= L; subtract L[row0 + r]";
      else if (tile00_right)
        why << "your P_ij[" << bad_r << "][" << bad_c << "] is " << got << ", the reference's " << want
            << ", while tile (0, 0) is right: use the GLOBAL rows, query row0 + r of Q and of L, key col0 + c of K";
      else
        why << "your P_ij[" << bad_r << "][" << bad_c << "] is " << got << ", the reference's " << want
            << ": P_ij[r][c] = exp(scale * (Q row row0 + r . K row col0 + c) - L[row0 + r]), with the scale tau, and "
               "nothing else: L = m + log(l) already holds the row's max and its sum";
      return why.str();
    }
  return "";
}

// The tiles the reference's FA2 backward loop nest computes: one S_ij per visited tile (count-only walk).
class VisitedTiles : public TrafficObserver {
 public:
  int tiles = 0;
  void on_event(const TileEvent& e) override {
    if (e.tensor == TensorId::S && e.direction == Direction::Compute) ++tiles;
  }
};
int reference_tiles_visited(const Problem& p, int Br, int Bc) {
  VisitedTiles v;
  count_traffic(Algorithm::FA2, Pass::Backward, p, Tiling{.Br = Br, .Bc = Bc}, 8, v);
  return v.tiles;
}

std::vector<int> natural_order(int Tc) {
  std::vector<int> order(static_cast<std::size_t>(Tc));
  for (int j = 0; j < Tc; ++j) order[j] = j;
  return order;
}

// The rows of x, (n, d), from row `first` on, compared with ref's.
bool rows_close(const std::vector<double>& x, const std::vector<double>& ref, int d, int first, int last) {
  const auto D = static_cast<std::size_t>(d);
  const std::vector<double> a(x.begin() + first * D, x.begin() + last * D);
  const std::vector<double> b(ref.begin() + first * D, ref.begin() + last * D);
  return close(a, b);
}

std::string errors_against(const char* what, const std::vector<double>& yours, const std::vector<double>& naive,
                           const std::vector<double>& tiled) {
  std::ostringstream s;
  s << "your " << what << ": relative error " << rel_error(yours, naive) << " against naive_backward, "
    << rel_error(yours, tiled) << " against tiled_backward (FA2); allowed: " << kF64Bound.rule << ". ";
  return s.str();
}

// Your tiled_backward on the case, step by step: D, P, then the gradients, then the tiles it visited.
std::string diagnose_backward(const HeadCase& c, int Br, int Bc, std::span<const int> order) {
  const Shape& s = c.p.shape;
  const std::vector<double> P_ref = reference_p(c);
  if (const std::string m = diagnose_d(c, P_ref); !m.empty()) return "D is wrong, so every gradient is: " + m;
  if (const std::string m = diagnose_p(c, P_ref, Br, Bc); !m.empty())
    return "P is wrong, so every gradient is: " + m;

  const lesson::Gradients g = lesson::tiled_backward(head_of(c), Br, Bc, order);
  const Grads naive = naive_backward<double>(c.p, c.in, c.fwd, c.dO);
  const Grads tiled = tiled_backward<double>(Algorithm::FA2, c.p, c.in, c.fwd, c.dO, Tiling{.Br = Br, .Bc = Bc});
  const int ref_tiles = reference_tiles_visited(c.p, Br, Bc);
  std::ostringstream why;
  if (g.dQ.size() != naive.dq.data.size() || g.dK.size() != naive.dk.data.size() ||
      g.dV.size() != naive.dv.data.size()) {
    why << "your tiled_backward returned dQ, dK, dV of " << g.dQ.size() << ", " << g.dK.size() << ", " << g.dV.size()
        << " numbers; they are (seq_q, d), (seq_k, d), (seq_k, d) = " << naive.dq.data.size() << ", "
        << naive.dk.data.size() << ", " << naive.dv.data.size();
    return why.str();
  }
  if (!all_finite(g.dQ) || !all_finite(g.dK) || !all_finite(g.dV))
    return "your gradients have inf or NaN, while your D and P are finite: every step after P is sums of products "
           "of finite numbers; look for an index past the end of a tile (the last blocks are shorter)";
  const bool dq_ok = close(g.dQ, naive.dq.data) && close(g.dQ, tiled.dq.data);
  const bool dk_ok = close(g.dK, naive.dk.data) && close(g.dK, tiled.dk.data);
  const bool dv_ok = close(g.dV, naive.dv.data) && close(g.dV, tiled.dv.data);
  const int full_keys = (s.seq_k / Bc) * Bc;
  const bool ragged_keys = full_keys > 0 && full_keys < s.seq_k;

  if ((!dq_ok || !dk_ok || !dv_ok) && g.tiles_visited < ref_tiles) {
    why << "you visited " << g.tiles_visited << " tiles, the reference's loop nest " << ref_tiles
        << ": you skipped tiles that have visible entries. Skip a tile only when its first key col0 comes after its "
           "last query row0 + rows - 1 (TODO 3); a tile that the diagonal crosses is computed, its masked entries "
           "have P = 0";
    return why.str();
  }
  if (!dv_ok) {
    why << errors_against("dV", g.dV, naive.dv.data, tiled.dv.data);
    if (all_zero(g.dV))
      why << "Your dV is all zeros, though your D and P are right: accumulate dV_j += P_ij^T dO_i (TODO 4) and copy "
             "dV_j to rows col0 .. col0 + cols - 1 of dV (TODO 8)";
    else if (ragged_keys && rows_close(g.dV, naive.dv.data, s.head_dim, 0, full_keys))
      why << "Only the rows of the last, shorter key block (from key " << full_keys
          << ") are wrong: that block has cols = seq_k - col0 rows; copy exactly those (TODO 8)";
    else
      why << "dV is wrong but D and P are right: check that dV_j accumulates P_ij^T dO_i over every query block i "
             "(TODO 4: dV_j[c][k] += P(r, c) * dO[row0 + r][k]; key c is the row of dV_j, the transpose of P) and "
             "that dV_j is copied to rows col0 + c of dV once its inner loop is done (TODO 8)";
    return why.str();
  }
  if (!dq_ok || !dk_ok) {
    const double tau = c.p.softmax_scale();
    const bool dq_zero = all_zero(g.dQ), dk_zero = all_zero(g.dK);
    const bool dq_no_tau = close(times(g.dQ, tau), naive.dq.data), dk_no_tau = close(times(g.dK, tau), naive.dk.data);
    const bool dq_tau2 = close(times(g.dQ, 1.0 / tau), naive.dq.data);
    const bool dk_tau2 = close(times(g.dK, 1.0 / tau), naive.dk.data);
    const char* which = !dq_ok && !dk_ok ? "dQ and dK are" : !dq_ok ? "dQ is" : "dK is";
    if (!dq_ok) why << errors_against("dQ", g.dQ, naive.dq.data, tiled.dq.data);
    if (!dk_ok) why << errors_against("dK", g.dK, naive.dk.data, tiled.dk.data);
    if (dq_zero && dk_zero)
      why << "Your dQ and dK are all zeros, though D, P and dV are right: compute dP_ij = dO_i V_j^T (TODO 5), "
             "dS_ij = P_ij o (dP_ij - D_i) (TODO 6), then dQ_i and dK_j from dS_ij (TODO 7) and copy dK_j out (TODO 8)";
    else if ((dq_ok || dq_no_tau) && (dk_ok || dk_no_tau))
      why << "Your " << which << " missing the factor tau = " << tau
          << ": S = tau Q K^T, so the chain rule brings tau into dQ = tau dS K and dK = tau dS^T Q (TODO 7); "
             "dS is the gradient with respect to S, the scaled scores";
    else if ((dq_ok || dq_tau2) && (dk_ok || dk_tau2))
      why << "Your " << which << " carrying tau twice: tau multiplies dQ and dK once (TODO 7); dS_ij = P_ij o (dP_ij - "
             "D_i) has no tau, and neither has P_ij beyond the one inside S";
    else if (!dq_ok && !dk_ok)
      why << "dQ and dK are both wrong, but D, P and dV are right. The two share dS_ij = P_ij o (dP_ij - D_i): check "
             "dP_ij = dO_i V_j^T (TODO 5: dP(r, c) is row row0 + r of dO dotted with row col0 + c of V) and that dS "
             "subtracts D of the query row, D[row0 + r] (TODO 6)";
    else if (!dq_ok)
      why << "dQ is wrong while dK is right, so dS_ij is right: dQ_i += tau dS_ij K_j, that is dQ[row0 + r][k] += "
             "tau * dS(r, c) * K[col0 + c][k], summed over c AND over every key block j: add to g.dQ, never assign, "
             "since each key block adds its own piece to the same rows (TODO 7)";
    else if (dk_zero)
      why << "Your dK is all zeros while dQ is right: accumulate dK_j += tau dS_ij^T Q_i (TODO 7) and copy dK_j to "
             "rows col0 .. col0 + cols - 1 of dK (TODO 8)";
    else if (ragged_keys && rows_close(g.dK, naive.dk.data, s.head_dim, 0, full_keys))
      why << "Only the rows of dK's last, shorter key block (from key " << full_keys
          << ") are wrong: that block has cols = seq_k - col0 rows; copy exactly those (TODO 8)";
    else
      why << "dK is wrong while dQ is right, so dS_ij is right: dK_j += tau dS_ij^T Q_i, that is dK_j[c][k] += "
             "tau * dS(r, c) * Q[row0 + r][k] over every query block i (TODO 7), then copy dK_j to rows col0 + c of "
             "dK (TODO 8)";
    return why.str();
  }
  if (g.tiles_visited != ref_tiles) {
    why << "your gradients are right, but you computed " << g.tiles_visited << " tiles where the reference's loop "
        << "nest computes " << ref_tiles << ": ";
    if (c.p.options.causal != CausalAlign::None && g.tiles_visited > ref_tiles)
      why << "under the causal mask, skip (continue) every tile whose first key col0 comes after its last query "
             "row0 + rows - 1 (TODO 3). Its P is all zero, so it adds nothing to any gradient: computing it is only "
             "wasted work, and on a GPU nearly half of the work at long N";
    else
      why << "without a mask every tile is visited (TODO 3 skips only fully masked tiles)";
    return why.str();
  }
  return "";
}

struct BackwardCase {
  int seq_q, seq_k, d, Br, Bc;
  std::string what;
};
const BackwardCase kBackwardCases[] = {
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 4, .Bc = 4, .what = "ragged last blocks in both directions (13 = 3 * 4 + 1)"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 3, .Bc = 5, .what = "Br != Bc, both ragged"},
    {.seq_q = 9, .seq_k = 9, .d = 4, .Br = 1, .Bc = 1, .what = "1 x 1 tiles"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 16, .Bc = 32, .what = "blocks larger than the sequence: one tile"},
    {.seq_q = 20, .seq_k = 37, .d = 16, .Br = 8, .Bc = 16, .what = "seq_q < seq_k, ragged key block"},
    {.seq_q = 37, .seq_k = 20, .d = 4, .Br = 16, .Bc = 8, .what = "seq_q > seq_k, ragged query block"},
    {.seq_q = 1, .seq_k = 1, .d = 1, .Br = 1, .Bc = 1, .what = "one query, one key, d = 1"},
    {.seq_q = 64, .seq_k = 64, .d = 32, .Br = 16, .Bc = 16, .what = "exact multiples, d = 32"},
    {.seq_q = 5, .seq_k = 70, .d = 2, .Br = 2, .Bc = 64, .what = "Bc = 64 over 70 keys: a last key block of 6"},
};

// A short float as its value and its bits, so that "the last bit" can be seen.
std::string show(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  std::ostringstream s;
  s << std::setprecision(9) << x << " (bits 0x" << std::hex << std::setw(8) << std::setfill('0') << bits << ")";
  return s.str();
}
// ", causal (top-left)" or ", no mask", for a case's description (a std::string: doctest prints a char pointer
// as an address).
std::string mask_words(bool causal) { return causal ? ", causal (top-left)" : ", no mask"; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

}  // namespace

TEST_CASE("lesson 06: row_dot gives D_i = rowsum(dO_i o O_i), which equals rowsum(P_i o dP_i)") {
  struct Case {
    int seq_q, seq_k, d;
    bool causal;
    std::string what;
  };
  const Case cases[] = {
      {.seq_q = 1, .seq_k = 1, .d = 1, .causal = false, .what = "one query, one key"},
      {.seq_q = 7, .seq_k = 5, .d = 3, .causal = false, .what = "seq_q > seq_k"},
      {.seq_q = 16, .seq_k = 16, .d = 16, .causal = false, .what = "square"},
      {.seq_q = 13, .seq_k = 21, .d = 8, .causal = true, .what = "causal, seq_q < seq_k"},
      {.seq_q = 33, .seq_k = 17, .d = 64, .causal = false, .what = "odd lengths, d = 64"},
  };
  std::uint64_t seed = 601;
  for (const Case& c : cases) {
    const std::uint64_t case_seed = seed++;
    INFO(c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d
                << mask_words(c.causal) << ", input seed " << case_seed);
    const HeadCase hc = make_case(c.seq_q, c.seq_k, c.d, c.causal, case_seed);
    const std::string mistake = diagnose_d(hc, reference_p(hc));
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 06: recompute_p rebuilds the reference's P from L, tile by tile") {
  struct Case {
    int seq_q, seq_k, d, Br, Bc;
    bool causal;
    std::string what;
  };
  const Case cases[] = {
      {.seq_q = 8, .seq_k = 8, .d = 4, .Br = 8, .Bc = 8, .causal = false, .what = "one tile"},
      {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 4, .Bc = 4, .causal = false, .what = "ragged tiles"},
      {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 4, .Bc = 4, .causal = true, .what = "causal: the diagonal crosses tiles"},
      {.seq_q = 10, .seq_k = 23, .d = 16, .Br = 3, .Bc = 7, .causal = true, .what = "causal, seq_q < seq_k"},
      {.seq_q = 23, .seq_k = 10, .d = 16, .Br = 7, .Bc = 3, .causal = true, .what = "causal, seq_q > seq_k"},
  };
  std::uint64_t seed = 611;
  for (const Case& c : cases) {
    const std::uint64_t case_seed = seed++;
    INFO(c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d << ", Br = " << c.Br
                << ", Bc = " << c.Bc << mask_words(c.causal) << ", input seed " << case_seed);
    const HeadCase hc = make_case(c.seq_q, c.seq_k, c.d, c.causal, case_seed);
    const std::string mistake = diagnose_p(hc, reference_p(hc), c.Br, c.Bc);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 06: tiled_backward equals naive_backward and tiled_backward (FA2)") {
  for (const bool causal : {false, true}) {
    std::uint64_t seed = causal ? 640 : 620;
    for (const BackwardCase& c : kBackwardCases) {
      const std::uint64_t case_seed = seed++;
      INFO(c.what << mask_words(causal) << ": seq_q = " << c.seq_q
                  << ", seq_k = " << c.seq_k << ", d = " << c.d << ", Br = " << c.Br << ", Bc = " << c.Bc
                  << ", input seed " << case_seed);
      const HeadCase hc = make_case(c.seq_q, c.seq_k, c.d, causal, case_seed);
      const int Tc = (c.seq_k + c.Bc - 1) / c.Bc;
      const std::string mistake = diagnose_backward(hc, c.Br, c.Bc, natural_order(Tc));
      CHECK_MESSAGE(mistake.empty(), mistake);
    }
  }
}

TEST_CASE("lesson 06: the order of the key blocks changes dQ's last bits only, and dK, dV not at all") {
  // Five key blocks run in three orders, as five thread blocks might finish on a GPU.
  constexpr int kSeq = 40, kD = 16, kBr = 8, kBc = 8;
  const std::vector<int> natural = natural_order(kSeq / kBc), reversed = {4, 3, 2, 1, 0}, shuffled = {2, 4, 0, 3, 1};
  for (const bool causal : {false, true}) {
    INFO("seq_q = seq_k = 40, d = 16, Br = Bc = 8 (Tc = 5)" << mask_words(causal));
    const HeadCase hc = make_case(kSeq, kSeq, kD, causal, causal ? 661 : 660);
    const std::string mistake = diagnose_backward(hc, kBr, kBc, natural);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (!mistake.empty()) continue;  // the rest needs right gradients

    const lesson::Head h = head_of(hc);
    const lesson::Gradients a = lesson::tiled_backward(h, kBr, kBc, natural);
    const lesson::Gradients again = lesson::tiled_backward(h, kBr, kBc, natural);
    CHECK_MESSAGE((same_bits(a.dQ, again.dQ) && same_bits(a.dK, again.dK) && same_bits(a.dV, again.dV)),
                  "the same inputs in the same order gave different bits on a second run: your tiled_backward depends "
                  "on something besides its inputs (a buffer read before it is written?)");
    for (const std::vector<int>* order : {&reversed, &shuffled}) {
      INFO("key blocks in the order " << (*order)[0] << ", " << (*order)[1] << ", " << (*order)[2] << ", "
                                      << (*order)[3] << ", " << (*order)[4]);
      const lesson::Gradients b = lesson::tiled_backward(h, kBr, kBc, *order);
      CHECK_MESSAGE((same_bits(a.dK, b.dK) && same_bits(a.dV, b.dV)),
                    "your dK or dV changed bits when the key blocks ran in another order. Each dK_j, dV_j is summed "
                    "over the query blocks i inside its own key block, in the order i = 0, 1, ... whatever the order "
                    "of the blocks j, so its bits cannot depend on it: reset dK_j, dV_j for each key block and copy "
                    "them out once, after its inner loop (TODO 8)");
      CHECK_MESSAGE(close(b.dQ, a.dQ),
                    "your dQ in this order differs from your dQ in the order 0, 1, 2, 3, 4 by a relative "
                        << rel_error(b.dQ, a.dQ)
                        << ": the order of the key blocks may change dQ only by rounding, since each block adds its "
                           "own piece tau dS_ij K_j to dQ_i (TODO 7)");
    }
  }
}

TEST_CASE("lesson 06: add_in_order adds dQ's pieces in the order given, and float addition is not associative") {
  SUBCASE("the worked example: 1 + 2^-24 + 2^-24 in two orders") {
    const std::vector<std::vector<float>> pieces = {{1.0f}, {0x1p-24f}, {0x1p-24f}};
    const std::vector<int> big_first = {0, 1, 2}, small_first = {1, 2, 0};
    const std::vector<float> a = lesson::add_in_order(pieces, big_first);
    const std::vector<float> b = lesson::add_in_order(pieces, small_first);
    REQUIRE_MESSAGE(a.size() == 1, "add_in_order returned " << a.size() << " numbers for pieces of 1");
    REQUIRE_MESSAGE(b.size() == 1, "add_in_order returned " << b.size() << " numbers for pieces of 1");
    CHECK_MESSAGE(a[0] == 1.0f,
                  "pieces 1, 2^-24, 2^-24 added in this order must give exactly 1, you gave "
                      << show(a[0])
                      << std::string(a[0] == 0.0f ? ": nothing was added (TODO 9)"
                                                  : ". 1 + 2^-24 lies halfway between 1 and the next float, 1 + 2^-23, and rounds "
                                         "to the even one, 1; so does the second 2^-24. Add one piece at a time, in "
                                         "float, in the order given (a double accumulator or a sorted sum rounds only "
                                         "once, at the end, and gives 1 + 2^-23)"));
    CHECK_MESSAGE(b[0] == 1.0f + 0x1p-23f,
                  "pieces 2^-24, 2^-24, 1 added in this order must give exactly 1 + 2^-23 = "
                      << show(1.0f + 0x1p-23f) << ", you gave " << show(b[0])
                      << std::string(b[0] == 0.0f ? ": nothing was added (TODO 9)"
                                                  : ": the two small pieces make 2^-23 first, exactly, and 1 + 2^-23 is a float. "
                                         "Follow `order`: order[0] first, then order[1], ..."));
  }
  SUBCASE("sixteen random pieces: bits repeat in one order, differ between orders, and stay within rounding") {
    // Sixteen key blocks' pieces of one dQ_i, 256 values each, representable in float.
    constexpr int kPieces = 16, kLength = 256;
    const Shape shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = kPieces, .seq_k = 1, .head_dim = kLength};
    const std::vector<double> values = random_qkv(shape, DType::F32, 670).q.data;
    std::vector<std::vector<float>> pieces(kPieces, std::vector<float>(kLength));
    for (int j = 0; j < kPieces; ++j)
      for (int k = 0; k < kLength; ++k) pieces[j][k] = static_cast<float>(values[j * kLength + k]);
    std::vector<int> forward = natural_order(kPieces), backward(forward.rbegin(), forward.rend());

    const std::vector<float> f1 = lesson::add_in_order(pieces, forward);
    const std::vector<float> f2 = lesson::add_in_order(pieces, forward);
    const std::vector<float> b1 = lesson::add_in_order(pieces, backward);
    REQUIRE_MESSAGE(f1.size() == static_cast<std::size_t>(kLength),
                    "add_in_order returned " << f1.size() << " numbers for pieces of " << kLength);
    REQUIRE_MESSAGE(b1.size() == static_cast<std::size_t>(kLength),
                    "add_in_order returned " << b1.size() << " numbers for pieces of " << kLength);
    bool all_zero_sum = true;
    for (float x : f1) all_zero_sum = all_zero_sum && x == 0.0f;
    REQUIRE_MESSAGE(!all_zero_sum, "your add_in_order returns all zeros (TODO 9): add every piece, in the order given");
    // Sequential float summation of n terms is within (n - 1) u sum |x| of the exact sum, u = 2^-24.
    int wrong = -1;
    for (int k = 0; k < kLength && wrong < 0; ++k) {
      double exact = 0.0, magnitude = 0.0;
      for (int j = 0; j < kPieces; ++j) exact += pieces[j][k], magnitude += std::abs(pieces[j][k]);
      const double bound = (kPieces - 1) * 0x1p-24 * magnitude;
      if (!(std::abs(f1[k] - exact) <= bound && std::abs(b1[k] - exact) <= bound)) wrong = k;
    }
    CHECK_MESSAGE(wrong < 0, "element " << wrong << " of your sum is further from the exact sum than float rounding "
                                        << "allows (sum over j of pieces[j][" << wrong << "]): TODO 9 adds EVERY "
                                        << "piece once, elementwise");
    CHECK_MESSAGE(same_bits(f1, f2), "the same pieces in the same order gave different bits on a second call: "
                                     "start the accumulator at 0 every time");
    int differing = 0;
    for (int k = 0; k < kLength; ++k) differing += f1[k] != b1[k];
    CHECK_MESSAGE(differing > 0,
                  "your sums come out bit-identical in the orders 0..15 and 15..0 for all "
                      << kLength << " elements. Added one at a time in float, sixteen random pieces round differently "
                      << "in different orders: add in exactly the order given, in float (not in double, not sorted); "
                      << "that difference is what a GPU's atomic adds leave in dQ");
  }
}
