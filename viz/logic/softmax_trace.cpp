#include "softmax_trace.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/mask.hpp"
#include "core/tensor.hpp"

namespace flashlab::viz {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// exp(a - b) with exp(-inf - -inf) taken as 1: a row that has seen no key yet has nothing to rescale.
double rescale_factor(double m_old, double m_new) { return m_old == kNegInf ? 1.0 : std::exp(m_old - m_new); }

double score(const Problem& p, const Qkv& x, int r, int c) {
  const int d = p.shape.head_dim;
  double s = 0;
  for (int k = 0; k < d; ++k) s += x.q.at(0, r, 0, k) * x.k.at(0, c, 0, k);
  return s * p.softmax_scale();
}

}  // namespace

SoftmaxTrace trace_online_softmax(const Trace& t, std::uint64_t seed) {
  SoftmaxTrace out;
  const Problem& p = t.problem;
  const int N = p.shape.seq_q, Nk = p.shape.seq_k, d = p.shape.head_dim;
  out.seq_q = N;
  out.Br = t.tiling.Br;
  if (t.algorithm == Algorithm::Standard) {
    out.why_not = "standard attention takes the softmax of whole rows of S in HBM; the online softmax is FA1/FA2's";
    return out;
  }
  if (t.pass != Pass::Forward) {
    out.why_not = "the backward pass reuses the saved statistics; switch to the forward pass to watch m and l";
    return out;
  }
  if (N > kMaxSoftmaxSeq || Nk > kMaxSoftmaxSeq) {
    out.why_not = "real values are computed for N <= " + std::to_string(kMaxSoftmaxSeq) + "; lower N to see them";
    return out;
  }
  const Qkv x = random_qkv(p.shape, DType::F64, seed);
  const CausalAlign mask = p.options.causal;

  // Visits of S_ij in event order; a visit's update happens at its first Compute event (the line
  // that computes S_ij), or at its first event when the nest reports no Compute for it.
  int prev_i = -1, prev_j = -1;
  bool computed = false;
  for (const TileEvent& e : t.events) {
    int i, j;
    if (!score_tile_of(e, i, j)) {
      prev_i = prev_j = -1;
      continue;
    }
    if (i != prev_i || j != prev_j) {
      out.visits.push_back({e.index, i, j});
      computed = false;
    }
    if (e.direction == Direction::Compute && !computed) {
      out.visits.back().event = e.index;
      computed = true;
    }
    prev_i = i;
    prev_j = j;
  }

  // Running state per row, and O unnormalized, updated visit by visit.
  std::vector<SoftmaxRow> row(N, SoftmaxRow{kNegInf, 0.0, 1.0, 0});
  std::vector<double> o(std::size_t(N) * d, 0.0);
  const int Br = t.tiling.Br, Bc = t.tiling.Bc;
  for (const SoftmaxVisit& v : out.visits) {
    const int r0 = v.i * Br, r1 = std::min(N, r0 + Br);
    const int c0 = v.j * Bc, c1 = std::min(Nk, c0 + Bc);
    std::vector<SoftmaxRow> block;
    for (int r = r0; r < r1; ++r) {
      SoftmaxRow& s = row[r];
      double m_new = s.m;
      std::vector<double> srow(std::max(0, c1 - c0), kNegInf);
      for (int c = c0; c < c1; ++c)
        if (!is_masked(mask, r, c, N, Nk)) m_new = std::max(m_new, srow[c - c0] = score(p, x, r, c));
      const double alpha = rescale_factor(s.m, m_new);
      double l_new = alpha * s.l;
      for (int k = 0; k < d; ++k) o[std::size_t(r) * d + k] *= alpha;
      for (int c = c0; c < c1; ++c) {
        if (srow[c - c0] == kNegInf) continue;
        const double pr = std::exp(srow[c - c0] - m_new);
        l_new += pr;
        for (int k = 0; k < d; ++k) o[std::size_t(r) * d + k] += pr * x.v.at(0, c, 0, k);
      }
      s = {m_new, l_new, alpha, s.visits + 1};
      block.push_back(s);
    }
    out.after.push_back(std::move(block));
  }

  // Direct softmax: max first, then the sum, then O = P V / l.
  out.direct_m.assign(N, kNegInf);
  out.direct_l.assign(N, 0.0);
  for (int r = 0; r < N; ++r) {
    std::vector<double> s(Nk, kNegInf);
    for (int c = 0; c < Nk; ++c)
      if (!is_masked(mask, r, c, N, Nk)) out.direct_m[r] = std::max(out.direct_m[r], s[c] = score(p, x, r, c));
    std::vector<double> od(d, 0.0);
    for (int c = 0; c < Nk; ++c) {
      if (s[c] == kNegInf) continue;
      const double pr = std::exp(s[c] - out.direct_m[r]);
      out.direct_l[r] += pr;
      for (int k = 0; k < d; ++k) od[k] += pr * x.v.at(0, c, 0, k);
    }
    for (int k = 0; k < d; ++k) {
      const double online = row[r].l > 0 ? o[std::size_t(r) * d + k] / row[r].l : 0.0;
      const double direct = out.direct_l[r] > 0 ? od[k] / out.direct_l[r] : 0.0;
      out.max_err_o = std::max(out.max_err_o, std::fabs(online - direct));
    }
  }

  // The library's own tiled run on the same inputs: its LSE must be our m + log(l).
  const ForwardOut lib = tiled_forward<double>(t.algorithm, p, x, t.tiling);
  for (int r = 0; r < N; ++r) {
    if (row[r].l <= 0) continue;
    const double lse = row[r].m + std::log(row[r].l);
    out.max_err_lse_library = std::max(out.max_err_lse_library, std::fabs(lse - lib.lse.data[std::size_t(r)]));
  }
  out.available = true;
  return out;
}

SoftmaxRow row_state(const SoftmaxTrace& s, int row, std::int64_t step) {
  SoftmaxRow state{kNegInf, 0.0, 1.0, 0};
  if (!s.available || s.Br <= 0) return state;
  const int block = row / s.Br;
  for (std::size_t v = 0; v < s.visits.size() && s.visits[v].event < step; ++v)
    if (s.visits[v].i == block) state = s.after[v][std::size_t(row - block * s.Br)];
  return state;
}

}  // namespace flashlab::viz
