// Lesson 01's test: your softmax_row, naive_attention, standard_attention_traffic and
// standard_attention_extra_bytes (lesson.hpp) against the project's reference implementation
// (src/cpu_reference: naive_forward<double>, count_traffic, naive_extra_bytes). A failure says in
// plain words what is wrong and where to look.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/tiled.hpp"
#include "cpu_reference/traffic.hpp"
#include "lesson.hpp"

using namespace flashlab;
namespace lesson = flashlab::lesson01;

namespace {

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, D) row-major arrays.
Problem one_head(int seq_q, int seq_k, int d, double scale = 0.0) {
  Problem p;
  p.shape = Shape{1, 1, 1, seq_q, seq_k, d};
  p.options.scale = scale;  // 0: the default 1/sqrt(d)
  return p;
}

HostTensor as_o_tensor(const Shape& s, const std::vector<double>& o) {
  HostTensor t(q_dims(s));
  if (o.size() == t.data.size()) t.data = o;
  return t;
}

bool all_finite(const std::vector<double>& x) {
  for (double v : x)
    if (!std::isfinite(v)) return false;
  return true;
}

bool all_zero(const std::vector<double>& x) {
  for (double v : x)
    if (v != 0.0) return false;
  return true;
}

// Your naive_attention on the problem's inputs.
std::vector<double> learner_o(const Problem& p, const Qkv& in) {
  const Shape& s = p.shape;
  return lesson::naive_attention(in.q.data, in.k.data, in.v.data, s.seq_q, s.seq_k, s.head_dim,
                                 p.softmax_scale());
}

// Checks your O against naive_forward<double> under the project's tolerance rule (f64: rel <= 1e-12)
// and, when they differ, names the likely mistake.
void check_against_reference(const Problem& p, const Qkv& in) {
  const Shape& s = p.shape;
  const std::vector<double> o = learner_o(p, in);
  const HostTensor ref = naive_forward<double>(p, in).o;
  INFO("shape: seq_q = " << s.seq_q << ", seq_k = " << s.seq_k << ", d = " << s.head_dim
                         << ", scale = " << p.softmax_scale());
  if (o.size() != ref.data.size()) {
    FAIL_CHECK("your naive_attention returned " << o.size() << " numbers; O is (seq_q, d) = "
                                                << ref.data.size() << " numbers");
    return;
  }
  if (!all_finite(o)) {
    FAIL_CHECK("your O contains inf or NaN: the softmax must subtract the row max before exp() "
               "(and divide by the row sum, which is >= 1 after that)");
    return;
  }
  if (all_zero(o)) {
    FAIL_CHECK("your O is all zeros: fill S = scale * Q K^T (TODO 2), softmax its rows (TODO 3) and "
               "accumulate O = P V (TODO 4)");
    return;
  }
  const ErrorStats err = compare(as_o_tensor(s, o), ref);
  const Bound bound = tolerance(DType::F64, Quantity::Forward, err, nullptr);
  if (bound.passes(err)) return;

  // Diagnose: is it the reference computed without the scale?
  Problem unscaled = p;
  unscaled.options.scale = 1.0;
  const ErrorStats err_unscaled = compare(as_o_tensor(s, o), naive_forward<double>(unscaled, in).o);
  if (p.softmax_scale() != 1.0 && bound.passes(err_unscaled)) {
    FAIL_CHECK("your O is attention WITHOUT the scale: S must be scale * Q K^T (scale = 1/sqrt(d) "
               "by default), which keeps the scores' spread independent of d");
    return;
  }
  std::size_t worst = 0;
  for (std::size_t n = 0; n < o.size(); ++n)
    if (std::abs(o[n] - ref.data[n]) > std::abs(o[worst] - ref.data[worst])) worst = n;
  const auto d = static_cast<std::size_t>(s.head_dim);
  FAIL_CHECK("your O differs from the reference: relative error " << err.rel << " (allowed: "
             << bound.rule << "); worst at O[" << worst / d << "][" << worst % d << "] = "
             << o[worst] << ", expected " << ref.data[worst]
             << ". Check that S[i][j] uses row i of Q and row j of K (K[j * d + k], not K^T's "
                "layout), that each row of P sums to 1, and that O[i][k] sums P[i][j] * V[j][k] "
                "over j");
}

