// Lesson 09's test: your log_add_exp, stable_sigmoid and merge_row (lesson.hpp) against the project's
// merge (src/cpu_reference/lse_merge.hpp: stable_sigmoid, merge_attention_partial), including scores a
// thousand apart and rows that saw no key; blocks of keys merged in any order against naive attention
// over all of them (naive_forward<double>); and your ring_attention against the project's ring
// (ring_forward<double>) and naive attention, for the three layouts, 1 to 4 ranks, every causal
// alignment and unequal lengths. A failure says in plain words what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/tolerance.hpp"
#include "cpu_reference/lse_merge.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/ring.hpp"
#include "lesson.hpp"

using namespace flashlab;
namespace lesson = flashlab::lesson09;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// f64 against the double reference: the project's tolerance rule (relative error <= 1e-12).
const Bound kF64Bound = tolerance(DType::F64, Quantity::Forward, ErrorStats{}, nullptr);

// ||a - b|| / ||b||, the project's metric (core/tolerance.hpp); inf when the sizes differ or a NaN shows up.
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return kInf;
  HostTensor ta({static_cast<std::int64_t>(a.size())}), tb({static_cast<std::int64_t>(b.size())});
  ta.data = a;
  tb.data = b;
  const ErrorStats e = compare(ta, tb);
  return e.has_nan ? kInf : e.rel;
}
// Two logsumexps agree: both -inf, or both finite and within the rule.
bool same_lse(double a, double b) {
  if (std::isinf(b) || std::isinf(a)) return a == b;
  return rel_error({a}, {b}) <= kF64Bound.limit;
}
bool close(const std::vector<double>& a, const std::vector<double>& b) { return rel_error(a, b) <= kF64Bound.limit; }
// Logsumexps of many rows agree: -inf (no key seen) in the same rows, the others within the rule.
bool same_lse(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  std::vector<double> fa, fb;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return false;
      continue;
    }
    fa.push_back(a[i]);
    fb.push_back(b[i]);
  }
  return fa.empty() || close(fa, fb);
}

std::string num(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// ---- The project's merge, on one row ------------------------------------------------------------

struct Row {
  std::vector<double> o;
  double lse = lesson::kNegInf;
};

// merge_attention_partial (cpu_reference/lse_merge.hpp) on a single row: the reference for merge_row.
Row reference_merge(const Row& run, const Row& block) {
  const int d = int(run.o.size());
  detail::Mat<double> O(1, d), O_b(1, d);
  detail::Col<double> L(1), L_b(1);
  for (int k = 0; k < d; ++k) O(0, k) = run.o[k], O_b(0, k) = block.o[k];
  L(0) = run.lse;
  L_b(0) = block.lse;
  merge_attention_partial<double>(O, L, 0, O_b, L_b);
  Row out{std::vector<double>(d), L(0)};
  for (int k = 0; k < d; ++k) out.o[k] = O(0, k);
  return out;
}

Row your_merge(Row run, const Row& block) {
  lesson::merge_row(run.o, run.lse, block.o, block.lse);
  return run;
}

// ---- Inputs and naive attention -------------------------------------------------------------------

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, D) row-major arrays.
Problem one_head(int seq_q, int seq_k, int d, CausalAlign causal = CausalAlign::None) {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  p.options.causal = causal;
  return p;
}

Qkv random_qkv(int seq_q, int seq_k, int d, unsigned seed, double spread = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, spread);
  Qkv in{HostTensor({1, seq_q, 1, d}), HostTensor({1, seq_k, 1, d}), HostTensor({1, seq_k, 1, d})};
  for (HostTensor* t : {&in.q, &in.k, &in.v})
    for (double& x : t->data) x = normal(rng);
  return in;
}

// Keys [first, first + count) of `in` with all of its queries.
Qkv key_block(const Qkv& in, int first, int count, int d) {
  Qkv b{in.q, HostTensor({1, count, 1, d}), HostTensor({1, count, 1, d})};
  std::copy_n(in.k.data.begin() + std::ptrdiff_t(first) * d, std::size_t(count) * d, b.k.data.begin());
  std::copy_n(in.v.data.begin() + std::ptrdiff_t(first) * d, std::size_t(count) * d, b.v.data.begin());
  return b;
}

Row row_of(const ForwardOut& f, int row, int d) {
  return Row{std::vector<double>(f.o.data.begin() + std::ptrdiff_t(row) * d, f.o.data.begin() + std::ptrdiff_t(row + 1) * d),
             f.lse.data[std::size_t(row)]};
}

// Every diagnose_* function returns "" when your code is right, else plain words saying what is wrong
// and where to look; the test cases CHECK that it is empty.

