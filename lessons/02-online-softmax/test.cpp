// Lesson 02's test: your online_softmax_update, finish_row and tiled_attention (lesson.hpp) against
// the project's reference implementation (src/cpu_reference: naive_forward<double> and
// tiled_forward<double> in the FA2 loop order), for many block sizes, ragged last blocks, and a
// block with a larger max arriving later. A failure says in plain words what is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/tiled.hpp"
#include "lesson.hpp"

using namespace flashlab;
namespace lesson = flashlab::lesson02;

namespace {

using Blocks = std::vector<std::vector<double>>;  // a row's scores, cut into key blocks

// f64 against the double reference: the project's tolerance rule (relative error <= 1e-12).
const Bound kF64Bound = tolerance(DType::F64, Quantity::Forward, ErrorStats{}, nullptr);

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, D) row-major arrays.
Problem one_head(int seq_q, int seq_k, int d, double scale = 0.0) {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  p.options.scale = scale;  // 0: the default 1/sqrt(d)
  return p;
}

// ||a - b|| / ||b||, the project's metric (core/tolerance.hpp); inf when the sizes differ or a NaN
// shows up.
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  HostTensor ta({static_cast<std::int64_t>(a.size())}), tb({static_cast<std::int64_t>(b.size())});
  ta.data = a;
  tb.data = b;
  const ErrorStats e = compare(ta, tb);
  return e.has_nan ? INFINITY : e.rel;
}
bool close(const std::vector<double>& a, const std::vector<double>& b) {
  return rel_error(a, b) <= kF64Bound.limit;
}
bool close(double a, double b) { return close(std::vector<double>{a}, std::vector<double>{b}); }

bool all_zero(const std::vector<double>& x) {
  for (double v : x)
    if (v != 0.0) return false;
  return true;
}

// Every diagnose_* function returns "" when your result is right, else plain words saying what is
// wrong and where to look; the test cases CHECK that it is empty.

// ---------------------------------------------------------------------------------------------
// One row, block by block.

// The state after seeing `scores` (with V's rows), straight from the definitions, no blocks:
// m = max s, l = sum exp(s - m), o = sum exp(s - m) V[c, :].
lesson::OnlineRow direct_state(const std::vector<double>& scores, const std::vector<double>& V, int d) {
  lesson::OnlineRow st(d);
  for (double s : scores) st.m = std::max(st.m, s);
  for (std::size_t c = 0; c < scores.size(); ++c) {
    const double p = std::exp(scores[c] - st.m);
    st.l += p;
    for (int k = 0; k < d; ++k) st.o[k] += p * V[c * d + k];
  }
  return st;
}

// The state as someone who forgot to rescale the past would have it: each block's terms measured
// against the max known at the time, never corrected.
lesson::OnlineRow unrescaled_state(const Blocks& blocks, const std::vector<double>& V, int d) {
  lesson::OnlineRow st(d);
  std::size_t key = 0;
  for (const auto& block : blocks) {
    for (double s : block) st.m = std::max(st.m, s);
    for (double s : block) {
      const double p = std::exp(s - st.m);
      st.l += p;
      for (int k = 0; k < d; ++k) st.o[k] += p * V[key * d + k];
      ++key;
    }
  }
  return st;
}

