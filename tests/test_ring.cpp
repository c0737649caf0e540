// Ring attention (sequence parallelism) on the CPU, model/ring.hpp and cpu_reference/ring.hpp: the
// schedule computes every visible (query, key) pair exactly once and classifies each block as the
// element mask does; its FLOPs add up to the single-device count, its bytes per link are the K/V share
// sizes, and zigzag balances causal work better than contiguous; bad layouts and lengths are refused in
// one sentence. The ring run on P virtual ranks equals naive attention (O, L, dQ, dK, dV) under the
// tolerance rule for every layout, P = 1..4, mask and GQA; the LSE merge is order-independent and
// keeps rows that see no key at L = -inf.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/flops.hpp"
#include "core/mask.hpp"
#include "core/tolerance.hpp"
#include "cpu_reference/block_attention.hpp"
#include "cpu_reference/lse_merge.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/ring.hpp"
#include "model/ring.hpp"

using namespace flashlab;

namespace {

constexpr RingLayout kLayouts[] = {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped};
constexpr CausalAlign kAligns[] = {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight};

// Lengths each layout accepts for P ranks: odd ones where allowed, unequal seq_q and seq_k everywhere.
std::vector<std::pair<int, int>> lengths_for(RingLayout layout, int P) {
  if (layout == RingLayout::Zigzag) return {{4 * P, 4 * P}, {6 * P, 2 * P}, {2 * P, 8 * P}};
  return {{4 * P + 3, 4 * P + 3}, {5 * P + 2, 2 * P + 1}, {P, 7 * P + 4}, {P, P}};
}

bool is_visible(const BlockPair& pair, int a, int c) {
  switch (pair.visibility) {
    case Visibility::Full: return true;
    case Visibility::Skipped: return false;
    case Visibility::Diagonal: return c <= a + pair.causal_offset;
  }
  return false;
}

std::string describe(const RingSchedule& ring) {
  return std::string(to_string(ring.layout)) + " P=" + std::to_string(ring.ranks) + " Sq=" +
         std::to_string(ring.seq_q) + " Sk=" + std::to_string(ring.seq_k) + " causal=" + to_string(ring.causal);
}

Shape shape_of(const RingSchedule& ring, int heads_q = 2, int heads_kv = 1) {
  return Shape{.batch = 2, .heads_q = heads_q, .heads_kv = heads_kv, .seq_q = ring.seq_q, .seq_k = ring.seq_k,
               .head_dim = 16};
}

// bf16 K and V, fp32 dK/dV partials.
RingMachine machine(double flops_per_second, double link_bytes_per_second) {
  return RingMachine{.flops_per_second = flops_per_second, .link_bytes_per_second = link_bytes_per_second,
                     .kv_bytes_per_element = 2, .grad_bytes_per_element = 4};
}

constexpr std::uint64_t kInputSeed = 20261207;

// The tolerance rule of core/tolerance.hpp for out against the double reference.
void check_within_rule(const HostTensor& out, const HostTensor& ref, DType dtype, Quantity q, const std::string& what) {
  const ErrorStats e = compare(out, ref);
  const Bound bound = tolerance(dtype, q, e, nullptr);
  INFO(what, ": rel = ", e.rel, ", max_abs = ", e.max_abs, ", rule ", bound.rule);
  CHECK_FALSE(e.has_nan);
  CHECK(bound.passes(e));
}

Problem make_problem(Shape s, CausalAlign causal) {
  Problem p;
  p.shape = s;
  p.options.causal = causal;
  return p;
}

// The ring in T against naive attention in double, forward and backward.
template <class T>
void check_ring_equals_naive(const RingSchedule& ring, const Shape& s) {
  const DType dtype = std::is_same_v<T, double> ? DType::F64 : DType::F32;
  const Problem p = make_problem(s, ring.causal);
  const Qkv in = random_qkv(s, dtype, kInputSeed);
  const HostTensor dO = random_like_o(s, dtype, kInputSeed + 1);
  const ForwardOut ref = naive_forward<double>(p, in);
  const Grads gref = naive_backward<double>(p, in, ref, dO);
  const std::string what = describe(ring) + " Hq=" + std::to_string(s.heads_q) + " Hkv=" + std::to_string(s.heads_kv) +
                           " " + to_string(dtype);
  const ForwardOut out = ring_forward<T>(ring, p, in);
  check_within_rule(out.o, ref.o, dtype, Quantity::Forward, what + " O");
  check_within_rule(out.lse, ref.lse, dtype, Quantity::Forward, what + " L");
  const Grads g = ring_backward<T>(ring, p, in, out, dO);
  check_within_rule(g.dq, gref.dq, dtype, Quantity::Gradient, what + " dQ");
  check_within_rule(g.dk, gref.dk, dtype, Quantity::Gradient, what + " dK");
  check_within_rule(g.dv, gref.dv, dtype, Quantity::Gradient, what + " dV");
}

}  // namespace