std::string diagnose_log_add_exp() {
  // The reference: the project's merge of a row with L = a and a row with L = b leaves L = log(e^a + e^b).
  const double pairs[][2] = {{0.3, -1.2}, {-2.0, 4.5},  {7.0, 7.0},         {1000.0, 999.0}, {-1000.0, -1001.5},
                             {710.0, 700.0}, {2.5, lesson::kNegInf}, {lesson::kNegInf, 2.5},
                             {lesson::kNegInf, lesson::kNegInf}};
  for (const auto& [a, b] : pairs) {
    const double want = reference_merge(Row{{1.0}, a}, Row{{2.0}, b}).lse;
    const double got = lesson::log_add_exp(a, b);
    if (same_lse(got, want)) continue;
    std::string why = "log_add_exp(" + num(a) + ", " + num(b) + ") = " + num(got) + ", expected " + num(want) + ": ";
    if (std::isnan(got) && std::isinf(a) && std::isinf(b))
      why += "-inf - -inf is NaN; when one argument is -inf (no score at all) the answer is the other one (TODO 1)";
    else if (std::isnan(got) || std::isinf(got))
      why += "an exponential overflowed; write it as max(a, b) + log1p(exp(-|a - b|)), whose exponent is never positive";
    else if (std::isinf(a) || std::isinf(b))
      why += "a logsumexp of -inf stands for no score at all and adds nothing: the result is the other argument";
    else
      why += "it is max(a, b) + log1p(exp(-|a - b|)) (TODO 1)";
    return why;
  }
  return "";
}

std::string diagnose_sigmoid() {
  for (double x : {-800.0, -30.0, -1.0, -1e-3, 0.0, 0.5, 3.0, 30.0, 800.0}) {
    const double want = flashlab::stable_sigmoid(x), got = lesson::stable_sigmoid(x);
    if (got == want || (std::abs(got - want) <= kF64Bound.limit * std::abs(want))) continue;
    std::string why = "stable_sigmoid(" + num(x) + ") = " + num(got) + ", expected " + num(want) + ": ";
    if (std::isnan(got) || std::isinf(got))
      why += std::string("an exponential overflowed; ") +
             (x < 0 ? "for x < 0 use e^x / (1 + e^x), where e^x < 1" : "for x >= 0 use 1 / (1 + e^-x)");
    else if (x < 0 && std::abs(got - (1 - want)) <= 1e-12)
      why += "that is sigmoid(-x): sigmoid(x) = e^x / (1 + e^x) for x < 0";
    else
      why += "sigmoid(x) = 1 / (1 + e^-x) (TODO 2)";
    return why;
  }
  return "";
}

std::string diagnose_merge_rows() {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal;
  const int d = 6;
  auto random_row = [&](double lse) {
    Row r{std::vector<double>(d), lse};
    for (double& x : r.o) x = normal(rng);
    return r;
  };
  struct Case {
    double lse, lse_b;
    const char* what;
  };
  const Case cases[] = {{0.5, -0.25, "two ordinary rows"},
                        {2.0, 9.0, "a block with a much larger logsumexp"},
                        {1000.0, 1003.0, "logsumexps a thousand above zero"},
                        {-1000.0, -1003.0, "logsumexps a thousand below zero"},
                        {lesson::kNegInf, 1.5, "a running row that has seen no key yet (lse = -inf)"},
                        {1.5, lesson::kNegInf, "a block row that saw none of its keys (lse_b = -inf)"},
                        {lesson::kNegInf, lesson::kNegInf, "two rows that saw no key"}};
  for (const Case& c : cases) {
    const Row run = random_row(c.lse), block = random_row(c.lse_b);
    const Row want = reference_merge(run, block), got = your_merge(run, block);
    const bool lse_ok = same_lse(got.lse, want.lse);
    const bool o_ok = std::isinf(want.lse) && std::isinf(c.lse) ? got.o == run.o : close(got.o, want.o);
    if (lse_ok && o_ok) continue;
    std::string why = "merging " + std::string(c.what) + " (lse = " + num(c.lse) + ", lse_b = " + num(c.lse_b) + "): ";
    if (got.o == run.o && got.lse == run.lse && want.lse != run.lse)
      return why + "your merge_row left the running row unchanged (TODO 3)";
    if (!lse_ok) return why + "your lse is " + num(got.lse) + ", expected log_add_exp(lse, lse_b) = " + num(want.lse);
    if (c.lse == lesson::kNegInf) return why + "a row that has seen nothing takes the block's o_b as it is";
    if (c.lse_b == lesson::kNegInf) return why + "a block that saw no key must leave o unchanged";
    Row swapped = run;  // weights the wrong way round: sigmoid(lse - lse_b) on the block
    const double w = flashlab::stable_sigmoid(c.lse - c.lse_b);
    for (int k = 0; k < d; ++k) swapped.o[k] += w * (block.o[k] - run.o[k]);
    if (close(got.o, swapped.o)) return why + "the block's weight is sigmoid(lse_b - lse), not sigmoid(lse - lse_b)";
    bool finite = true;
    for (double x : got.o) finite = finite && std::isfinite(x);
    if (!finite) return why + "your o holds inf or NaN: form no exponential of an lse; its weight is stable_sigmoid(lse_b - lse)";
    return why + "your o is off by a relative " + num(rel_error(got.o, want.o)) +
           "; o_new = o + stable_sigmoid(lse_b - lse) * (o_b - o), with lse updated only after";
  }
  return "";
}

