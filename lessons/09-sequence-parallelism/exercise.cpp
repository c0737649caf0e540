// Lesson 09, exercise: the logsumexp merge of two partial attention results, and ring attention for one
// head on P virtual ranks, run by the project's ring schedule.
//
// Fill in the six TODOs (README.md has the equations and the ring), then build and test YOUR file:
//   cmake -S . -B build -DFLASHLAB_LESSON_SOLUTIONS=OFF
//   cmake --build build --target lesson09_sequence_parallelism
//   ctest --test-dir build -L lesson -R 09 --output-on-failure
// Delete each `(void)x;` line once your code uses x (it only silences "unused" warnings).
#include <utility>

#include "lesson.hpp"

namespace flashlab::lesson09 {

double log_add_exp(double a, double b) {
  // TODO 1 (about 3 lines): max(a, b) + log1p(exp(-|a - b|)). When a is -inf the answer is b (and the
  // other way round): handle that first, because -inf - -inf is NaN.
  (void)a;
  (void)b;
  return 0.0;
}

double stable_sigmoid(double x) {
  // TODO 2 (about 3 lines): 1 / (1 + e^-x) for x >= 0; for x < 0 the same value written as
  // e^x / (1 + e^x), whose exponential cannot overflow either.
  (void)x;
  return 0.0;
}

void merge_row(std::span<double> o, double& lse, std::span<const double> o_b, double lse_b) {
  // TODO 3 (about 8 lines): a block row that saw no key (lse_b = -inf) changes nothing; a running row that
  // has seen nothing yet (lse = -inf) takes the block's o_b and lse_b. Otherwise move o towards o_b by the
  // block's share of the softmax's denominator, stable_sigmoid(lse_b - lse), then lse = log_add_exp(lse, lse_b).
  (void)o;
  (void)lse;
  (void)o_b;
  (void)lse_b;
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
  for (int r = 0; r < P; ++r) {  // given: each rank's queries, no key seen yet, and its own share in hand
    rank[r].q = gather_rows(Q, ring.q_ranges[r], d);
    rank[r].o.assign(rank[r].q.size(), 0.0);
    rank[r].lse.assign(ring.q_tokens(r), kNegInf);
    held[r] = {gather_rows(K, ring.kv_ranges[r], d), gather_rows(V, ring.kv_ranges[r], d)};
  }
  for (int s = 0; s < P; ++s) {
    // TODO 4 (about 15 lines): for every rank r, for every pair of ring.steps[s][r].pairs that is not
    // Skipped: attend_block on the pair's rows (pair.q.count query rows of rank[r].q from row
    // pair.q_offset; pair.k.count rows of held[r].k and held[r].v from row pair.k_offset; the pair's
    // causal_offset when it is Diagonal, else std::nullopt), then merge_row each of the block's rows into
    // row pair.q_offset + a of the rank's (o, lse). std::span's subspan(first * d, count * d) picks rows.
    //
    // TODO 5 (about 4 lines): while ring.kv_travels_on(s), every rank's share moves to the rank
    // ring.steps[s][r].send_to (build the next `held` and swap it in).
    (void)s;
    (void)scale;
  }
  HeadResult out{std::vector<double>(std::size_t(ring.seq_q) * d, 0.0), std::vector<double>(ring.seq_q, kNegInf)};
  // TODO 6 (about 6 lines): each rank's rows go back to their tokens: row `row` of rank r (counting through
  // its ring.q_ranges[r] in order) is token t.token(a); copy its d values of o and its lse there.
  return out;
}

}  // namespace flashlab::lesson09