TEST_CASE("causal_shift restates last_visible_key, and visible_scores counts what the mask leaves") {
  for (const CausalAlign align : kAligns)
    for (const auto& [sq, sk] : {std::pair{7, 7}, std::pair{9, 4}, std::pair{3, 11}}) {
      CAPTURE(to_string(align));
      CAPTURE(sq);
      CAPTURE(sk);
      long long visible = 0;
      for (int i = 0; i < sq; ++i)
        for (int j = 0; j < sk; ++j) {
          const bool by_shift = align == CausalAlign::None || j <= i + causal_shift(align, sq, sk);
          CHECK(by_shift == !is_masked(align, i, j, sq, sk));
          visible += by_shift;
        }
      CHECK(visible_scores(align, sq, sk) == visible);
    }
}

TEST_CASE("the ring's schedule computes every visible (query, key) pair exactly once, as the mask says") {
  for (int P = 1; P <= 4; ++P)
    for (const RingLayout layout : kLayouts)
      for (const auto& [sq, sk] : lengths_for(layout, P))
        for (const CausalAlign align : kAligns) {
          const RingSchedule ring = ring_schedule(layout, P, sq, sk, align);
          INFO(describe(ring));
          REQUIRE(ring.steps.size() == std::size_t(P));
          // Every token is kept by exactly one rank.
          std::vector<int> q_owner(sq, 0), k_owner(sk, 0);
          for (int r = 0; r < P; ++r) {
            for (const TokenRange& t : ring.q_ranges[r])
              for (int a = 0; a < t.count; ++a) ++q_owner.at(t.token(a));
            for (const TokenRange& t : ring.kv_ranges[r])
              for (int c = 0; c < t.count; ++c) ++k_owner.at(t.token(c));
          }
          CHECK(std::all_of(q_owner.begin(), q_owner.end(), [](int n) { return n == 1; }));
          CHECK(std::all_of(k_owner.begin(), k_owner.end(), [](int n) { return n == 1; }));

          std::vector<int> computed(std::size_t(sq) * sk, 0);
          for (int s = 0; s < P; ++s)
            for (int r = 0; r < P; ++r) {
              const RankStep& rs = ring.steps[s][r];
              CHECK(rs.kv_origin == ((r - s) % P + P) % P);
              CHECK(rs.send_to == (r + 1) % P);
              // What rank r holds at step s is what rank r - 1 held at step s - 1 and sent on.
              if (s > 0) CHECK(ring.steps[s - 1][(r + P - 1) % P].kv_origin == rs.kv_origin);
              for (const BlockPair& pair : rs.pairs) {
                std::int64_t visible = 0, masked = 0;
                for (int a = 0; a < pair.q.count; ++a)
                  for (int c = 0; c < pair.k.count; ++c) {
                    const int i = pair.q.token(a), j = pair.k.token(c);
                    const bool should_see = !is_masked(align, i, j, sq, sk);
                    CHECK(is_visible(pair, a, c) == should_see);
                    visible += should_see;
                    masked += !should_see;
                    if (is_visible(pair, a, c)) ++computed[std::size_t(i) * sk + j];
                  }
                CHECK(pair.visible_scores == visible);
                if (pair.visibility == Visibility::Diagonal) CHECK((visible > 0 && masked > 0));
              }
            }
          for (int i = 0; i < sq; ++i)
            for (int j = 0; j < sk; ++j)
              CHECK(computed[std::size_t(i) * sk + j] == (is_masked(align, i, j, sq, sk) ? 0 : 1));
        }
}

