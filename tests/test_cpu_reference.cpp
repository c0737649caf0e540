// src/cpu_reference, the numbers: tiled FA1 and FA2 (forward and backward) equal naive attention in
// double for every shape and mode below; naive's gradients equal finite differences; the
// float variants pass the tolerance rule; dropout drops the same elements everywhere, at rate p;
// fully masked rows give O = 0, LSE = -inf and zero gradients; bad input is an InputError.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/tolerance.hpp"
#include "registry/variants.hpp"
#include "cpu_reference/cpu_variants.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/reference.hpp"
#include "cpu_reference/tiled.hpp"

using namespace flashlab;

namespace {

constexpr std::uint64_t kInputSeed = 20261123;

Problem make_problem(Shape s, CausalAlign causal = CausalAlign::None, double dropout_p = 0.0) {
  Problem p;
  p.shape = s;
  p.options.causal = causal;
  p.options.dropout_p = dropout_p;
  p.options.seed = 0x5eed;
  return p;
}

std::string describe(const Problem& p, const char* what) {
  const Shape& s = p.shape;
  return std::string(what) + " B=" + std::to_string(s.batch) + " Hq=" + std::to_string(s.heads_q) +
         " Hkv=" + std::to_string(s.heads_kv) + " Sq=" + std::to_string(s.seq_q) + " Sk=" +
         std::to_string(s.seq_k) + " d=" + std::to_string(s.head_dim) + " causal=" + to_string(p.options.causal) +
         " p=" + std::to_string(p.options.dropout_p);
}

// The tolerance rule of core/tolerance.hpp for out against the double reference.
void check_within_rule(const HostTensor& out, const HostTensor& ref, DType dtype, Quantity q, const std::string& what) {
  const ErrorStats e = compare(out, ref);
  const Bound bound = tolerance(dtype, q, e, nullptr);
  INFO(what, ": rel = ", e.rel, ", max_abs = ", e.max_abs, ", rule ", bound.rule);
  CHECK_FALSE(e.has_nan);
  CHECK(bound.passes(e));
}

// Every tiled loop order and a few tilings (dividing and ragged) against naive, in double.
void check_tiled_equals_naive(const Problem& p, std::vector<Tiling> tilings = {{.Br = 8, .Bc = 16},
                                                                               {.Br = 5, .Bc = 7},
                                                                               {.Br = 64, .Bc = 64}}) {
  const Qkv in = random_qkv(p.shape, DType::F64, kInputSeed);
  const HostTensor dO = random_like_o(p.shape, DType::F64, kInputSeed + 1);
  const ForwardOut ref = naive_forward<double>(p, in);
  const Grads gref = naive_backward<double>(p, in, ref, dO);
  for (const Tiling t : tilings)
    for (const Algorithm order : {Algorithm::FA1, Algorithm::FA2}) {
      const std::string what = describe(p, to_string(order)) + " Br=" + std::to_string(t.Br) +
                               " Bc=" + std::to_string(t.Bc);
      const ForwardOut out = tiled_forward<double>(order, p, in, t);
      check_within_rule(out.o, ref.o, DType::F64, Quantity::Forward, what + " O");
      check_within_rule(out.lse, ref.lse, DType::F64, Quantity::Forward, what + " LSE");
      const Grads g = tiled_backward<double>(order, p, in, out, dO, t);
      check_within_rule(g.dq, gref.dq, DType::F64, Quantity::Gradient, what + " dQ");
      check_within_rule(g.dk, gref.dk, DType::F64, Quantity::Gradient, what + " dK");
      check_within_rule(g.dv, gref.dv, DType::F64, Quantity::Gradient, what + " dV");
    }
}

bool all_finite(const HostTensor& t) {
  for (double x : t.data)
    if (!std::isfinite(x)) return false;
  return true;
}

double lse_at(const ForwardOut& f, const Shape& s, int b, int h, int row) {
  return f.lse.data[(static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + row];
}

}  // namespace

TEST_CASE("tiled FA1 and FA2 equal naive in double, forward and backward, for any lengths") {
  SUBCASE("odd lengths") {
    check_tiled_equals_naive(
        make_problem({.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = 37, .seq_k = 53, .head_dim = 16}));
  }
  SUBCASE("seq_q > seq_k") {
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 70, .seq_k = 23, .head_dim = 8}));
  }
  SUBCASE("seq_q < seq_k") {
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 19, .seq_k = 90, .head_dim = 8}));
  }
  SUBCASE("length 1 on either side") {
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 1, .seq_k = 1, .head_dim = 4}));
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 1, .seq_k = 40, .head_dim = 4}));
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 40, .seq_k = 1, .head_dim = 4}));
  }
  SUBCASE("one tile larger than the whole sequence") {
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 9, .seq_k = 11, .head_dim = 8}),
        {{.Br = 64, .Bc = 64}, {.Br = 128, .Bc = 32}});
  }
}