// Attention over every key, cut into blocks of these sizes, each block computed by naive attention and
// merged with your merge_row in the given order: the result must be naive attention over all the keys.
std::string diagnose_blocks_in_any_order(const std::vector<int>& sizes, const std::vector<int>& order, double spread) {
  const int d = 8, seq_q = 5;
  int seq_k = 0;
  std::vector<int> first;
  for (int s : sizes) first.push_back(seq_k), seq_k += s;
  const Qkv in = random_qkv(seq_q, seq_k, d, 11, spread);
  const ForwardOut all = naive_forward<double>(one_head(seq_q, seq_k, d), in);
  std::vector<ForwardOut> parts;
  for (std::size_t b = 0; b < sizes.size(); ++b) {
    Problem p = one_head(seq_q, sizes[b], d);
    p.options.scale = one_head(seq_q, seq_k, d).softmax_scale();
    parts.push_back(naive_forward<double>(p, key_block(in, first[b], sizes[b], d)));
  }
  std::vector<Row> rows;
  std::vector<double> o, lse;
  for (int i = 0; i < seq_q; ++i) {
    Row run{std::vector<double>(d, 0.0), lesson::kNegInf};
    for (int b : order) run = your_merge(run, row_of(parts[std::size_t(b)], i, d));
    o.insert(o.end(), run.o.begin(), run.o.end());
    lse.push_back(run.lse);
    rows.push_back(std::move(run));
  }
  if (close(o, all.o.data) && same_lse(lse, all.lse.data)) return "";
  for (int i = 0; i < seq_q; ++i) {  // the first row that is off, to describe
    const Row& run = rows[std::size_t(i)];
    const Row want = row_of(all, i, d);
    if (same_lse(run.lse, want.lse) && close(run.o, want.o)) continue;
    std::string blocks;
    for (int b : order) blocks += (blocks.empty() ? "" : ", ") + std::to_string(b);
    return "query row " + std::to_string(i) + ", its keys cut into " + std::to_string(sizes.size()) +
           " blocks merged in the order " + blocks + " (scores spread " + num(spread) + "): O is off by a relative " +
           num(rel_error(run.o, want.o)) + " and L is " + num(run.lse) + " against " + num(want.lse) +
           " over all the keys at once";
  }
  return "O and L of all the rows together are off by more than the rule allows (relative " +
         num(rel_error(o, all.o.data)) + ")";
}

// ---- Part 2 ---------------------------------------------------------------------------------------

struct RingCase {
  RingLayout layout;
  int ranks, seq_q, seq_k;
  CausalAlign causal;
  std::string describe() const {
    return std::to_string(ranks) + (ranks == 1 ? " rank, " : " ranks, ") + to_string(layout) + " layout, seq_q = " +
           std::to_string(seq_q) + ", seq_k = " + std::to_string(seq_k) + ", causal " + to_string(causal);
  }
};