TEST_CASE("zigzag gives rank r chunks r and 2P-1-r of 2P; striped gives it every P-th token from r") {
  const RingSchedule zig = ring_schedule(RingLayout::Zigzag, 3, 24, 12, CausalAlign::None);
  CHECK(zig.q_ranges[0] == std::vector<TokenRange>{{0, 4, 1}, {20, 4, 1}});
  CHECK(zig.q_ranges[2] == std::vector<TokenRange>{{8, 4, 1}, {12, 4, 1}});
  CHECK(zig.kv_ranges[1] == std::vector<TokenRange>{{2, 2, 1}, {8, 2, 1}});
  const RingSchedule striped = ring_schedule(RingLayout::Striped, 4, 10, 10, CausalAlign::None);
  CHECK(striped.q_ranges[1] == std::vector<TokenRange>{{1, 3, 4}});
  CHECK(striped.q_ranges[3] == std::vector<TokenRange>{{3, 2, 4}});
  const RingSchedule contiguous = ring_schedule(RingLayout::Contiguous, 3, 10, 10, CausalAlign::None);
  CHECK(contiguous.q_tokens(0) + contiguous.q_tokens(1) + contiguous.q_tokens(2) == 10);
  CHECK(contiguous.q_tokens(2) - contiguous.q_tokens(0) <= 1);
}

TEST_CASE("the ring's FLOPs over all ranks and steps equal the single-device FLOPs of the visible scores") {
  for (int P = 1; P <= 4; ++P)
    for (const RingLayout layout : kLayouts)
      for (const auto& [sq, sk] : lengths_for(layout, P))
        for (const CausalAlign align : kAligns) {
          const RingSchedule ring = ring_schedule(layout, P, sq, sk, align);
          INFO(describe(ring));
          const Shape s = shape_of(ring);
          const RingCost fwd = ring_cost(ring, s, Pass::Forward, RingMachine{});
          const RingCost bwd = ring_cost(ring, s, Pass::Backward, RingMachine{});
          const double single_device = forward_flops_per_score(s) * double(visible_scores(align, sq, sk));
          CHECK(fwd.total_flops == single_device);
          CHECK(bwd.total_flops == kBackwardFlopsPerForward * single_device);
          if (align == CausalAlign::None) CHECK(fwd.total_flops == forward_flops(s, CausalAlign::None));
          const double per_rank = std::accumulate(fwd.flops_per_rank.begin(), fwd.flops_per_rank.end(), 0.0);
          CHECK(per_rank == fwd.total_flops);
        }
}

TEST_CASE("causal: zigzag and striped balance the work that contiguous leaves to the last ranks") {
  for (int P = 2; P <= 8; ++P)
    for (const CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
      CAPTURE(P);
      const int N = 64 * P;
      const Shape s{.batch = 1, .heads_q = 4, .heads_kv = 4, .seq_q = N, .seq_k = N, .head_dim = 64};
      // Links fast enough that compute sets every step's time.
      const RingMachine m = machine(1e12, 1e18);
      auto cost = [&](RingLayout layout) {
        return ring_cost(ring_schedule(layout, P, N, N, align), s, Pass::Forward, m);
      };
      const RingCost contiguous = cost(RingLayout::Contiguous), zigzag = cost(RingLayout::Zigzag),
                     striped = cost(RingLayout::Striped);
      CHECK(zigzag.imbalance < contiguous.imbalance);
      CHECK(striped.imbalance < contiguous.imbalance);
      // Zigzag's two chunks of a square causal problem add up to the same work on every rank.
      CHECK(zigzag.imbalance == 1.0);
      // Contiguous: the last rank does (P - 1) full blocks and a diagonal one; the mean is about P / 2.
      CHECK(contiguous.imbalance > 1.8 - 1.0 / P);
      // At step s >= 1 only ranks r >= s have work under contiguous (the rest hold later keys): the
      // slowest rank sets the step's time, so the ring takes longer.
      CHECK(contiguous.steps[1].flops[0] == 0.0);
      CHECK(contiguous.steps[1].idle_seconds[0] == contiguous.steps[1].seconds);
      CHECK(zigzag.seconds < contiguous.seconds);
    }
}