// Softmax of arbitrary scores through the project's reference: with K = I (seq_k = d rows of the
// identity), V = I and scale 1, S = Q and O = P, so naive_forward's O is exactly softmax(Q's rows).
std::vector<double> reference_softmax(const std::vector<double>& scores) {
  const int n = static_cast<int>(scores.size());
  const Problem p = one_head(1, n, n, 1.0);
  Qkv in{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape)), HostTensor(kv_dims(p.shape))};
  in.q.data = scores;
  for (int j = 0; j < n; ++j) in.k.at(0, j, 0, j) = in.v.at(0, j, 0, j) = 1.0;
  return naive_forward<double>(p, in).o.data;
}

void check_softmax(const std::vector<double>& scores, const std::string& what) {
  INFO("scores: " << what);
  std::vector<double> row = scores;
  lesson::softmax_row(row);
  const std::vector<double> ref = reference_softmax(scores);
  if (!all_finite(row)) {
    FAIL_CHECK("your softmax produced inf or NaN: exp() of a large score overflows (exp(710) is "
               "already inf in double). Subtract the row max m first: exp(s - m) <= 1");
    return;
  }
  double sum = 0;
  for (double p : row) sum += p;
  if (std::abs(sum - 1.0) > 1e-12) {
    FAIL_CHECK("your softmax row sums to " << sum << ", not 1: divide every exp(s_j - m) by their "
               "sum l = sum_k exp(s_k - m)");
    return;
  }
  for (std::size_t j = 0; j < row.size(); ++j)
    if (std::abs(row[j] - ref[j]) > 1e-14) {
      FAIL_CHECK("your softmax gives p[" << j << "] = " << row[j] << ", the reference " << ref[j]
                 << ": each p_j must be exp(s_j - m) / l with the SAME m and l for the whole row");
      return;
    }
}

// The reference's traffic for standard attention on one head (count-only walk of its loop nest).
TrafficTotals reference_traffic(const Problem& p, int bytes_per_element) {
  // Standard attention has no tiles to size; any valid tiling will do for its count.
  const Tiling tiling = tiling_from_sram(std::int64_t{100} * 1024, p.shape.head_dim, bytes_per_element);
  TrafficCounter counter;
  count_traffic(Algorithm::Standard, Pass::Forward, p, tiling, bytes_per_element, counter);
  return counter.totals();
}

std::int64_t read_of(const TrafficTotals& t, TensorId id) { return t.read[static_cast<int>(id)]; }
std::int64_t written_of(const TrafficTotals& t, TensorId id) { return t.written[static_cast<int>(id)]; }

void check_bytes(const char* what, std::int64_t yours, std::int64_t reference, const char* hint) {
  if (yours != reference)
    FAIL_CHECK("your " << what << " is " << yours << " bytes, the reference counts " << reference
                       << ": " << hint);
}

}  // namespace

TEST_CASE("lesson 01: softmax_row is the safe softmax of the row") {
  check_softmax({0.5}, "a single score (its softmax is 1)");
  check_softmax({1.0, 2.0, 3.0, -1.0}, "small scores");
  check_softmax({0.25, 0.25, 0.25}, "equal scores (uniform 1/3 each)");
  check_softmax({1000.0, 1001.0, 1002.0, 999.5}, "large scores near 1000");
  check_softmax({-1000.0, -1001.0, -999.0}, "very negative scores near -1000");
}

TEST_CASE("lesson 01: naive_attention equals the reference naive_forward<double>") {
  struct Case {
    int seq_q, seq_k, d;
    const char* what;
  };
  const Case cases[] = {
      {1, 1, 1, "one query, one key"},     {5, 7, 3, "seq_q < seq_k"},
      {9, 4, 8, "seq_q > seq_k"},          {16, 16, 16, "square"},
      {33, 17, 64, "odd lengths, d = 64"}, {3, 50, 2, "many keys per query"},
  };
  SUBCASE("random inputs, assorted shapes") {
    std::uint64_t seed = 101;
    for (const Case& c : cases) {
      CAPTURE(c.what);
      CAPTURE(seed);
      const Problem p = one_head(c.seq_q, c.seq_k, c.d);
      check_against_reference(p, random_qkv(p.shape, DType::F64, seed++));
    }
  }
  SUBCASE("an explicit scale") {
    const Problem p = one_head(6, 6, 4, 0.3);
    check_against_reference(p, random_qkv(p.shape, DType::F64, 7));
  }
  SUBCASE("large scores, where only the safe softmax survives") {
    // Q and K times 30: scores of order 30 * 30 * sqrt(d) * scale = 900, and exp(900) overflows.
    const Problem p = one_head(8, 12, 16);
    Qkv in = random_qkv(p.shape, DType::F64, 11);
    for (double& x : in.q.data) x *= 30.0;
    for (double& x : in.k.data) x *= 30.0;
    check_against_reference(p, in);
  }
}

