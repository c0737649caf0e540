// Lesson 09, reference solution (see exercise.cpp for the guided version).
#include <utility>

#include "lesson.hpp"

namespace flashlab::lesson09 {

double log_add_exp(double a, double b) {
  if (a == kNegInf) return b;  // also when both are: -inf, where -inf - -inf would be NaN
  if (b == kNegInf) return a;
  return std::max(a, b) + std::log1p(std::exp(-std::abs(a - b)));
}

double stable_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

void merge_row(std::span<double> o, double& lse, std::span<const double> o_b, double lse_b) {
  if (lse_b == kNegInf) return;  // the block saw none of its keys
  if (lse == kNegInf) {          // nothing seen yet: the block's result is the row's
    std::copy(o_b.begin(), o_b.end(), o.begin());
    lse = lse_b;
    return;
  }
  const double weight_b = stable_sigmoid(lse_b - lse);  // the block's share of the softmax's denominator
  for (std::size_t k = 0; k < o.size(); ++k) o[k] += weight_b * (o_b[k] - o[k]);
  lse = log_add_exp(lse, lse_b);
}

HeadResult ring_attention(const RingSchedule& ring, std::span<const double> Q, std::span<const double> K,
                          std::span<const double> V, int d, double scale) {
  const int P = ring.ranks;
  struct Rank {
    std::vector<double> q, o, lse;  // the rank's own query rows and their running result
  };
  struct Share {
    std::vector<double> k, v;  // the K/V rows of the share in hand
  };
  std::vector<Rank> rank(P);
  std::vector<Share> held(P);
  for (int r = 0; r < P; ++r) {
    rank[r].q = gather_rows(Q, ring.q_ranges[r], d);
    rank[r].o.assign(rank[r].q.size(), 0.0);
    rank[r].lse.assign(ring.q_tokens(r), kNegInf);
    held[r] = {gather_rows(K, ring.kv_ranges[r], d), gather_rows(V, ring.kv_ranges[r], d)};
  }
  for (int s = 0; s < P; ++s) {
    for (int r = 0; r < P; ++r)
      for (const BlockPair& pair : ring.steps[s][r].pairs) {
        if (pair.visibility == Visibility::Skipped) continue;
        const auto rows_of = [d](const std::vector<double>& x, int first, int count) {
          return std::span<const double>(x).subspan(std::size_t(first) * d, std::size_t(count) * d);
        };
        const std::optional<int> offset =
            pair.visibility == Visibility::Diagonal ? std::optional<int>(pair.causal_offset) : std::nullopt;
        const BlockResult block = attend_block(rows_of(rank[r].q, pair.q_offset, pair.q.count),
                                               rows_of(held[r].k, pair.k_offset, pair.k.count),
                                               rows_of(held[r].v, pair.k_offset, pair.k.count), pair.q.count,
                                               pair.k.count, d, scale, offset);
        for (int a = 0; a < pair.q.count; ++a) {
          const std::size_t row = std::size_t(pair.q_offset + a);
          merge_row(std::span<double>(rank[r].o).subspan(row * d, d), rank[r].lse[row],
                    std::span<const double>(block.o).subspan(std::size_t(a) * d, d), block.lse[a]);
        }
      }
    if (!ring.kv_travels_on(s)) continue;
    std::vector<Share> next(P);
    for (int r = 0; r < P; ++r) next[ring.steps[s][r].send_to] = std::move(held[r]);
    held = std::move(next);
  }
  HeadResult out{std::vector<double>(std::size_t(ring.seq_q) * d, 0.0), std::vector<double>(ring.seq_q, kNegInf)};
  for (int r = 0; r < P; ++r) {
    int row = 0;
    for (const TokenRange& t : ring.q_ranges[r])
      for (int a = 0; a < t.count; ++a, ++row) {
        std::copy_n(rank[r].o.begin() + std::ptrdiff_t(row) * d, d, out.o.begin() + std::ptrdiff_t(t.token(a)) * d);
        out.lse[t.token(a)] = rank[r].lse[row];
      }
  }
  return out;
}

}  // namespace flashlab::lesson09