TEST_CASE("bytes per link per step: K and V shares on, and in the backward the dK/dV partials too") {
  const RingMachine m = machine(100e12, 50e9);
  for (int P = 1; P <= 4; ++P)
    for (const RingLayout layout : kLayouts)
      for (const auto& [sq, sk] : lengths_for(layout, P)) {
        const RingSchedule ring = ring_schedule(layout, P, sq, sk, CausalAlign::TopLeft);
        INFO(describe(ring));
        const Shape s = shape_of(ring, 4, 2);
        const RingCost fwd = ring_cost(ring, s, Pass::Forward, m), bwd = ring_cost(ring, s, Pass::Backward, m);
        std::int64_t kv_total = 0, grad_total = 0;
        for (int step = 0; step < P; ++step)
          for (int r = 0; r < P; ++r) {
            const int tokens = ring.kv_tokens(ring.steps[step][r].kv_origin);
            const std::int64_t kv = P > 1 && step < P - 1 ? 2LL * s.batch * s.heads_kv * tokens * s.head_dim * 2 : 0;
            const std::int64_t grads = P > 1 ? 2LL * s.batch * s.heads_kv * tokens * s.head_dim * 4 : 0;
            CHECK(fwd.steps[step].link_bytes[r] == kv);
            CHECK(bwd.steps[step].link_bytes[r] == kv + grads);
            kv_total += kv;
            grad_total += grads;
            // Compute and transfer overlap: the step lasts as long as the slower of the two, on the slowest rank.
            for (const RingCost* c : {&fwd, &bwd}) {
              const RingStepCost& st = c->steps[step];
              CHECK(st.seconds >= st.flops[r] / m.flops_per_second);
              CHECK(st.seconds >= double(st.link_bytes[r]) / m.link_bytes_per_second);
              CHECK(st.idle_seconds[r] == doctest::Approx(st.seconds - st.flops[r] / m.flops_per_second));
            }
          }
        // Forward: every share travels P - 1 hops; backward: its partial gradients make P (the last one home).
        const std::int64_t kv_elements = 2LL * s.batch * s.heads_kv * sk * s.head_dim;
        CHECK(kv_total == (P - 1) * kv_elements * 2);
        CHECK(grad_total == (P > 1 ? P : 0) * kv_elements * 4);
        CHECK(fwd.total_link_bytes == kv_total);
        CHECK(bwd.total_link_bytes == kv_total + grad_total);
      }
}

TEST_CASE("a step's time is its slowest rank's compute or its slowest link, whichever is longer") {
  const RingSchedule ring = ring_schedule(RingLayout::Contiguous, 4, 4096, 4096, CausalAlign::None);
  const Shape s{.batch = 1, .heads_q = 8, .heads_kv = 8, .seq_q = 4096, .seq_k = 4096, .head_dim = 128};
  const double flops = forward_flops_per_score(s) * 1024.0 * 1024.0;  // one full block per rank and step
  const double bytes = 2.0 * 8 * 1024 * 128 * 2;                       // K and V shares of 1024 tokens, bf16
  const RingCost compute_bound =
      ring_cost(ring, s, Pass::Forward, machine(1e12, 1e12));
  CHECK(compute_bound.steps[0].seconds == doctest::Approx(flops / 1e12));
  CHECK(compute_bound.seconds == doctest::Approx(4 * flops / 1e12));
  const RingCost link_bound =
      ring_cost(ring, s, Pass::Forward, machine(1e18, 1e6));
  CHECK(link_bound.steps[0].seconds == doctest::Approx(bytes / 1e6));
  CHECK(link_bound.steps[3].seconds == doctest::Approx(flops / 1e18));  // the last step sends nothing
  CHECK(link_bound.steps[0].idle_seconds[2] == doctest::Approx(bytes / 1e6 - flops / 1e18));
  CHECK(link_bound.steps[0].imbalance == 1.0);
}