std::string diagnose_ring(const RingCase& c) {
  const int d = 8;
  const RingSchedule ring = ring_schedule(c.layout, c.ranks, c.seq_q, c.seq_k, c.causal);
  const Problem p = one_head(c.seq_q, c.seq_k, d, c.causal);
  const Qkv in = random_qkv(c.seq_q, c.seq_k, d, 100 + c.ranks);
  const ForwardOut want = ring_forward<double>(ring, p, in);
  const ForwardOut naive = naive_forward<double>(p, in);
  REQUIRE_MESSAGE(close(want.o.data, naive.o.data), "the project's ring and naive attention disagree");
  const lesson::HeadResult got = lesson::ring_attention(ring, in.q.data, in.k.data, in.v.data, d, p.softmax_scale());
  const std::string where = "with " + c.describe() + ": ";
  if (got.o.size() != want.o.data.size() || got.lse.size() != want.lse.data.size())
    return where + "your result holds " + std::to_string(got.o.size()) + " values of O and " + std::to_string(got.lse.size()) +
           " of L, expected seq_q * d = " + std::to_string(want.o.data.size()) + " and seq_q = " +
           std::to_string(want.lse.data.size());
  if (close(got.o, want.o.data) && same_lse(got.lse, want.lse.data)) return "";
  // Wrong: sort the rows by what is wrong with them, to say where to look.
  int never = 0, missed = 0, extra = 0, wrong_o = 0, first_bad = -1;
  for (int t = 0; t < c.seq_q; ++t) {
    const double g = got.lse[t], w = want.lse.data[t];
    const std::vector<double> go(got.o.begin() + std::ptrdiff_t(t) * d, got.o.begin() + std::ptrdiff_t(t + 1) * d);
    const std::vector<double> wo(want.o.data.begin() + std::ptrdiff_t(t) * d, want.o.data.begin() + std::ptrdiff_t(t + 1) * d);
    const bool lse_ok = same_lse(g, w);
    const bool o_ok = std::isinf(w) ? go == wo : close(go, wo);
    if (lse_ok && o_ok) continue;
    if (first_bad < 0) first_bad = t;
    if (std::isinf(g) && !std::isinf(w)) ++never;
    else if (!lse_ok && g < w) ++missed;
    else if (!lse_ok) ++extra;
    else ++wrong_o;
  }
  if (first_bad < 0)
    return where + "every row is nearly right, but O and L together are off by more than the rule allows (relative " +
           num(rel_error(got.o, want.o.data)) + ")";
  int owner = 0;
  for (int r = 0; r < c.ranks; ++r)
    for (const TokenRange& t : ring.q_ranges[r])
      if (first_bad >= t.first && (first_bad - t.first) % t.stride == 0 && (first_bad - t.first) / t.stride < t.count) owner = r;
  std::string why = where + std::to_string(never + missed + extra + wrong_o) + " of " + std::to_string(c.seq_q) +
                    " query rows are wrong, the first token " + std::to_string(first_bad) + " (kept by rank " +
                    std::to_string(owner) + "): ";
  if (never == c.seq_q)
    return why + "every L is still -inf: no block was merged, or the rows were not copied back to their tokens (TODOs 4 and 6)";
  if (never > 0)
    return why + std::to_string(never) + " rows still have L = -inf: they never received a block (TODO 4: every "
           "pair that is not Skipped, rows pair.q_offset + a) or were not copied back (TODO 6)";
  if (missed > 0)
    return why + std::to_string(missed) + " rows have a smaller L than the reference: they missed some keys. " +
           (c.ranks > 1 ? "Every share must visit every rank: merge at every step and pass the shares on along "
                          "send_to while kv_travels_on(s) (TODO 5)"
                        : "Each pair covers its own keys: pair.k.count rows of the share from pair.k_offset");
  if (extra > 0)
    return why + std::to_string(extra) + " rows have a larger L than the reference: they counted keys they must not "
           "see, or some twice. A Skipped pair is not computed, and a Diagonal pair passes its causal_offset to "
           "attend_block";
  return why + "L is right but O is not: check the rows of the block you merge and where you merge them "
               "(rank row pair.q_offset + a), and where each row goes back (TODO 6: token t.token(a))";
}

}  // namespace

TEST_CASE("Part 1: log_add_exp is log(e^a + e^b) without overflow, and -inf adds nothing") {
  const std::string why = diagnose_log_add_exp();
  CHECK_MESSAGE(why.empty(), why);
}

TEST_CASE("Part 1: stable_sigmoid never overflows and matches the project's") {
  const std::string why = diagnose_sigmoid();
  CHECK_MESSAGE(why.empty(), why);
}

TEST_CASE("Part 1: merge_row matches the project's merge_attention_partial, row by row") {
  const std::string why = diagnose_merge_rows();
  CHECK_MESSAGE(why.empty(), why);
}

TEST_CASE("Part 1: blocks of keys merged in any order are attention over all of them") {
  for (double spread : {1.0, 12.0}) {  // 12: scores hundreds apart, so a naive e^L would overflow
    for (const std::vector<int>& order : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 2, 1, 0}, std::vector<int>{2, 0, 3, 1}}) {
      const std::string why = diagnose_blocks_in_any_order({7, 1, 13, 4}, order, spread);
      CHECK_MESSAGE(why.empty(), why);
    }
  }
}

TEST_CASE("Part 2: ring_attention equals the project's ring and naive attention") {
  std::vector<RingCase> cases;
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped})
    for (int ranks : {1, 2, 3, 4})
      for (CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight}) {
        cases.push_back({layout, ranks, 24, 24, causal});
        cases.push_back({layout, ranks, 24, 48, causal});  // zigzag needs multiples of 2P: 24 and 48 are
        if (layout != RingLayout::Zigzag) cases.push_back({layout, ranks, 29, 19, causal});  // ragged shares
      }
  // The simplest first, so that the first message points at the first thing to fix.
  for (const RingCase& c : cases) {
    const std::string why = diagnose_ring(c);
    CHECK_MESSAGE(why.empty(), why);
    if (!why.empty()) break;
  }
}