TEST_CASE("tiled FA1 and FA2 equal naive for head dims 1, 3, 64 and 256") {
  for (const int d : {1, 3, 64, 256}) {
    CAPTURE(d);
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 33, .seq_k = 29, .head_dim = d}),
        {{.Br = 8, .Bc = 16}, {.Br = 64, .Bc = 64}});
  }
}

TEST_CASE("tiled FA1 and FA2 equal naive for every head dim from 1 to 256") {
  // A small ragged problem (Sq = 5, Sk = 7, tiles 2 x 3) keeps the 256 cases fast; the head-dim
  // loops are what differ. Causal bottom-right so that masking runs through every d too.
  for (int d = 1; d <= 256; ++d) {
    CAPTURE(d);
    check_tiled_equals_naive(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 5, .seq_k = 7, .head_dim = d},
                     CausalAlign::BottomRight),
        {{.Br = 2, .Bc = 3}});
  }
}

TEST_CASE("tiled equals naive under the causal mask in both alignments") {
  // The alignment loop sits inside each SUBCASE: doctest enters one subcase per run.
  const CausalAlign aligns[] = {CausalAlign::TopLeft, CausalAlign::BottomRight};
  SUBCASE("square") {
    for (const CausalAlign align : aligns)
      check_tiled_equals_naive(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 45, .seq_k = 45, .head_dim = 8}, align));
  }
  SUBCASE("seq_q > seq_k") {
    for (const CausalAlign align : aligns)
      check_tiled_equals_naive(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 61, .seq_k = 26, .head_dim = 8}, align));
  }
  SUBCASE("seq_q < seq_k") {
    for (const CausalAlign align : aligns)
      check_tiled_equals_naive(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 26, .seq_k = 61, .head_dim = 8}, align));
  }
  SUBCASE("with dropout") {
    for (const CausalAlign align : aligns)
      check_tiled_equals_naive(make_problem(
          {.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 30, .seq_k = 41, .head_dim = 8}, align, 0.25));
  }
}

TEST_CASE("bottom-right causal with seq_q > seq_k: rows that see no key give O = 0, LSE = -inf and zero dQ") {
  const Shape s{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 40, .seq_k = 15, .head_dim = 8};
  const Problem p = make_problem(s, CausalAlign::BottomRight);
  const int blind_rows = s.seq_q - s.seq_k;  // query r sees keys j <= r + seq_k - seq_q
  const Qkv in = random_qkv(s, DType::F64, kInputSeed);
  const HostTensor dO = random_like_o(s, DType::F64, kInputSeed + 1);
  struct Run {
    const char* name;
    ForwardOut f;
    Grads g;
  };
  std::vector<Run> runs;
  {
    ForwardOut f = naive_forward<double>(p, in);
    Grads g = naive_backward<double>(p, in, f, dO);
    runs.push_back({"naive", f, g});
  }
  for (const Algorithm order : {Algorithm::FA1, Algorithm::FA2}) {
    ForwardOut f = tiled_forward<double>(order, p, in, Tiling{.Br = 8, .Bc = 4});
    Grads g = tiled_backward<double>(order, p, in, f, dO, Tiling{.Br = 8, .Bc = 4});
    runs.push_back({to_string(order), f, g});
  }
  for (const Run& r : runs) {
    CAPTURE(r.name);
    CHECK(all_finite(r.f.o));
    CHECK(all_finite(r.g.dq));
    CHECK(all_finite(r.g.dk));
    CHECK(all_finite(r.g.dv));
    for (int h = 0; h < s.heads_q; ++h)
      for (int row = 0; row < s.seq_q; ++row) {
        const double lse = lse_at(r.f, s, 0, h, row);
        CHECK_FALSE(std::isnan(lse));
        if (row < blind_rows) {
          CHECK(lse == -INFINITY);
          for (int c = 0; c < s.head_dim; ++c) {
            CHECK(r.f.o.at(0, row, h, c) == 0.0);
            CHECK(r.g.dq.at(0, row, h, c) == 0.0);
          }
        } else {
          CHECK(std::isfinite(lse));
        }
      }
  }
}