TEST_CASE("the ring refuses what its layouts cannot hold, in one sentence") {
  auto message = [](RingLayout layout, int P, int sq, int sk) {
    try {
      ring_schedule(layout, P, sq, sk, CausalAlign::None);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message(RingLayout::Contiguous, 0, 8, 8) == "the ring needs at least 1 rank, got 0");
  CHECK(message(RingLayout::Zigzag, 3, 18, 20).find("seq_k = 20 is not a multiple of") != std::string::npos);
  CHECK(message(RingLayout::Zigzag, 3, 17, 18).find("2P = 6 equal chunks") != std::string::npos);
  CHECK(message(RingLayout::Striped, 4, 3, 8).find("seq_q = 3 is shorter than the 4 ranks") != std::string::npos);
  CHECK(message(RingLayout::Contiguous, 4, 8, 2).find("seq_k = 2") != std::string::npos);
  CHECK(message(RingLayout::Contiguous, 4, 8, 8) == "no error");
  CHECK_THROWS_WITH_AS(parse_ring_layout("spiral"),
                       "unknown ring layout 'spiral': supported are contiguous, zigzag and striped", InputError);
  CHECK(parse_ring_layout("ZigZag") == RingLayout::Zigzag);
  const RingSchedule ring = ring_schedule(RingLayout::Striped, 2, 8, 8, CausalAlign::None);
  const Shape other{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 9, .head_dim = 8};
  CHECK_THROWS_AS(ring_cost(ring, other, Pass::Forward, RingMachine{}), InputError);
}

TEST_CASE("ring attention on P = 1..4 virtual ranks equals naive in double, forward and backward, every layout") {
  for (int P = 1; P <= 4; ++P)
    for (const RingLayout layout : kLayouts)
      for (const auto& [sq, sk] : lengths_for(layout, P))
        for (const CausalAlign align : kAligns) {
          const RingSchedule ring = ring_schedule(layout, P, sq, sk, align);
          check_ring_equals_naive<double>(
              ring, Shape{.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = sq, .seq_k = sk, .head_dim = 8});
        }
}

TEST_CASE("ring attention with GQA and MQA: the group's dK/dV partials travel and add up") {
  for (const RingLayout layout : kLayouts)
    for (const int heads_kv : {2, 1})
      for (const CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
        const RingSchedule ring = ring_schedule(layout, 3, 18, 24, align);
        check_ring_equals_naive<double>(
            ring, Shape{.batch = 1, .heads_q = 4, .heads_kv = heads_kv, .seq_q = 18, .seq_k = 24, .head_dim = 5});
      }
}

TEST_CASE("ring attention in float passes the f32 rule") {
  for (const RingLayout layout : kLayouts)
    for (const CausalAlign align : kAligns) {
      const RingSchedule ring = ring_schedule(layout, 4, 40, 56, align);
      check_ring_equals_naive<float>(
          ring, Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 40, .seq_k = 56, .head_dim = 32});
    }
}

TEST_CASE("ring attention: rows that see no key end with O = 0, L = -inf and zero dQ on every layout") {
  // Bottom-right with seq_q > seq_k: query i sees keys j <= i - 12, so the first 12 queries see none, and
  // on most ranks every block of theirs is skipped or masked row by row.
  const Shape s{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 24, .seq_k = 12, .head_dim = 4};
  const Problem p = make_problem(s, CausalAlign::BottomRight);
  const Qkv in = random_qkv(s, DType::F64, kInputSeed);
  const HostTensor dO = random_like_o(s, DType::F64, kInputSeed + 1);
  for (const RingLayout layout : kLayouts) {
    CAPTURE(to_string(layout));
    const RingSchedule ring = ring_schedule(layout, 3, s.seq_q, s.seq_k, CausalAlign::BottomRight);
    const ForwardOut f = ring_forward<double>(ring, p, in);
    const Grads g = ring_backward<double>(ring, p, in, f, dO);
    for (int i = 0; i < s.seq_q; ++i) {
      CAPTURE(i);
      if (i < 12) {
        CHECK(f.lse.data[i] == -INFINITY);
        for (int c = 0; c < s.head_dim; ++c) {
          CHECK(f.o.at(0, i, 0, c) == 0.0);
          CHECK(g.dq.at(0, i, 0, c) == 0.0);
        }
      } else {
        CHECK(std::isfinite(f.lse.data[i]));
      }
    }
  }
}

