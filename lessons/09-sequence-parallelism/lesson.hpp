#pragma once
// Lesson 09: sequence parallelism. Ring attention for one head on P virtual ranks, on the CPU, on plain
// row-major arrays. You write the functions declared here in exercise.cpp; solution.cpp is ours;
// test.cpp checks yours against the project's reference (src/cpu_reference: lse_merge.hpp's merge,
// ring_forward, naive_forward).
//
// Part 1, the merge: two partial attention results over disjoint sets of keys, each an output row and
// its logsumexp, make the exact result over the union. Written with a sigmoid and a log1p, so that no
// exponential of a large number is ever formed.
//
// Part 2, the ring: one head's forward pass as the project's ring schedule (model/ring.hpp) runs it.
// Each rank keeps its queries and a running (O, L) per query row; at every step it attends to the K/V
// share in hand, pair by pair, merges each block into its rows with your merge_row, and then every
// share moves on to the rank the schedule names.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "model/ring.hpp"

namespace flashlab::lesson09 {

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---- Part 1: the merge --------------------------------------------------------------------------

// log(e^a + e^b), computed as max(a, b) + log1p(exp(-|a - b|)): the exponent is never positive, so
// nothing overflows. Either argument may be -inf (the logsumexp of no score at all): the result is then
// the other one, and -inf when both are (never NaN).
double log_add_exp(double a, double b);

// sigmoid(x) = 1 / (1 + e^-x), evaluated on the side where the exponential cannot overflow:
// 1 / (1 + e^-x) for x >= 0, and e^x / (1 + e^x) for x < 0. Exact 0.5 at 0; in [0, 1] for any x.
double stable_sigmoid(double x);

// Folds a block's result for one query row into the row's running result. Both are attention over
// their own keys (disjoint sets): o = softmax of the row's scores over those keys, times their rows of
// V (d values), and lse = log of the sum of exp(score) over them.
//   lse_new = log_add_exp(lse, lse_b)
//   o_new   = o + stable_sigmoid(lse_b - lse) * (o_b - o)
// A running row with lse = -inf has seen no key yet and takes the block's (o_b, lse_b) as it is; a
// block row with lse_b = -inf saw none of its keys (the causal mask) and changes nothing.
void merge_row(std::span<double> o, double& lse, std::span<const double> o_b, double lse_b);

// ---- Part 2: the ring ---------------------------------------------------------------------------

// Given (you do not write these). The rows of X (tokens, d) at the tokens of `ranges`, in order: how a
// rank's queries, or a share's keys and values, are laid out in its local buffer.
inline std::vector<double> gather_rows(std::span<const double> X, const std::vector<TokenRange>& ranges, int d) {
  std::vector<double> rows;
  for (const TokenRange& t : ranges)
    for (int a = 0; a < t.count; ++a)
      for (int c = 0; c < d; ++c) rows.push_back(X[std::size_t(t.token(a)) * d + c]);
  return rows;
}

struct BlockResult {
  std::vector<double> o;    // (rows, d): softmax over the block's visible keys, times their V rows
  std::vector<double> lse;  // (rows): logsumexp of the row's visible scores; -inf when it sees none
};

// Given. Attention of `rows` queries against `keys` keys and values, all (n, d) row-major: S = scale Q K^T,
// and, when causal_offset is set, local key c is visible from local query a only if c <= a + offset
// (a BlockPair's Diagonal). Every visible key of a row counts; a row that sees none gets o = 0 and
// lse = -inf.
inline BlockResult attend_block(std::span<const double> Q, std::span<const double> K, std::span<const double> V,
                                int rows, int keys, int d, double scale, std::optional<int> causal_offset) {
  BlockResult out{std::vector<double>(std::size_t(rows) * d, 0.0), std::vector<double>(rows, kNegInf)};
  for (int a = 0; a < rows; ++a) {
    const int visible = causal_offset ? std::clamp(a + *causal_offset + 1, 0, keys) : keys;
    if (visible == 0) continue;
    std::vector<double> s(visible);
    double m = kNegInf;
    for (int c = 0; c < visible; ++c) {
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += Q[std::size_t(a) * d + k] * K[std::size_t(c) * d + k];
      s[c] = scale * dot;
      m = std::max(m, s[c]);
    }
    double l = 0;
    for (int c = 0; c < visible; ++c) l += (s[c] = std::exp(s[c] - m));
    for (int c = 0; c < visible; ++c)
      for (int k = 0; k < d; ++k) out.o[std::size_t(a) * d + k] += s[c] / l * V[std::size_t(c) * d + k];
    out.lse[a] = m + std::log(l);
  }
  return out;
}

struct HeadResult {
  std::vector<double> o;    // (seq_q, d), row-major, rows in token order
  std::vector<double> lse;  // (seq_q)
};

// Ring attention for one head, run exactly as `ring` schedules it. Q is (ring.seq_q, d), K and V are
// (ring.seq_k, d), row-major; scale multiplies the scores. Rank r keeps the queries of
// ring.q_ranges[r] and starts with the K/V share of ring.kv_ranges[r]. At step s it holds the share
// that started on ring.steps[s][r].kv_origin and computes each of ring.steps[s][r].pairs (a pair's
// q_offset and k_offset say where its rows start in the rank's queries and in the share; a Skipped
// pair is not computed; a Diagonal one passes its causal_offset to attend_block). After the step,
// while ring.kv_travels_on(s), every share goes to the rank ring.steps[s][r].send_to. At the end each
// rank's rows go back to their tokens.
HeadResult ring_attention(const RingSchedule& ring, std::span<const double> Q, std::span<const double> K,
                          std::span<const double> V, int d, double scale);

}  // namespace flashlab::lesson09