TEST_CASE("GQA: query head h reads key/value head h / group, and the group's gradients add up") {
  for (const int heads_kv : {2, 1}) {
    CAPTURE(heads_kv);
    const Shape s{.batch = 2, .heads_q = 4, .heads_kv = heads_kv, .seq_q = 21, .seq_k = 18, .head_dim = 8};
    const Problem p = make_problem(s, CausalAlign::TopLeft);
    check_tiled_equals_naive(p, {{.Br = 8, .Bc = 16}, {.Br = 5, .Bc = 7}});

    // Naive GQA equals ordinary multi-head attention on K and V repeated to heads_q heads.
    const Shape mha{.batch = s.batch,
                    .heads_q = s.heads_q,
                    .heads_kv = s.heads_q,
                    .seq_q = s.seq_q,
                    .seq_k = s.seq_k,
                    .head_dim = s.head_dim};
    const Problem p_mha = make_problem(mha, CausalAlign::TopLeft);
    const Qkv in = random_qkv(s, DType::F64, kInputSeed);
    const HostTensor dO = random_like_o(s, DType::F64, kInputSeed + 1);
    Qkv repeated{in.q, HostTensor(kv_dims(mha)), HostTensor(kv_dims(mha))};
    for (int b = 0; b < s.batch; ++b)
      for (int t = 0; t < s.seq_k; ++t)
        for (int h = 0; h < s.heads_q; ++h)
          for (int c = 0; c < s.head_dim; ++c) {
            repeated.k.at(b, t, h, c) = in.k.at(b, t, h / s.group(), c);
            repeated.v.at(b, t, h, c) = in.v.at(b, t, h / s.group(), c);
          }
    const ForwardOut gqa = naive_forward<double>(p, in);
    const ForwardOut ref = naive_forward<double>(p_mha, repeated);
    check_within_rule(gqa.o, ref.o, DType::F64, Quantity::Forward, "GQA O vs repeated-KV MHA");
    const Grads g = naive_backward<double>(p, in, gqa, dO);
    const Grads g_mha = naive_backward<double>(p_mha, repeated, ref, dO);
    HostTensor dk_summed(kv_dims(s)), dv_summed(kv_dims(s));
    for (int b = 0; b < s.batch; ++b)
      for (int t = 0; t < s.seq_k; ++t)
        for (int h = 0; h < s.heads_q; ++h)
          for (int c = 0; c < s.head_dim; ++c) {
            dk_summed.at(b, t, h / s.group(), c) += g_mha.dk.at(b, t, h, c);
            dv_summed.at(b, t, h / s.group(), c) += g_mha.dv.at(b, t, h, c);
          }
    check_within_rule(g.dq, g_mha.dq, DType::F64, Quantity::Gradient, "GQA dQ vs MHA");
    check_within_rule(g.dk, dk_summed, DType::F64, Quantity::Gradient, "GQA dK vs MHA summed over the group");
    check_within_rule(g.dv, dv_summed, DType::F64, Quantity::Gradient, "GQA dV vs MHA summed over the group");
  }
}