TEST_CASE("the LSE merge: any order and grouping of the partial results gives attention over all keys") {
  using detail::Col;
  using detail::Mat;
  const int m = 6, n = 15, d = 4;
  const Shape s{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = m, .seq_k = n, .head_dim = d};
  const Qkv in = random_qkv(s, DType::F64, kInputSeed);
  const Mat<double> Q = detail::gather_head<double>(in.q, 0, 0), K = detail::gather_head<double>(in.k, 0, 0),
                    V = detail::gather_head<double>(in.v, 0, 0);
  // Keys scaled so that the parts' logsumexps are far apart: the merge must not overflow.
  const Mat<double> K_loud = 40.0 * K;
  const double tau = 0.5;
  const detail::BlockResult<double> all = detail::block_forward<double>(Q, K_loud, V, tau, std::nullopt);
  // Three parts of the keys: [0, 4), [4, 11), [11, 15).
  const int first[] = {0, 4, 11}, count[] = {4, 7, 4};
  std::vector<detail::BlockResult<double>> part;
  for (int k = 0; k < 3; ++k)
    part.push_back(detail::block_forward<double>(Q, K_loud.middleRows(first[k], count[k]),
                                                 V.middleRows(first[k], count[k]), tau, std::nullopt));
  auto merged_in_order = [&](std::vector<int> order) {
    Mat<double> O = Mat<double>::Zero(m, d);
    Col<double> L = Col<double>::Constant(m, -INFINITY);
    for (int k : order) merge_attention_partial<double>(O, L, 0, part[k].O, part[k].L);
    return std::pair{O, L};
  };
  auto close = [](const auto& a, const auto& b) {
    return (a - b).abs().maxCoeff() <= 1e-12 * (1 + b.abs().maxCoeff());
  };
  for (const std::vector<int>& order : {std::vector{0, 1, 2}, std::vector{2, 0, 1}, std::vector{1, 2, 0}}) {
    const auto [O, L] = merged_in_order(order);
    CHECK(L.allFinite());
    CHECK(close(O.array(), all.O.array()));
    CHECK(close(L, all.L));
  }
  // Grouping: (B merged with C) merged into A equals ((A, B), C).
  auto [O_bc, L_bc] = merged_in_order({1, 2});
  Mat<double> O = part[0].O;
  Col<double> L = part[0].L;
  merge_attention_partial<double>(O, L, 0, O_bc, L_bc);
  CHECK(close(O.array(), all.O.array()));
  CHECK(close(L, all.L));
  // A sigmoid weight, not e^L: a merge with L values 1000 apart is still finite and exact.
  Mat<double> O_big = Mat<double>::Ones(1, d), O_small = Mat<double>::Zero(1, d);
  Col<double> L_big = Col<double>::Constant(1, 1000.0), L_small = Col<double>::Constant(1, 0.0);
  merge_attention_partial<double>(O_small, L_small, 0, O_big, L_big);
  CHECK(L_small(0) == 1000.0);
  CHECK(O_small(0, 0) == 1.0);
}

TEST_CASE("the LSE merge: a fully masked block changes nothing, and a row that saw nothing takes the block") {
  using detail::Col;
  using detail::Mat;
  Mat<double> O(2, 2);
  O << 0.5, -1.0, 0.0, 0.0;
  Col<double> L(2);
  L << 0.25, -INFINITY;  // row 1 has seen no key yet
  Mat<double> O_b(2, 2);
  O_b << 0.0, 0.0, 2.0, 3.0;
  Col<double> L_b(2);
  L_b << -INFINITY, 1.5;  // the block hides every key from row 0
  merge_attention_partial<double>(O, L, 0, O_b, L_b);
  CHECK(O(0, 0) == 0.5);
  CHECK(O(0, 1) == -1.0);
  CHECK(L(0) == 0.25);
  CHECK(O(1, 0) == 2.0);
  CHECK(O(1, 1) == 3.0);
  CHECK(L(1) == 1.5);
  // Merging nothing into nothing stays nothing, never NaN.
  Mat<double> O_none = Mat<double>::Zero(1, 2), O_none_b = Mat<double>::Zero(1, 2);
  Col<double> L_none = Col<double>::Constant(1, -INFINITY), L_none_b = Col<double>::Constant(1, -INFINITY);
  merge_attention_partial<double>(O_none, L_none, 0, O_none_b, L_none_b);
  CHECK(L_none(0) == -INFINITY);
  CHECK(O_none.isZero());
}