// Feeds the blocks to your online_softmax_update one by one, comparing the state after each with
// the direct one; names the first mistake.
std::string diagnose_updates(const Blocks& blocks, const std::vector<double>& V, int d) {
  lesson::OnlineRow row(d);
  std::vector<double> seen;
  Blocks fed;
  std::size_t key = 0;
  std::ostringstream why;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    const double m_old = row.m;
    const std::vector<double>& s = blocks[b];
    lesson::online_softmax_update(row, s, std::span<const double>(V).subspan(key * d, s.size() * d));
    key += s.size();
    seen.insert(seen.end(), s.begin(), s.end());
    fed.push_back(s);
    const lesson::OnlineRow want = direct_state(seen, V, d);
    const lesson::OnlineRow forgot = unrescaled_state(fed, V, d);
    const bool max_rose = b > 0 && want.m > m_old;
    why << "after block " << b + 1 << " of " << blocks.size() << " (the state starts at m = -inf, l = 0, o = 0): ";
    if (row.m == m_old && std::isinf(m_old) && row.l == 0.0) {
      why << "your online_softmax_update left the state unchanged (TODOs 1 and 2)";
      return why.str();
    }
    if (!std::isfinite(row.m) || !std::isfinite(row.l)) {
      why << "your state has m = " << row.m << ", l = " << row.l << " after a block of finite scores: "
          << (b == 0 ? "on the first block m is -inf; use exp(m_old - m_new), which is exp(-inf) = 0, and "
                       "never exp(s - m_old)"
                     : "m must be the largest score seen and l a sum of exp() terms");
      return why.str();
    }
    if (row.m != want.m) {
      why << "your m is " << row.m << " but the largest score so far is " << want.m << ": "
          << (max_rose ? "your row max is not updated when a later block has a larger score: m_new = "
                         "max(m_old, the block's max)"
                       : "m_new = max(m_old, the block's max), never smaller than before");
      return why.str();
    }
    if (!close(row.l, want.l)) {
      why << "your l is " << row.l << ", expected " << want.l << ": "
          << (max_rose && close(row.l, forgot.l)
                  ? "the larger max of this block was not carried into the past: the rescale factor "
                    "exp(m_old - m_new) must multiply l and O before the block's exp(s - m_new) are added"
                  : "l = exp(m_old - m_new) * l_old + sum_c exp(s_c - m_new)");
      return why.str();
    }
    if (!close(row.o, want.o)) {
      why << "your o differs from sum_c exp(s_c - m) V[c, :] (relative error " << rel_error(row.o, want.o)
          << "): "
          << (max_rose && close(row.o, forgot.o)
                  ? "you rescaled l but not o: the rescale factor exp(m_old - m_new) must multiply l and O"
                  : "o = exp(m_old - m_new) * o_old + sum_c exp(s_c - m_new) * V_j[c, :]");
      return why.str();
    }
    why.str("");
  }
  return "";
}

// The reference output of one row of scores: with K = I (n keys, d = n) and scale 1, S = Q, so
// naive_forward's O and LSE for the query row `scores` are softmax(scores) V and log sum exp(scores).
ForwardOut reference_row(const std::vector<double>& scores, const std::vector<double>& V) {
  const int n = static_cast<int>(scores.size());
  const Problem p = one_head(1, n, n, 1.0);
  Qkv in{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape)), HostTensor(kv_dims(p.shape))};
  in.q.data = scores;
  in.v.data = V;
  for (int j = 0; j < n; ++j) in.k.at(0, j, 0, j) = 1.0;
  return naive_forward<double>(p, in);
}

// Folds the blocks in with your update, finishes with your finish_row, and compares O_i and L_i
// with the reference's O and LSE for the same row.
std::string diagnose_finished_row(const Blocks& blocks, const std::vector<double>& V, int d,
                                  const ForwardOut& ref) {
  lesson::OnlineRow row(d);
  std::size_t key = 0;
  for (const auto& s : blocks) {
    lesson::online_softmax_update(row, s, std::span<const double>(V).subspan(key * d, s.size() * d));
    key += s.size();
  }
  std::vector<double> O(static_cast<std::size_t>(d));
  const double L = lesson::finish_row(row, O);
  std::ostringstream why;
  if (!close(O, ref.o.data))
    why << "your finish_row's O_i differs from the reference's softmax(s) V (relative error "
        << rel_error(O, ref.o.data) << "): O_i = o / l, element by element";
  else if (!close(L, ref.lse.data[0]))
    why << "your finish_row returned L_i = " << L << ", the reference " << ref.lse.data[0]
        << ": L_i = m + log(l)";
  return why.str();
}