TEST_CASE("naive gradients in double equal central finite differences of sum(O * dO)") {
  // The loss is smooth in Q, K, V for a fixed dropout mask, so every mode can be checked.
  struct Mode {
    const char* name;
    CausalAlign causal;
    double dropout_p;
    Shape s;
  };
  const std::vector<Mode> modes = {
      {.name = "plain",
       .causal = CausalAlign::None,
       .dropout_p = 0.0,
       .s = {.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 5, .seq_k = 7, .head_dim = 3}},
      {.name = "bottom-right causal, seq_q > seq_k",
       .causal = CausalAlign::BottomRight,
       .dropout_p = 0.0,
       .s = {.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 7, .seq_k = 4, .head_dim = 3}},
      {.name = "top-left causal with dropout",
       .causal = CausalAlign::TopLeft,
       .dropout_p = 0.3,
       .s = {.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 6, .seq_k = 6, .head_dim = 3}},
  };
  for (const Mode& m : modes) {
    CAPTURE(m.name);
    Problem p = make_problem(m.s, m.causal, m.dropout_p);
    p.options.scale = 0.7;  // a non-default scale, so a missing tau in any gradient shows
    Qkv in = random_qkv(m.s, DType::F64, kInputSeed);
    const HostTensor dO = random_like_o(m.s, DType::F64, kInputSeed + 1);
    const Grads g = naive_backward<double>(p, in, naive_forward<double>(p, in), dO);
    auto loss = [&](const Qkv& x) {
      const ForwardOut f = naive_forward<double>(p, x);
      double sum = 0;
      for (std::size_t n = 0; n < f.o.data.size(); ++n) sum += f.o.data[n] * dO.data[n];
      return sum;
    };
    constexpr double kStep = 1e-5;
    auto finite_difference = [&](HostTensor Qkv::*tensor) {
      HostTensor grad((in.*tensor).dims);
      for (std::size_t n = 0; n < grad.data.size(); ++n) {
        const double saved = (in.*tensor).data[n];
        (in.*tensor).data[n] = saved + kStep;
        const double up = loss(in);
        (in.*tensor).data[n] = saved - kStep;
        const double down = loss(in);
        (in.*tensor).data[n] = saved;
        grad.data[n] = (up - down) / (2 * kStep);
      }
      return grad;
    };
    // Central differences are accurate to O(step^2) plus rounding ~ 1e-16 / step: about 1e-9 here.
    constexpr double kFiniteDifferenceRel = 1e-7;
    for (auto [name, tensor, analytic] : {std::tuple{"dQ", &Qkv::q, &g.dq}, std::tuple{"dK", &Qkv::k, &g.dk},
                                           std::tuple{"dV", &Qkv::v, &g.dv}}) {
      const ErrorStats e = compare(*analytic, finite_difference(tensor));
      INFO(name, ": rel = ", e.rel);
      CHECK(e.rel < kFiniteDifferenceRel);
    }
  }
}

TEST_CASE("dropout: the three CPU variants drop the same elements and give the same results") {
  const std::vector<Problem> problems = {
      make_problem({.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 45, .seq_k = 37, .head_dim = 8},
                   CausalAlign::None, 0.2),
      make_problem({.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 33, .seq_k = 52, .head_dim = 16},
                   CausalAlign::BottomRight, 0.5)};
  for (const Problem& p : problems) {
    CAPTURE(describe(p, "problem"));
    const Qkv in = random_qkv(p.shape, DType::F64, kInputSeed);
    const HostTensor dO = random_like_o(p.shape, DType::F64, kInputSeed + 1);
    const ForwardOut ref = cpu_naive_forward(p, DType::F64, in, nullptr);
    const Grads gref = cpu_naive_backward(p, DType::F64, in, ref, dO);
    // Without dropout the output differs: the mask really is applied.
    Problem no_dropout = p;
    no_dropout.options.dropout_p = 0;
    CHECK(compare(naive_forward<double>(no_dropout, in).o, ref.o).rel > 1e-3);
    int compared = 0;
    for (const Variant& v : variants()) {
      if (v.device != Device::Cpu) continue;
      CAPTURE(v.name);
      const ForwardOut f = v.forward(p, DType::F64, in, nullptr);
      const Grads g = v.backward(p, DType::F64, in, f, dO);
      check_within_rule(f.o, ref.o, DType::F64, Quantity::Forward, v.name + " O");
      check_within_rule(f.lse, ref.lse, DType::F64, Quantity::Forward, v.name + " LSE");
      check_within_rule(g.dq, gref.dq, DType::F64, Quantity::Gradient, v.name + " dQ");
      check_within_rule(g.dk, gref.dk, DType::F64, Quantity::Gradient, v.name + " dK");
      check_within_rule(g.dv, gref.dv, DType::F64, Quantity::Gradient, v.name + " dV");
      ++compared;
    }
    CHECK(compared == 3);
  }
}

