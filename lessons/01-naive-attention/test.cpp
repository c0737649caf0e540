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
#include "model/traffic.hpp"
#include "lesson.hpp"

using namespace flashlab;
namespace lesson = flashlab::lesson01;

namespace {

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, D) row-major arrays.
Problem one_head(int seq_q, int seq_k, int d, double scale = 0.0) {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
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

// Every diagnose_* function returns "" when your result is right, else plain words saying what is
// wrong and where to look; the test cases CHECK that it is empty.

// Your naive_attention against naive_forward<double>, under the project's tolerance rule (f64:
// relative error <= 1e-12).
std::string diagnose_attention(const Problem& p, const Qkv& in) {
  const Shape& s = p.shape;
  const std::vector<double> o = lesson::naive_attention(in.q.data, in.k.data, in.v.data, s.seq_q, s.seq_k,
                                                        s.head_dim, p.softmax_scale());
  const HostTensor ref = naive_forward<double>(p, in).o;
  std::ostringstream why;
  if (o.size() != ref.data.size()) {
    why << "your naive_attention returned " << o.size() << " numbers; O is (seq_q, d) = " << ref.data.size()
        << " numbers";
    return why.str();
  }
  if (!all_finite(o))
    return "your O contains inf or NaN: the softmax must subtract the row max before exp() (and then "
           "divide by the row sum, which is >= 1)";
  if (all_zero(o))
    return "your O is all zeros: fill S = scale * Q K^T (TODO 2), softmax its rows (TODO 3) and "
           "accumulate O = P V (TODO 4)";
  const ErrorStats err = compare(as_o_tensor(s, o), ref);
  const Bound bound = tolerance(DType::F64, Quantity::Forward, err, nullptr);
  if (bound.passes(err)) return "";

  // Is it the reference computed without the scale?
  Problem unscaled = p;
  unscaled.options.scale = 1.0;
  const ErrorStats err_unscaled = compare(as_o_tensor(s, o), naive_forward<double>(unscaled, in).o);
  if (p.softmax_scale() != 1.0 && bound.passes(err_unscaled))
    return "your O is attention WITHOUT the scale: S must be scale * Q K^T (scale = 1/sqrt(d) by default), "
           "which keeps the scores' spread independent of d";
  std::size_t worst = 0;
  for (std::size_t n = 0; n < o.size(); ++n)
    if (std::abs(o[n] - ref.data[n]) > std::abs(o[worst] - ref.data[worst])) worst = n;
  const auto d = static_cast<std::size_t>(s.head_dim);
  why << "your O differs from the reference: relative error " << err.rel << " (allowed: " << bound.rule
      << "); worst at O[" << worst / d << "][" << worst % d << "] = " << o[worst] << ", expected "
      << ref.data[worst]
      << ". Check that S[i][j] uses row i of Q and row j of K (K[j * d + k]), that each row of P sums "
         "to 1, and that O[i][k] sums P[i][j] * V[j][k] over j";
  return why.str();
}

// Softmax of arbitrary scores through the project's reference: with K = I (seq_k = d rows of the
// identity), V = I and scale 1, S = Q and O = P, so naive_forward's O is exactly softmax(Q's row).
std::vector<double> reference_softmax(const std::vector<double>& scores) {
  const int n = static_cast<int>(scores.size());
  const Problem p = one_head(1, n, n, 1.0);
  Qkv in{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape)), HostTensor(kv_dims(p.shape))};
  in.q.data = scores;
  for (int j = 0; j < n; ++j) in.k.at(0, j, 0, j) = in.v.at(0, j, 0, j) = 1.0;
  return naive_forward<double>(p, in).o.data;
}

// A softmax row's entries are in (0, 1] and sum to 1: a few units of double rounding (2.2e-16) is all
// a correct one can be off by, in each entry and in the sum.
constexpr double kSoftmaxEntrySlack = 1e-14;
constexpr double kSoftmaxSumSlack = 1e-12;

std::string diagnose_softmax(const std::vector<double>& scores) {
  std::vector<double> row = scores;
  lesson::softmax_row(row);
  const std::vector<double> ref = reference_softmax(scores);
  if (row == scores && scores != ref) return "your softmax_row left the scores unchanged (TODO 1)";
  if (!all_finite(row))
    return "your softmax produced inf or NaN: exp(1000) overflows to inf, and exp(-1000) underflows to "
           "0 so that l = 0 and p = 0 / 0. Subtract the row max m first: exp(s - m) is in (0, 1] and l >= 1";
  std::ostringstream why;
  double sum = 0;
  for (double p : row) sum += p;
  if (std::abs(sum - 1.0) > kSoftmaxSumSlack) {
    why << "your softmax row sums to " << sum
        << ", not 1: divide every exp(s_j - m) by their sum l = sum_k exp(s_k - m)";
    return why.str();
  }
  for (std::size_t j = 0; j < row.size(); ++j)
    if (std::abs(row[j] - ref[j]) > kSoftmaxEntrySlack) {
      why << "your softmax gives p[" << j << "] = " << row[j] << ", the reference " << ref[j]
          << ": each p_j must be exp(s_j - m) / l with the SAME m and l for the whole row";
      return why.str();
    }
  return "";
}

