// Ring attention (sequence parallelism) on the CPU, model/ring.hpp and cpu_reference/ring.hpp: the
// schedule computes every visible (query, key) pair exactly once and classifies each block as the
// element mask does; its FLOPs add up to the single-device count, its bytes per link are the K/V share
// sizes, and zigzag balances causal work better than contiguous; bad layouts and lengths are refused in
// one sentence.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "core/flops.hpp"
#include "core/mask.hpp"
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