TEST_CASE("dropout drops elements of P at rate p and scales the kept ones by 1 / (1 - p)") {
  // With Q = 0, P is uniform (1 / S_k), and with V = I (d = S_k) the output row is the dropped-out
  // P row itself: O[r, c] = 0 where the element was dropped and 1 / (S_k (1 - p)) where kept.
  constexpr double kP = 0.2;
  const Shape s{.batch = 2, .heads_q = 4, .heads_kv = 4, .seq_q = 256, .seq_k = 64, .head_dim = 64};
  const Problem p = make_problem(s, CausalAlign::None, kP);
  Qkv in{HostTensor(q_dims(s)), HostTensor(kv_dims(s)), HostTensor(kv_dims(s))};
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < s.seq_k; ++t)
      for (int h = 0; h < s.heads_kv; ++h) in.v.at(b, t, h, t) = 1.0;
  const double kept_value = 1.0 / (s.seq_k * (1.0 - kP));
  const double n = static_cast<double>(in.q.numel());
  const double sigma = std::sqrt(kP * (1 - kP) / n);
  for (const char* name : {"cpu-naive", "cpu-fa1", "cpu-fa2"}) {
    CAPTURE(name);
    const ForwardOut f = find_variant(name).forward(p, DType::F64, in, nullptr);
    std::int64_t dropped = 0, kept_exactly = 0;
    for (double x : f.o.data) {
      dropped += x == 0.0;
      kept_exactly += std::abs(x - kept_value) <= 1e-14;
    }
    const double rate = dropped / n;
    INFO("measured drop rate ", rate, " over ", n, " elements, p = ", kP, ", sigma = ", sigma);
    CHECK(std::abs(rate - kP) < 5 * sigma);
    CHECK(dropped + kept_exactly == in.q.numel());
  }
}

TEST_CASE("float variants pass the tolerance rule against naive in double") {
  const std::vector<Problem> problems = {
      make_problem({.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 67, .seq_k = 45, .head_dim = 64}),
      make_problem({.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 50, .seq_k = 80, .head_dim = 32},
                   CausalAlign::BottomRight, 0.1),
      make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 80, .seq_k = 50, .head_dim = 128},
                   CausalAlign::TopLeft)};
  for (const Problem& p : problems) {
    CAPTURE(describe(p, "problem"));
    const Qkv in = random_qkv(p.shape, DType::F32, kInputSeed);  // inputs rounded to f32 once
    const HostTensor dO = random_like_o(p.shape, DType::F32, kInputSeed + 1);
    const ForwardOut ref = naive_forward<double>(p, in);
    const Grads gref = naive_backward<double>(p, in, ref, dO);
    for (const Variant& v : variants()) {
      if (v.device != Device::Cpu) continue;
      CAPTURE(v.name);
      const ForwardOut f = v.forward(p, DType::F32, in, nullptr);
      const Grads g = v.backward(p, DType::F32, in, f, dO);
      check_within_rule(f.o, ref.o, DType::F32, Quantity::Forward, v.name + " O");
      check_within_rule(f.lse, ref.lse, DType::F32, Quantity::Forward, v.name + " LSE");
      check_within_rule(g.dq, gref.dq, DType::F32, Quantity::Gradient, v.name + " dQ");
      check_within_rule(g.dk, gref.dk, DType::F32, Quantity::Gradient, v.name + " dK");
      check_within_rule(g.dv, gref.dv, DType::F32, Quantity::Gradient, v.name + " dV");
      // Really computed in float: not bit-identical to double.
      CHECK(compare(f.o, ref.o).rel > 0);
    }
  }
}