TEST_CASE("lesson 01: standard_attention_traffic matches the reference's count of Algorithm 0") {
  struct Case {
    int seq_q, seq_k, d, bytes;
  };
  const Case cases[] = {{128, 128, 64, 2}, {1000, 1000, 64, 2}, {512, 2048, 128, 4}, {37, 5, 16, 8}};
  for (const Case& c : cases) {
    INFO("seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d
                    << ", bytes_per_element = " << c.bytes);
    const TrafficTotals ref = reference_traffic(one_head(c.seq_q, c.seq_k, c.d), c.bytes);
    const lesson::StandardTraffic t = lesson::standard_attention_traffic(c.seq_q, c.seq_k, c.d, c.bytes);
    check_bytes("Q read", t.read_Q, read_of(ref, TensorId::Q), "step 1 loads Q, (seq_q, d), once");
    check_bytes("K read", t.read_K, read_of(ref, TensorId::K), "step 1 loads K, (seq_k, d), once");
    check_bytes("V read", t.read_V, read_of(ref, TensorId::V), "step 3 loads V, (seq_k, d), once");
    check_bytes("S written", t.written_S, written_of(ref, TensorId::S),
                "step 1 writes all of S, (seq_q, seq_k), to HBM");
    check_bytes("S read", t.read_S, read_of(ref, TensorId::S), "step 2 reads S back, all of it");
    check_bytes("P written", t.written_P, written_of(ref, TensorId::P),
                "step 2 writes all of P, (seq_q, seq_k), to HBM");
    check_bytes("P read", t.read_P, read_of(ref, TensorId::P), "step 3 reads P back, all of it");
    check_bytes("O written", t.written_O, written_of(ref, TensorId::O), "step 3 writes O, (seq_q, d)");
    check_bytes("total", t.total(), ref.total(),
                "the total is the sum of the eight transfers above (and nothing else moves)");
  }
}

TEST_CASE("lesson 01: S and P dominate the traffic as N grows (O(N^2) vs O(N d))") {
  // The shape of the formula, on your numbers: doubling N doubles the Nd terms and quadruples the
  // N^2 ones, so the ratio tends to 4; at N = 16k, d = 64, S and P are N / (N + d) > 99% of the bytes.
  constexpr int kD = 64, kBytes = 2;
  const lesson::StandardTraffic small = lesson::standard_attention_traffic(1024, 1024, kD, kBytes);
  const lesson::StandardTraffic big = lesson::standard_attention_traffic(16384, 16384, kD, kBytes);
  const lesson::StandardTraffic twice = lesson::standard_attention_traffic(32768, 32768, kD, kBytes);
  REQUIRE_MESSAGE(small.total() > 0, "your standard_attention_traffic returns 0 bytes (TODO 5)");
  const double growth = double(twice.total()) / double(big.total());
  CHECK_MESSAGE(growth > 3.9, "doubling N from 16k to 32k multiplied your total by " << growth
                                  << "; with S and P of N^2 elements it must approach 4");
  const double score_share =
      double(big.read_S + big.written_S + big.read_P + big.written_P) / double(big.total());
  CHECK_MESSAGE(score_share > 0.95, "at N = 16k, d = 64 your S and P make only "
                                        << 100 * score_share << "% of the traffic; they are 4 N^2 of "
                                        << "4 N^2 + 4 N d elements");
}

TEST_CASE("lesson 01: standard_attention_extra_bytes is S plus P (the reference's naive_extra_bytes)") {
  struct Case {
    int seq_q, seq_k, bytes;
  };
  const Case cases[] = {{1, 1, 8}, {1024, 1024, 2}, {4096, 512, 4}, {32768, 32768, 2}};
  for (const Case& c : cases) {
    INFO("seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", bytes_per_element = " << c.bytes);
    const std::int64_t ref = naive_extra_bytes(one_head(c.seq_q, c.seq_k, 64).shape, c.bytes, false);
    const std::int64_t yours = lesson::standard_attention_extra_bytes(c.seq_q, c.seq_k, c.bytes);
    CHECK_MESSAGE(yours == ref, "your extra memory is " << yours << " bytes, the reference's " << ref
                                    << ": standard attention keeps S and P, each seq_q x seq_k "
                                       "elements, beside its inputs and output");
  }
}