// The reference's traffic for standard attention on one head: a count-only walk of its loop nest.
TrafficTotals reference_traffic(const Problem& p, Tiling tiling, int bytes_per_element) {
  TrafficCounter counter;
  count_traffic(Algorithm::Standard, Pass::Forward, p, tiling, bytes_per_element, counter);
  return counter.totals();
}

std::int64_t read_of(const TrafficTotals& t, TensorId id) { return t.read[static_cast<int>(id)]; }
std::int64_t written_of(const TrafficTotals& t, TensorId id) { return t.written[static_cast<int>(id)]; }

// Your counts against the reference's, field by field: one line per wrong field.
std::string diagnose_traffic(const lesson::StandardTraffic& t, const TrafficTotals& ref) {
  struct Field {
    const char* name;
    std::int64_t yours, reference;
    const char* rule;
  };
  const Field fields[] = {
      {"Q read", t.read_Q, read_of(ref, TensorId::Q), "step 1 loads each block Q_i, (Br, d), once"},
      {"K read", t.read_K, read_of(ref, TensorId::K),
       "step 1 loads all of K, (seq_k, d), for EACH of the Tr = ceil(seq_q / Br) query blocks"},
      {"S written", t.written_S, written_of(ref, TensorId::S), "step 1 writes all of S, (seq_q, seq_k), once"},
      {"S read", t.read_S, read_of(ref, TensorId::S), "step 2 reads all of S back, once"},
      {"P written", t.written_P, written_of(ref, TensorId::P), "step 2 writes all of P, (seq_q, seq_k), once"},
      {"P read", t.read_P, read_of(ref, TensorId::P), "step 3 reads all of P back, once"},
      {"V read", t.read_V, read_of(ref, TensorId::V),
       "step 3 loads all of V, (seq_k, d), for EACH of the Tr = ceil(seq_q / Br) query blocks"},
      {"O written", t.written_O, written_of(ref, TensorId::O), "step 3 writes O, (seq_q, d), once"},
      {"total", t.total(), ref.total(), "the sum of the eight transfers above (nothing else moves)"},
  };
  std::ostringstream why;
  for (const Field& f : fields)
    if (f.yours != f.reference)
      why << "\n  your " << f.name << " is " << f.yours << " bytes, the reference counts " << f.reference
          << ": " << f.rule;
  const std::string lines = why.str();
  return lines.empty() ? "" : "your byte counts differ from the reference's:" + lines;
}

}  // namespace

