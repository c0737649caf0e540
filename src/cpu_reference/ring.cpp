// Ring attention on P virtual ranks (ring.hpp says what it computes). Each (batch, head) runs the ring
// on its own: heads never exchange data, so running them one after the other computes what a ring that
// sends every head's share at once computes. Per head the simulation keeps what a real rank would:
//
//   RankQueries  the queries a rank keeps and their running results: Q_r, O_r, L_r (and dO_r, D_r, dQ_r)
//   KvShare      the K/V share a rank holds this step (and its travelling dK/dV partials); at the end of
//                a step it moves to the rank the schedule names (RankStep::send_to)
//
// The share a rank finds in hand is checked against the schedule's kv_origin at every step, so the
// simulated ring and the schedule cannot drift apart.
#include "cpu_reference/ring.hpp"

#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/block_attention.hpp"
#include "cpu_reference/lse_merge.hpp"
#include "cpu_reference/tile_steps.hpp"

namespace flashlab {

using detail::Col;
using detail::Mat;

namespace {

// The rows of head h of batch b at the tokens of `ranges`, in order: (tokens, d).
template <class T>
Mat<T> gather_tokens(const HostTensor& t, int b, int h, const std::vector<TokenRange>& ranges) {
  int n = 0;
  for (const TokenRange& r : ranges) n += r.count;
  Mat<T> m(n, t.dims[3]);
  int row = 0;
  for (const TokenRange& r : ranges)
    for (int a = 0; a < r.count; ++a, ++row)
      for (Eigen::Index c = 0; c < m.cols(); ++c) m(row, c) = static_cast<T>(t.at(b, r.token(a), h, c));
  return m;
}

// Writes (or, with accumulate, adds) the rows of m back to the tokens of `ranges`.
template <class T>
void scatter_tokens(HostTensor& t, int b, int h, const std::vector<TokenRange>& ranges, const Mat<T>& m,
                    bool accumulate) {
  int row = 0;
  for (const TokenRange& r : ranges)
    for (int a = 0; a < r.count; ++a, ++row)
      for (Eigen::Index c = 0; c < m.cols(); ++c) {
        double& x = t.at(b, r.token(a), h, c);
        x = (accumulate ? x : 0.0) + static_cast<double>(m(row, c));
      }
}

// Where (b, h, token) sits in an LSE of (B, H_q, S_q).
std::size_t lse_index(const Shape& s, int b, int h, int token) {
  return (static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + token;
}

template <class T>
struct RankQueries {
  Mat<T> Q, O, dO, dQ;  // (rank's query tokens, d)
  Col<T> L, D;          // (rank's query tokens)
};

template <class T>
struct KvShare {
  int origin = 0;
  Mat<T> K, V, dK, dV;  // (share's tokens, d)
};

detail::CausalOffset causal_offset_of(const BlockPair& pair) {
  if (pair.visibility == Visibility::Diagonal) return pair.causal_offset;
  return std::nullopt;
}

void check_ring_problem(const RingSchedule& ring, const Problem& p) {
  validate(p);
  if (ring.seq_q != p.shape.seq_q || ring.seq_k != p.shape.seq_k || ring.causal != p.options.causal)
    throw InputError("the ring's schedule was made for seq_q = " + std::to_string(ring.seq_q) +
                     ", seq_k = " + std::to_string(ring.seq_k) + ", causal " + to_string(ring.causal) +
                     ", not for this problem's seq_q = " + std::to_string(p.shape.seq_q) + ", seq_k = " +
                     std::to_string(p.shape.seq_k) + ", causal " + to_string(p.options.causal));
  if (p.options.dropout_p > 0)
    throw InputError("ring attention's CPU reference supports dropout_p = 0 only, got " +
                     std::to_string(p.options.dropout_p));
}

// The share each rank holds at `step` must be the one the schedule says it holds.
template <class T>
void check_in_hand(const RingSchedule& ring, int step, const std::vector<KvShare<T>>& held) {
  for (int r = 0; r < ring.ranks; ++r)
    if (held[r].origin != ring.steps[step][r].kv_origin)
      throw std::logic_error("ring: rank " + std::to_string(r) + " holds the share of rank " +
                             std::to_string(held[r].origin) + " at step " + std::to_string(step) +
                             ", not the one the schedule names");
}

// Every rank sends the share it holds to the rank the schedule names.
template <class T>
void pass_on(const RingSchedule& ring, int step, std::vector<KvShare<T>>& held) {
  std::vector<KvShare<T>> next(held.size());
  for (int r = 0; r < ring.ranks; ++r) next[ring.steps[step][r].send_to] = std::move(held[r]);
  held = std::move(next);
}

template <class T>
std::vector<KvShare<T>> initial_shares(const RingSchedule& ring, const Qkv& in, int b, int h_kv, bool with_grads) {
  std::vector<KvShare<T>> held(ring.ranks);
  for (int r = 0; r < ring.ranks; ++r) {
    held[r].origin = r;
    held[r].K = gather_tokens<T>(in.k, b, h_kv, ring.kv_ranges[r]);
    held[r].V = gather_tokens<T>(in.v, b, h_kv, ring.kv_ranges[r]);
    if (with_grads) {
      held[r].dK.setZero(held[r].K.rows(), held[r].K.cols());
      held[r].dV.setZero(held[r].V.rows(), held[r].V.cols());
    }
  }
  return held;
}

}  // namespace

template <class T>
ForwardOut ring_forward(const RingSchedule& ring, const Problem& p, const Qkv& in) {
  check_ring_problem(ring, p);
  check_dims(p.shape, in);
  const Shape& s = p.shape;
  const T tau = static_cast<T>(p.softmax_scale());
  const int P = ring.ranks;
  ForwardOut out{HostTensor(q_dims(s)), HostTensor(lse_dims(s))};
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      std::vector<RankQueries<T>> rank(P);
      for (int r = 0; r < P; ++r) {
        rank[r].Q = gather_tokens<T>(in.q, b, h, ring.q_ranges[r]);  // (q tokens of r, d)
        rank[r].O.setZero(rank[r].Q.rows(), s.head_dim);
        rank[r].L.setConstant(rank[r].Q.rows(), detail::kNegInf<T>);  // no key seen yet
      }
      std::vector<KvShare<T>> held = initial_shares<T>(ring, in, b, h / s.group(), false);
      for (int step = 0; step < P; ++step) {
        check_in_hand(ring, step, held);
        for (int r = 0; r < P; ++r)
          for (const BlockPair& pair : ring.steps[step][r].pairs) {
            if (pair.visibility == Visibility::Skipped) continue;
            const KvShare<T>& kv = held[r];
            const detail::BlockResult<T> block =
                detail::block_forward<T>(rank[r].Q.middleRows(pair.q_offset, pair.q.count),   // Q_i (m, d)
                                         kv.K.middleRows(pair.k_offset, pair.k.count),       // K_j (n, d)
                                         kv.V.middleRows(pair.k_offset, pair.k.count), tau,  // V_j (n, d)
                                         causal_offset_of(pair));
            merge_attention_partial<T>(rank[r].O, rank[r].L, pair.q_offset, block.O, block.L);
          }
        if (ring.kv_travels_on(step)) pass_on(ring, step, held);
      }
      for (int r = 0; r < P; ++r) {
        scatter_tokens(out.o, b, h, ring.q_ranges[r], rank[r].O, false);
        int row = 0;
        for (const TokenRange& t : ring.q_ranges[r])
          for (int a = 0; a < t.count; ++a, ++row)
            out.lse.data[lse_index(s, b, h, t.token(a))] = static_cast<double>(rank[r].L(row));
      }
    }
  return out;
}

template <class T>
Grads ring_backward(const RingSchedule& ring, const Problem& p, const Qkv& in, const ForwardOut& fwd,
                    const HostTensor& dO) {
  check_ring_problem(ring, p);
  check_dims(p.shape, in, &dO);
  const Shape& s = p.shape;
  const T tau = static_cast<T>(p.softmax_scale());
  const int P = ring.ranks;
  Grads g{HostTensor(q_dims(s)), HostTensor(kv_dims(s)), HostTensor(kv_dims(s))};
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int h_kv = h / s.group();
      std::vector<RankQueries<T>> rank(P);
      for (int r = 0; r < P; ++r) {
        RankQueries<T>& q = rank[r];
        q.Q = gather_tokens<T>(in.q, b, h, ring.q_ranges[r]);
        q.O = gather_tokens<T>(fwd.o, b, h, ring.q_ranges[r]);
        q.dO = gather_tokens<T>(dO, b, h, ring.q_ranges[r]);
        q.dQ.setZero(q.Q.rows(), s.head_dim);
        q.L.resize(q.Q.rows());
        int row = 0;
        for (const TokenRange& t : ring.q_ranges[r])
          for (int a = 0; a < t.count; ++a, ++row)
            q.L(row) = static_cast<T>(fwd.lse.data[lse_index(s, b, h, t.token(a))]);
        q.D = (q.dO.array() * q.O.array()).rowwise().sum();  // D_i = rowsum(dO_i o O_i), on the rank
      }
      std::vector<KvShare<T>> held = initial_shares<T>(ring, in, b, h_kv, true);
      for (int step = 0; step < P; ++step) {
        check_in_hand(ring, step, held);
        for (int r = 0; r < P; ++r)
          for (const BlockPair& pair : ring.steps[step][r].pairs) {
            if (pair.visibility == Visibility::Skipped) continue;
            RankQueries<T>& q = rank[r];
            KvShare<T>& kv = held[r];
            const detail::BlockGrads<T> block = detail::block_backward<T>(
                q.Q.middleRows(pair.q_offset, pair.q.count), kv.K.middleRows(pair.k_offset, pair.k.count),
                kv.V.middleRows(pair.k_offset, pair.k.count), q.dO.middleRows(pair.q_offset, pair.q.count),
                q.L.segment(pair.q_offset, pair.q.count), q.D.segment(pair.q_offset, pair.q.count), tau,
                causal_offset_of(pair));
            q.dQ.middleRows(pair.q_offset, pair.q.count) += block.dQ;     // stays on the rank
            kv.dK.middleRows(pair.k_offset, pair.k.count) += block.dK;    // travels with the share
            kv.dV.middleRows(pair.k_offset, pair.k.count) += block.dV;
          }
        pass_on(ring, step, held);  // at the last step, this hop takes the dK/dV partials home
      }
      for (int r = 0; r < P; ++r) {
        if (held[r].origin != r)
          throw std::logic_error("ring: after the last hop rank " + std::to_string(r) + " holds the partials of rank " +
                                 std::to_string(held[r].origin));
        scatter_tokens(g.dq, b, h, ring.q_ranges[r], rank[r].dQ, false);
        // GQA: the query heads of a group share K and V, so their gradients add up.
        scatter_tokens(g.dk, b, h_kv, ring.kv_ranges[r], held[r].dK, true);
        scatter_tokens(g.dv, b, h_kv, ring.kv_ranges[r], held[r].dV, true);
      }
    }
  return g;
}

template ForwardOut ring_forward<double>(const RingSchedule&, const Problem&, const Qkv&);
template ForwardOut ring_forward<float>(const RingSchedule&, const Problem&, const Qkv&);
template Grads ring_backward<double>(const RingSchedule&, const Problem&, const Qkv&, const ForwardOut&,
                                     const HostTensor&);
template Grads ring_backward<float>(const RingSchedule&, const Problem&, const Qkv&, const ForwardOut&,
                                    const HostTensor&);

}  // namespace flashlab