TEST_CASE("low-precision naive rounds its outputs to the dtype and errs more than float") {
  const Problem p = make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 40, .seq_k = 40, .head_dim = 32},
                                 CausalAlign::TopLeft);
  for (const DType dtype : {DType::F16, DType::BF16}) {
    CAPTURE(to_string(dtype));
    const Qkv in = random_qkv(p.shape, dtype, kInputSeed);
    const HostTensor dO = random_like_o(p.shape, dtype, kInputSeed + 1);
    const ForwardOut ref = naive_forward<double>(p, in);
    const Grads gref = naive_backward<double>(p, in, ref, dO);
    const ForwardOut low = naive_forward_lowp(p, dtype, in);
    const Grads glow = naive_backward_lowp(p, dtype, in, low, dO);
    const ForwardOut f32 = naive_forward<float>(p, in);
    for (const HostTensor* t : {&low.o, &glow.dq, &glow.dk, &glow.dv}) {
      HostTensor rounded = *t;
      round_to(rounded, dtype);
      CHECK(rounded.data == t->data);  // every element is representable in dtype
    }
    const ErrorStats e = compare(low.o, ref.o);
    CHECK_FALSE(e.has_nan);
    CHECK(e.max_abs > 10 * compare(f32.o, ref.o).max_abs);
    // ... yet it is still attention: a few units of the dtype's epsilon, not garbage.
    const double eps = dtype == DType::F16 ? 1.0 / 1024 : 1.0 / 128;
    CHECK(e.rel < 10 * eps);
    CHECK(compare(glow.dq, gref.dq).rel < 20 * eps);
    CHECK(compare(glow.dk, gref.dk).rel < 20 * eps);
    CHECK(compare(glow.dv, gref.dv).rel < 20 * eps);
  }
  CHECK_THROWS_AS(naive_forward_lowp(p, DType::F32, random_qkv(p.shape, DType::F32, 1)), InputError);
}

TEST_CASE("naive_extra_bytes counts S and P (and dP, dS) of one head") {
  const Shape s{.batch = 2, .heads_q = 8, .heads_kv = 8, .seq_q = 1000, .seq_k = 3000, .head_dim = 64};
  CHECK(naive_extra_bytes(s, 4, false) == 2LL * 1000 * 3000 * 4);
  CHECK(naive_extra_bytes(s, 8, true) == 4LL * 1000 * 3000 * 8);
  // 4 x 2^31 x 2^31 x 8 bytes = 2^67 does not fit in 64 bits: it saturates, never wraps to a small size.
  const Shape absurd{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 1 << 30, .seq_k = 1 << 30, .head_dim = 8};
  CHECK(naive_extra_bytes(absurd, 8, true) == std::numeric_limits<std::int64_t>::max());
}