TEST_CASE("lesson 01: softmax_row is the safe softmax of the row") {
  struct Case {
    std::vector<double> scores;
    std::string what;
  };
  const Case cases[] = {
      {.scores = {0.5}, .what = "a single score (its softmax is 1)"},
      {.scores = {1.0, 2.0, 3.0, -1.0}, .what = "small scores"},
      {.scores = {0.25, 0.25, 0.25}, .what = "equal scores (1/3 each)"},
      {.scores = {1000.0, 1001.0, 1002.0, 999.5}, .what = "large scores near 1000"},
      {.scores = {-1000.0, -1001.0, -999.0}, .what = "very negative scores near -1000"},
  };
  for (const Case& c : cases) {
    INFO("scores: " << c.what);
    const std::string mistake = diagnose_softmax(c.scores);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 01: naive_attention equals the reference naive_forward<double>") {
  SUBCASE("random inputs, assorted shapes") {
    struct Case {
      int seq_q, seq_k, d;
      std::string what;
    };
    const Case cases[] = {
        {.seq_q = 1, .seq_k = 1, .d = 1, .what = "one query, one key"},
        {.seq_q = 5, .seq_k = 7, .d = 3, .what = "seq_q < seq_k"},
        {.seq_q = 9, .seq_k = 4, .d = 8, .what = "seq_q > seq_k"},
        {.seq_q = 16, .seq_k = 16, .d = 16, .what = "square"},
        {.seq_q = 33, .seq_k = 17, .d = 64, .what = "odd lengths, d = 64"},
        {.seq_q = 3, .seq_k = 50, .d = 2, .what = "many keys per query"},
    };
    std::uint64_t seed = 101;
    for (const Case& c : cases) {
      const std::uint64_t case_seed = seed++;
      INFO(c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d
                  << ", input seed " << case_seed);
      const Problem p = one_head(c.seq_q, c.seq_k, c.d);
      const std::string mistake = diagnose_attention(p, random_qkv(p.shape, DType::F64, case_seed));
      CHECK_MESSAGE(mistake.empty(), mistake);
    }
  }
  SUBCASE("an explicit scale, 0.3") {
    const Problem p = one_head(6, 6, 4, 0.3);
    const std::string mistake = diagnose_attention(p, random_qkv(p.shape, DType::F64, 7));
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
  SUBCASE("large scores, where only the safe softmax survives") {
    // Q and K times 30: scores of order 30 * 30 * sqrt(d) * scale = 900, and exp(900) overflows.
    const Problem p = one_head(8, 12, 16);
    Qkv in = random_qkv(p.shape, DType::F64, 11);
    for (double& x : in.q.data) x *= 30.0;
    for (double& x : in.k.data) x *= 30.0;
    const std::string mistake = diagnose_attention(p, in);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 01: standard_attention_traffic matches the reference's count of Algorithm 0") {
  struct Case {
    int seq_q, seq_k, d;
    Tiling tiling;
    int bytes;
    std::string what;
  };
  const Case cases[] = {
      {.seq_q = 128, .seq_k = 128, .d = 64, .tiling = {.Br = 64, .Bc = 64}, .bytes = 2, .what = "exact blocks"},
      {.seq_q = 1000,
       .seq_k = 1000,
       .d = 64,
       .tiling = {.Br = 64, .Bc = 32},
       .bytes = 2,
       .what = "a ragged last query block (1000 = 15 * 64 + 40)"},
      {.seq_q = 512, .seq_k = 2048, .d = 128, .tiling = {.Br = 100, .Bc = 50}, .bytes = 4, .what = "seq_q < seq_k"},
      {.seq_q = 37, .seq_k = 5, .d = 16, .tiling = {.Br = 8, .Bc = 4}, .bytes = 8, .what = "seq_q > seq_k"},
      {.seq_q = 4096,
       .seq_k = 4096,
       .d = 64,
       .tiling = tiling_from_sram(std::int64_t{100} * 1024, 64, 2),
       .bytes = 2,
       .what = "blocks from a 100 KiB SRAM by the paper's rule, as in `flashlab trace --sram-bytes 102400`"},
  };
  for (const Case& c : cases) {
    INFO(c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d
                << ", Br = " << c.tiling.Br << ", bytes_per_element = " << c.bytes);
    const TrafficTotals ref = reference_traffic(one_head(c.seq_q, c.seq_k, c.d), c.tiling, c.bytes);
    const std::string mistake = diagnose_traffic(
        lesson::standard_attention_traffic(c.seq_q, c.seq_k, c.d, c.tiling.Br, c.bytes), ref);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 01: standard attention's traffic grows as N^2, and S and P are most of it") {
  // On your formula: doubling N doubles the N d terms and quadruples the N^2 ones (S and P, and the
  // Tr-fold re-reads of K and V), so the ratio tends to 4. With Br = d, S and P are 4 N^2 of the
  // 2 N d + 6 N^2 elements.
  constexpr int kD = 64, kBr = 64, kBytes = 2;
  const lesson::StandardTraffic small = lesson::standard_attention_traffic(1024, 1024, kD, kBr, kBytes);
  const lesson::StandardTraffic big = lesson::standard_attention_traffic(16384, 16384, kD, kBr, kBytes);
  const lesson::StandardTraffic twice = lesson::standard_attention_traffic(32768, 32768, kD, kBr, kBytes);
  REQUIRE_MESSAGE(small.total() > 0, "your standard_attention_traffic returns 0 bytes (TODO 5)");
  const double growth = double(twice.total()) / double(big.total());
  CHECK_MESSAGE(growth > 3.9, "doubling N from 16k to 32k multiplied your total by " << growth
                                  << "; with S and P of N^2 elements it must approach 4");
  const std::int64_t scores = big.read_S + big.written_S + big.read_P + big.written_P;
  CHECK_MESSAGE(scores > big.total() - scores,
                "at N = 16k, d = Br = 64 your S and P move " << scores << " bytes and everything else "
                    << big.total() - scores << "; S and P are 4 N^2 elements, Q, K, V, O 2 N d + 2 N^2");
}

TEST_CASE("lesson 01: standard_attention_extra_bytes is S plus P (the reference's naive_extra_bytes)") {
  struct Case {
    int seq_q, seq_k, bytes;
  };
  const Case cases[] = {{.seq_q = 1, .seq_k = 1, .bytes = 8},
                        {.seq_q = 1024, .seq_k = 1024, .bytes = 2},
                        {.seq_q = 4096, .seq_k = 512, .bytes = 4},
                        {.seq_q = 32768, .seq_k = 32768, .bytes = 2}};
  for (const Case& c : cases) {
    INFO("seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", bytes_per_element = " << c.bytes);
    const std::int64_t ref = naive_extra_bytes(one_head(c.seq_q, c.seq_k, 64).shape, c.bytes, false);
    const std::int64_t yours = lesson::standard_attention_extra_bytes(c.seq_q, c.seq_k, c.bytes);
    CHECK_MESSAGE(yours == ref, "your extra memory is " << yours << " bytes, the reference's " << ref
                                    << ": standard attention keeps S and P, each seq_q x seq_k elements, "
                                       "beside its inputs and output");
  }
}