TEST_CASE("ring attention refuses a schedule made for another problem, and dropout, in one sentence") {
  const Shape s{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 4};
  const Qkv in = random_qkv(s, DType::F64, kInputSeed);
  const RingSchedule ring = ring_schedule(RingLayout::Contiguous, 2, 8, 8, CausalAlign::TopLeft);
  CHECK_THROWS_WITH_AS(ring_forward<double>(ring, make_problem(s, CausalAlign::None), in),
                       "the ring's schedule was made for seq_q = 8, seq_k = 8, causal top-left, not for this "
                       "problem's seq_q = 8, seq_k = 8, causal none",
                       InputError);
  Problem dropout = make_problem(s, CausalAlign::TopLeft);
  dropout.options.dropout_p = 0.1;
  CHECK_THROWS_WITH_AS(ring_forward<double>(ring, dropout, in),
                       "ring attention's CPU reference supports dropout_p = 0 only, got 0.100000", InputError);
  CHECK_NOTHROW(ring_forward<double>(ring, make_problem(s, CausalAlign::TopLeft), in));
}

// block_launch (the GPU ring's plan for a pair): what it computes, m queries against the first `keys` keys with
// `align`, is exactly the pair's visible set, and with seq_q == seq_k every pair of every layout has a plan.
TEST_CASE("block_launch: a pair as one block of the usual alignments, exactly its visible set, for every layout") {
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped})
    for (CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
      for (int P : {1, 2, 3, 4, 8})
        for (int n : {4 * P, 4 * P + 2, 8 * P + 6}) {
          if (layout == RingLayout::Zigzag && n % (2 * P) != 0) continue;
          const RingSchedule ring = ring_schedule(layout, P, n, n, causal);
          for (const auto& step : ring.steps)
            for (const RankStep& rs : step)
              for (const BlockPair& pair : rs.pairs) {
                INFO(to_string(layout) << " P=" << P << " N=" << n << " " << to_string(causal) << " offset "
                                       << pair.causal_offset);
                BlockLaunch plan;
                REQUIRE_NOTHROW(plan = block_launch(pair));
                REQUIRE(plan.keys <= pair.k.count);
                std::int64_t seen = 0;
                for (int a = 0; a < pair.q.count; ++a)
                  for (int c = 0; c < pair.k.count; ++c) {
                    const bool pair_sees = pair.visibility == Visibility::Full ||
                                           (pair.visibility == Visibility::Diagonal && c <= a + pair.causal_offset);
                    const bool plan_sees =
                        !plan.skip && c < plan.keys && !is_masked(plan.align, a, c, pair.q.count, plan.keys);
                    CHECK(pair_sees == plan_sees);
                    seen += plan_sees;
                  }
                CHECK(seen == pair.visible_scores);
              }
        }
}

TEST_CASE("block_launch refuses a diagonal block whose last rows see all its keys, in one sentence") {
  // 4 queries, 3 keys, offset 1: rows 2 and 3 see keys 0-2, all of them.
  const BlockPair pair{.q = {.first = 0, .count = 4}, .k = {.first = 0, .count = 3}, .visibility = Visibility::Diagonal,
                       .causal_offset = 1};
  CHECK_THROWS_WITH_AS(block_launch(pair),
                       "the GPU ring runs a diagonal block as one bottom-right block, and this one's last 2 rows see "
                       "all of its 3 keys, which would need a block of their own: it supports causal masks with "
                       "seq_q == seq_k (any layout) or no mask",
                       InputError);
  // Offset -1 over as many keys as queries: the first row sees nothing, and the last key no row.
  const BlockPair striped{.q = {.first = 0, .count = 3}, .k = {.first = 1, .count = 3}, .visibility = Visibility::Diagonal,
                          .causal_offset = -1};
  const BlockLaunch plan = block_launch(striped);
  CHECK_FALSE(plan.skip);
  CHECK(plan.keys == 2);
  CHECK(plan.align == CausalAlign::BottomRight);
}