// The whole story for one scripted row: each update, then the finish against the reference.
std::string diagnose_scripted_row(const Blocks& blocks, std::uint64_t seed) {
  std::vector<double> scores;
  for (const auto& b : blocks) scores.insert(scores.end(), b.begin(), b.end());
  const int n = static_cast<int>(scores.size());  // d = n, see reference_row
  const std::vector<double> V = random_qkv(one_head(1, n, n).shape, DType::F64, seed).v.data;  // (n, n)
  const std::string update = diagnose_updates(blocks, V, n);
  return update.empty() ? diagnose_finished_row(blocks, V, n, reference_row(scores, V)) : update;
}

// ---------------------------------------------------------------------------------------------
// Whole heads: tiled_attention against naive_forward and tiled_forward (FA2).

// Puts every query row's largest score in the LAST key: all of Q gets a positive first coordinate
// and the last key row points that way, strongly. The earlier blocks then all hold smaller scores,
// and the last block raises every row's max.
void make_larger_max_arrive_last(const Problem& p, Qkv& in) {
  constexpr double kLastKeyScore = 20.0;  // per unit of Q[r][0]; the other scores are of order 1
  const int d = p.shape.head_dim, last = p.shape.seq_k - 1;
  for (int r = 0; r < p.shape.seq_q; ++r) in.q.at(0, r, 0, 0) = 1.0 + std::abs(in.q.at(0, r, 0, 0));
  for (int k = 0; k < d; ++k) in.k.at(0, last, 0, k) = 0.0;
  // With the default scale 1/sqrt(d), the last key's score is kLastKeyScore * Q[r][0] >= 20.
  in.k.at(0, last, 0, 0) = kLastKeyScore * std::sqrt(double(d));
}

// Whether every query row's largest score lies in the last key block (the test's own setup check).
bool max_in_last_block(const Problem& p, const Qkv& in, int Bc) {
  const Shape& s = p.shape;
  const int last_block_start = ((s.seq_k - 1) / Bc) * Bc;
  for (int r = 0; r < s.seq_q; ++r) {
    int argmax = 0;
    double best = -INFINITY;
    for (int c = 0; c < s.seq_k; ++c) {
      double dot = 0.0;
      for (int k = 0; k < s.head_dim; ++k) dot += in.q.at(0, r, 0, k) * in.k.at(0, c, 0, k);
      if (dot > best) best = dot, argmax = c;
    }
    if (argmax < last_block_start) return false;
  }
  return true;
}

// Attention over the first `keys` keys only: what a loop that drops the ragged last key block
// computes.
std::vector<double> naive_over_first_keys(const Problem& p, const Qkv& in, int keys) {
  Problem cut = p;
  cut.shape.seq_k = keys;
  cut.options.scale = p.softmax_scale();
  Qkv in_cut = in;
  const auto D = static_cast<std::size_t>(p.shape.head_dim);
  in_cut.k.dims[1] = in_cut.v.dims[1] = keys;
  in_cut.k.data.resize(static_cast<std::size_t>(keys) * D);
  in_cut.v.data.resize(static_cast<std::size_t>(keys) * D);
  return naive_forward<double>(cut, in_cut).o.data;
}