TEST_CASE("bad input is an InputError with one sentence") {
  const Problem p = make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 16, .seq_k = 16, .head_dim = 8});
  const Qkv in = random_qkv(p.shape, DType::F64, 1);
  SUBCASE("cpu-naive refuses, before allocating, a problem whose S and P cannot fit in memory") {
    const Problem huge = make_problem({.batch = 1,
                                       .heads_q = 1,
                                       .heads_kv = 1,
                                       .seq_q = 1 << 22,
                                       .seq_k = 1 << 22,
                                       .head_dim = 8});  // S and P: 2^45 floats, 128 TiB
    try {
      cpu_naive_forward(huge, DType::F32, in, nullptr);
      FAIL("no InputError");
    } catch (const InputError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(std::to_string(naive_extra_bytes(huge.shape, 4, false))) != std::string::npos);
      CHECK(msg.find("available") != std::string::npos);
    }
    CHECK_THROWS_AS(cpu_naive_backward(huge, DType::F64, in, ForwardOut{}, in.q), InputError);
  }
  SUBCASE("CPU variants compute in f64 or f32 only") {
    for (const char* name : {"cpu-naive", "cpu-fa1", "cpu-fa2"})
      CHECK_THROWS_AS(find_variant(name).forward(p, DType::F16, in, nullptr), InputError);
  }
  SUBCASE("non-positive block sizes") {
    CHECK_THROWS_AS(tiled_forward<double>(Algorithm::FA2, p, in, Tiling{.Br = 0, .Bc = 16}), InputError);
    CHECK_THROWS_AS(tiled_forward<double>(Algorithm::FA1, p, in, Tiling{.Br = 16, .Bc = -1}), InputError);
  }
  SUBCASE("standard attention has no tiled nest") {
    CHECK_THROWS_AS(tiled_forward<double>(Algorithm::Standard, p, in, Tiling{.Br = 8, .Bc = 8}), InputError);
    CHECK_THROWS_AS(tiled_backward<double>(Algorithm::Standard, p, in, naive_forward<double>(p, in), in.q, Tiling{.Br = 8, .Bc = 8}),
                    InputError);
  }
  SUBCASE("mismatched shapes") {
    Qkv wrong = in;
    wrong.k = HostTensor({1, 15, 2, 8});
    CHECK_THROWS_AS(tiled_forward<double>(Algorithm::FA2, p, wrong, Tiling{.Br = 8, .Bc = 8}), InputError);
    CHECK_THROWS_AS(naive_forward<double>(p, wrong), InputError);
    const ForwardOut f = naive_forward<double>(p, in);
    CHECK_THROWS_AS(tiled_backward<double>(Algorithm::FA2, p, in, f, HostTensor({1, 16, 2, 4}), Tiling{.Br = 8, .Bc = 8}),
                    InputError);
    CHECK_THROWS_AS(tiled_backward<double>(Algorithm::FA1, p, in, ForwardOut{}, in.q, Tiling{.Br = 8, .Bc = 8}), InputError);
  }
}

// With one key every row's P is 1 and dS = P o (dP - D) cancels: dQ and dK are exactly zero, and so is the error of
// naive attention in any precision (its D = rowsum(P o dP) cancels exactly). A kernel's D = rowsum(dO o O) cancels
// to fp32 roundoff only, so the rule judges such a gradient at the scale of the case's other gradients.
TEST_CASE("an exactly-zero gradient (one key) is judged at the scale of the case's gradients, not at zero") {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 200, .seq_k = 1, .head_dim = 64};
  for (const DType dtype : {DType::F32, DType::BF16}) {
    CAPTURE(to_string(dtype));
    const Reference r = seeded_reference(p, dtype, /*backward=*/true);
    double dk_max = 0, dv_max = 0;
    for (double x : r.grads.dk.data) dk_max = std::max(dk_max, std::abs(x));
    for (double x : r.grads.dv.data) dv_max = std::max(dv_max, std::abs(x));
    REQUIRE(dk_max == 0.0);  // the premise: dK is exactly zero
    REQUIRE(dv_max > 1.0);   // while dV, a sum over 200 queries, is not
    HostTensor roundoff = r.grads.dk, wrong = r.grads.dk;
    for (std::size_t n = 0; n < roundoff.data.size(); ++n) {
      roundoff.data[n] = (n % 2 ? 1 : -1) * 2e-5;  // over 1e-5 absolute: failed before, as fp32 roundoff does
      wrong.data[n] = (n % 2 ? 1 : -1) * 5e-2 * dv_max;  // a real error at the case's scale
    }
    CHECK(check_output("dK", roundoff, r.grads.dk, Quantity::Gradient, dtype, r).passes());
    CHECK_FALSE(check_output("dK", wrong, r.grads.dk, Quantity::Gradient, dtype, r).passes());
    // A gradient that is not zero keeps its own scale.
    HostTensor dv = r.grads.dv;
    dv.data[0] += 5e-2 * dv_max;
    CHECK_FALSE(check_output("dV", dv, r.grads.dv, Quantity::Gradient, dtype, r).passes());
  }
}