std::string diagnose_tiled(const Problem& p, const Qkv& in, int Br, int Bc) {
  const Shape& s = p.shape;
  const auto D = static_cast<std::size_t>(s.head_dim);
  const lesson::TiledResult yours = lesson::tiled_attention(in.q.data, in.k.data, in.v.data, s.seq_q, s.seq_k,
                                                            s.head_dim, p.softmax_scale(), Br, Bc);
  const ForwardOut naive = naive_forward<double>(p, in);
  const ForwardOut tiled = tiled_forward<double>(Algorithm::FA2, p, in, Tiling{.Br = Br, .Bc = Bc});
  std::ostringstream why;
  if (yours.O.size() != naive.o.data.size() || yours.lse.size() != naive.lse.data.size()) {
    why << "your tiled_attention returned O of " << yours.O.size() << " and lse of " << yours.lse.size()
        << " numbers; they are (seq_q, d) = " << naive.o.data.size() << " and (seq_q) = " << naive.lse.data.size();
    return why.str();
  }
  if (all_zero(yours.O))
    return "your tiled_attention returned O = 0 everywhere: set Tr and Tc, each block's first row and "
           "extent (TODO 4), then compute S_ij and fold its rows in (TODOs 5 and 6) and finish them (TODO 7)";
  for (double x : yours.O)
    if (!std::isfinite(x))
      return "your O has inf or NaN: either some row's l stayed 0 because no key block reached it (round "
             "Tc up: a block larger than the sequence is still one block), or an exp() overflowed (every "
             "exp() must be of a score minus the running max m)";
  const double err_naive = rel_error(yours.O, naive.o.data);
  const double err_tiled = rel_error(yours.O, tiled.o.data);
  if (err_naive > kF64Bound.limit || err_tiled > kF64Bound.limit) {
    why << "your O differs from the reference (relative error " << err_naive << " against naive_forward, "
        << err_tiled << " against tiled_forward FA2; allowed: " << kF64Bound.rule << "). ";
    int first_bad = -1;
    for (int r = 0; r < s.seq_q && first_bad < 0; ++r) {
      const std::vector<double> mine(yours.O.begin() + r * D, yours.O.begin() + (r + 1) * D);
      const std::vector<double> ref(naive.o.data.begin() + r * D, naive.o.data.begin() + (r + 1) * D);
      if (!close(mine, ref)) first_bad = r;
    }
    const int full_rows = (s.seq_q / Br) * Br, full_keys = (s.seq_k / Bc) * Bc;
    if (full_rows > 0 && full_rows < s.seq_q && first_bad >= full_rows)
      why << "Only the rows of the last, shorter query block (from row " << full_rows
          << ") are wrong: Tr = ceil(seq_q / Br), and that block has rows = seq_q - i * Br.";
    else if (full_keys > 0 && full_keys < s.seq_k && close(yours.O, naive_over_first_keys(p, in, full_keys)))
      why << "Your O is attention over the first " << full_keys << " keys only: the last, shorter key block "
          << "was dropped; Tc = ceil(seq_k / Bc), and that block has cols = seq_k - j * Bc.";
    else
      why << "First wrong row: " << first_bad << ". Check S_ij = scale * Q_i K_j^T with the block offsets "
          << "(Q row row0 + r, K row col0 + c), the V_j rows of the same key block, and that each update "
          << "rescales the past by exp(m_old - m_new).";
    return why.str();
  }
  if (!close(yours.lse, naive.lse.data) || !close(yours.lse, tiled.lse.data)) {
    why << "your O is right but the LSE is not (relative error " << rel_error(yours.lse, naive.lse.data)
        << " against naive_forward, " << rel_error(yours.lse, tiled.lse.data)
        << " against tiled_forward): L_i = m_i + log(l_i), from the row's final m and l";
    return why.str();
  }
  return "";
}

struct TiledCase {
  int seq_q, seq_k, d, Br, Bc;
  std::string what;
};
const TiledCase kTiledCases[] = {
    {.seq_q = 13,
     .seq_k = 13,
     .d = 8,
     .Br = 4,
     .Bc = 4,
     .what = "ragged last blocks in both directions (13 = 3 * 4 + 1)"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 3, .Bc = 5, .what = "Br != Bc, both ragged"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 1, .Bc = 1, .what = "1 x 1 blocks: the update sees one score at a time"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 13, .Bc = 13, .what = "one block: the tiled loop is a plain softmax"},
    {.seq_q = 13, .seq_k = 13, .d = 8, .Br = 16, .Bc = 32, .what = "blocks larger than the sequence"},
    {.seq_q = 20, .seq_k = 37, .d = 16, .Br = 8, .Bc = 16, .what = "seq_q < seq_k, ragged key block"},
    {.seq_q = 37, .seq_k = 20, .d = 4, .Br = 16, .Bc = 8, .what = "seq_q > seq_k, ragged query block"},
    {.seq_q = 1, .seq_k = 1, .d = 1, .Br = 1, .Bc = 1, .what = "one query, one key, d = 1"},
    {.seq_q = 64, .seq_k = 64, .d = 64, .Br = 16, .Bc = 16, .what = "exact multiples, d = 64"},
    {.seq_q = 5, .seq_k = 70, .d = 2, .Br = 2, .Bc = 64, .what = "Bc = 64 over 70 keys: a last key block of 6"},
};

}  // namespace

TEST_CASE("lesson 02: the online softmax update on one row, scripted scores") {
  struct Case {
    Blocks blocks;
    std::string what;
  };
  const Case cases[] = {
      {.blocks = {{0.5, -1.0, 2.0}}, .what = "one block: the update is a plain softmax"},
      {.blocks = {{0.0, 1.0}, {5.0, 2.0}}, .what = "a later block has a larger max: the past must be rescaled"},
      {.blocks = {{3.0, 1.0}, {-1.0, 0.0, 2.5}}, .what = "a later block has a smaller max: m stays"},
      {.blocks = {{-30.0}, {0.0, -5.0}, {40.0}, {41.0, 41.0}}, .what = "the max rises in every block, by a lot"},
      {.blocks = {{1000.0, 998.0}, {1003.0}, {1001.0, 1002.5}}, .what = "scores near 1000: only exp(s - m) survives"},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const std::uint64_t case_seed = seed++;
    INFO(c.what << " (V from seed " << case_seed << ")");
    const std::string mistake = diagnose_scripted_row(c.blocks, case_seed);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 02: the online softmax of a random row, cut at many block sizes") {
  // One query row against 23 keys; its scores come from the problem's own Q and K (scale 1).
  constexpr int kKeys = 23;
  const Problem p = one_head(1, kKeys, kKeys, 1.0);
  const Qkv in = random_qkv(p.shape, DType::F64, 17);
  const ForwardOut ref = naive_forward<double>(p, in);
  std::vector<double> scores(kKeys, 0.0);
  for (int c = 0; c < kKeys; ++c)
    for (int k = 0; k < kKeys; ++k) scores[c] += in.q.at(0, 0, 0, k) * in.k.at(0, c, 0, k);
  for (int Bc : {1, 2, 5, 7, 22, 23, 40}) {
    INFO("block size Bc = " << Bc << " over " << kKeys << " keys");
    Blocks blocks;
    for (int c0 = 0; c0 < kKeys; c0 += Bc)
      blocks.emplace_back(scores.begin() + c0, scores.begin() + std::min(kKeys, c0 + Bc));
    std::string mistake = diagnose_updates(blocks, in.v.data, kKeys);
    if (mistake.empty()) mistake = diagnose_finished_row(blocks, in.v.data, kKeys, ref);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 02: tiled_attention equals naive_forward and tiled_forward (FA2)") {
  std::uint64_t seed = 200;
  for (const TiledCase& c : kTiledCases) {
    const std::uint64_t case_seed = seed++;
    INFO(c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d << ", Br = " << c.Br
                << ", Bc = " << c.Bc << ", input seed " << case_seed);
    const Problem p = one_head(c.seq_q, c.seq_k, c.d);
    const std::string mistake = diagnose_tiled(p, random_qkv(p.shape, DType::F64, case_seed), c.Br, c.Bc);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}

TEST_CASE("lesson 02: tiled_attention when a larger max arrives in the last key block") {
  std::uint64_t seed = 300;
  for (const TiledCase& c : kTiledCases) {
    if (c.seq_k <= c.Bc) continue;  // one key block: nothing arrives later
    const std::uint64_t case_seed = seed++;
    INFO("every row's largest score is in the LAST key block, so each row's max rises there and all "
         "earlier blocks must be rescaled by exp(m_old - m_new); "
         << c.what << ": seq_q = " << c.seq_q << ", seq_k = " << c.seq_k << ", d = " << c.d << ", Br = " << c.Br
         << ", Bc = " << c.Bc << ", input seed " << case_seed);
    const Problem p = one_head(c.seq_q, c.seq_k, c.d);
    Qkv in = random_qkv(p.shape, DType::F64, case_seed);
    make_larger_max_arrive_last(p, in);
    REQUIRE_MESSAGE(max_in_last_block(p, in, c.Bc), "test setup: some row's largest score is not in the last block");
    const std::string mistake = diagnose_tiled(p, in, c.Br, c.Bc);
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
}
