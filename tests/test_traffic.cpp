// src/cpu_reference, the traffic model: the byte totals of every loop nest equal the closed forms
// derived by hand from the papers' algorithms; the arithmetic run and count-only emit the same
// event stream; traffic scales as the papers say (standard ~ N^2, FlashAttention ~ 1/M); the SRAM
// ledger, the pseudocode lines and tiling_from_sram are right.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "cpu_reference/cpu_variants.hpp"
#include "cpu_reference/naive.hpp"
#include "cpu_reference/tiled.hpp"
#include "model/pseudocode.hpp"
#include "model/traffic.hpp"
#include "registry/variants.hpp"

using namespace flashlab;

namespace {

using I64 = std::int64_t;
constexpr int kBytes = 2;  // bytes per element in the traffic model: fp16, as on a GPU

struct Recorder : TrafficObserver {
  std::vector<TileEvent> events;
  void on_event(const TileEvent& e) override { events.push_back(e); }
};

bool same_event(const TileEvent& a, const TileEvent& b) {
  return a.index == b.index && a.algorithm == b.algorithm && a.pass == b.pass && a.bh == b.bh &&
         a.tensor == b.tensor && a.direction == b.direction && a.tile_row == b.tile_row && a.tile_col == b.tile_col &&
         a.rows == b.rows && a.cols == b.cols && a.bytes == b.bytes && a.i == b.i && a.j == b.j && a.line == b.line &&
         a.sram_bytes == b.sram_bytes;
}

TrafficTotals count(Algorithm a, Pass pass, const Problem& p, Tiling t, int bytes = kBytes) {
  TrafficCounter c;
  count_traffic(a, pass, p, t, bytes, c);
  return c.totals();
}

Problem problem(int seq_q, int seq_k, int d, CausalAlign causal = CausalAlign::None, int batch = 1, int heads = 1) {
  Problem p;
  p.shape = Shape{.batch = batch, .heads_q = heads, .heads_kv = heads, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  p.options.causal = causal;
  return p;
}

I64 ceil_div(I64 a, I64 b) { return (a + b - 1) / b; }

// Whether `text` contains `name` as a whole symbol ("dO" in "Load Q_i, dO_i", but "O" not in "dO").
bool names(const std::string& text, const std::string& name) {
  auto is_letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  for (std::size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const bool starts = at == 0 || !is_letter(text[at - 1]);
    const bool ends = at + name.size() == text.size() || !is_letter(text[at + name.size()]);
    if (starts && ends) return true;
  }
  return false;
}

I64 rd(const TrafficTotals& t, TensorId id) { return t.read[static_cast<int>(id)]; }
I64 wr(const TrafficTotals& t, TensorId id) { return t.written[static_cast<int>(id)]; }

// Expected bytes per tensor; every tensor not listed must move zero bytes.
struct Expected {
  std::vector<std::pair<TensorId, I64>> read, written;
};

void check_totals(const TrafficTotals& got, const Expected& want) {
  for (int t = 0; t < static_cast<int>(TensorId::Count); ++t) {
    const TensorId id = static_cast<TensorId>(t);
    I64 r = 0, w = 0;
    for (auto [tid, bytes] : want.read) r += tid == id ? bytes : 0;
    for (auto [tid, bytes] : want.written) w += tid == id ? bytes : 0;
    CAPTURE(to_string(id));
    CHECK(rd(got, id) == r);
    CHECK(wr(got, id) == w);
  }
}

}  // namespace

TEST_CASE("traffic totals equal the closed forms of each loop nest (ragged blocks, several heads)") {
  // N_q = 300 query rows, N_k = 200 keys, d = 32, Br = 48, Bc = 80: Tr = 7, Tc = 3, both ragged.
  const int Nq = 300, Nk = 200, d = 32, BH = 2 * 3;
  const Tiling t{.Br = 48, .Bc = 80};
  const I64 Tr = ceil_div(Nq, t.Br), Tc = ceil_div(Nk, t.Bc);
  REQUIRE(Tr == 7);
  REQUIRE(Tc == 3);
  const Problem p = problem(Nq, Nk, d, CausalAlign::None, 2, 3);
  const I64 e = kBytes * BH;   // bytes per element, all heads
  const I64 Qd = e * Nq * d;   // one pass over Q (or O, dO, dQ)
  const I64 Kd = e * Nk * d;   // one pass over K (or V, dK, dV)
  const I64 Nv = e * Nq;       // one pass over a row statistic (m, l, L, D)
  const I64 NN = e * Nq * Nk;  // one pass over S (or P, dP, dS)

  SUBCASE("FA2 forward: Q read once, K and V read Tr times, O and L written once") {
    check_totals(count(Algorithm::FA2, Pass::Forward, p, t),
                 {.read = {{TensorId::Q, Qd}, {TensorId::K, Tr * Kd}, {TensorId::V, Tr * Kd}},
                  .written = {{TensorId::O, Qd}, {TensorId::LSE, Nv}}});
  }
  SUBCASE("FA1 forward: K and V read once; Q, O, l, m read Tc times; O, l, m written Tc times") {
    check_totals(count(Algorithm::FA1, Pass::Forward, p, t),
                 {.read = {{TensorId::K, Kd}, {TensorId::V, Kd}, {TensorId::Q, Tc * Qd}, {TensorId::O, Tc * Qd},
                          {TensorId::l, Tc * Nv}, {TensorId::m, Tc * Nv}},
                  .written = {{TensorId::O, Tc * Qd}, {TensorId::l, Tc * Nv}, {TensorId::m, Tc * Nv}}});
  }
  SUBCASE("FA2 backward: D pass reads O, dO once; then K, V once, Q, dO, L, D, dQ Tc times; dQ written Tc times, "
          "dK, dV once") {
    check_totals(count(Algorithm::FA2, Pass::Backward, p, t),
                 {.read = {{TensorId::O, Qd}, {TensorId::dO, Qd + Tc * Qd}, {TensorId::K, Kd}, {TensorId::V, Kd},
                          {TensorId::Q, Tc * Qd}, {TensorId::LSE, Tc * Nv}, {TensorId::D, Tc * Nv},
                          {TensorId::dQ, Tc * Qd}},
                  .written = {{TensorId::D, Nv}, {TensorId::dQ, Tc * Qd}, {TensorId::dK, Kd}, {TensorId::dV, Kd}}});
  }
  SUBCASE("FA1 backward: K, V once; Q, O, dO, dQ, l, m Tc times; dQ written Tc times, dK, dV once") {
    check_totals(count(Algorithm::FA1, Pass::Backward, p, t),
                 {.read = {{TensorId::K, Kd}, {TensorId::V, Kd}, {TensorId::Q, Tc * Qd}, {TensorId::O, Tc * Qd},
                          {TensorId::dO, Tc * Qd}, {TensorId::dQ, Tc * Qd}, {TensorId::l, Tc * Nv},
                          {TensorId::m, Tc * Nv}},
                  .written = {{TensorId::dQ, Tc * Qd}, {TensorId::dK, Kd}, {TensorId::dV, Kd}}});
  }
  SUBCASE("standard forward: S and P each written once and read once; Q once, K and V Tr times, O once") {
    check_totals(count(Algorithm::Standard, Pass::Forward, p, t),
                 {.read = {{TensorId::Q, Qd}, {TensorId::K, Tr * Kd}, {TensorId::S, NN}, {TensorId::P, NN},
                          {TensorId::V, Tr * Kd}},
                  .written = {{TensorId::S, NN}, {TensorId::P, NN}, {TensorId::O, Qd}}});
  }
  SUBCASE("standard backward: P read twice, dP written once read once, dS written once read twice") {
    check_totals(count(Algorithm::Standard, Pass::Backward, p, t),
                 {.read = {{TensorId::P, 2 * NN}, {TensorId::dO, Tc * Qd + Qd}, {TensorId::V, Tr * Kd},
                          {TensorId::dP, NN}, {TensorId::dS, 2 * NN}, {TensorId::K, Tr * Kd}, {TensorId::Q, Tc * Qd}},
                  .written = {{TensorId::dV, Kd}, {TensorId::dP, NN}, {TensorId::dS, NN}, {TensorId::dQ, Qd},
                             {TensorId::dK, Kd}}});
  }
}

TEST_CASE("causal FA2 forward reads K and V only for the T(T+1)/2 tiles on or below the diagonal") {
  // N = 256 = T * B with T = 8 blocks of B = 32: top-left causal visits the lower triangle of tiles.
  const int N = 256, d = 16, B = 32, T = N / B;
  const Problem p = problem(N, N, d, CausalAlign::TopLeft);
  const TrafficTotals got = count(Algorithm::FA2, Pass::Forward, p, Tiling{.Br = B, .Bc = B});
  const I64 visible_tiles = I64{T} * (T + 1) / 2;
  CHECK(rd(got, TensorId::K) == visible_tiles * B * d * kBytes);
  CHECK(rd(got, TensorId::V) == visible_tiles * B * d * kBytes);
  CHECK(rd(got, TensorId::Q) == I64{N} * d * kBytes);
  CHECK(wr(got, TensorId::O) == I64{N} * d * kBytes);
  // FA1 backward: Q, O, dO, dQ re-read per visible tile.
  const TrafficTotals bwd = count(Algorithm::FA1, Pass::Backward, p, Tiling{.Br = B, .Bc = B});
  CHECK(rd(bwd, TensorId::Q) == visible_tiles * B * d * kBytes);
  CHECK(wr(bwd, TensorId::dQ) == visible_tiles * B * d * kBytes);
}

TEST_CASE("count-only at N = 128k, d = 64, M = 100 KB still equals the closed form (no overflow)") {
  const int N = 128 * 1024, d = 64;
  const Tiling t = tiling_from_sram(100 * 1024, d, kBytes);
  const Problem p = problem(N, N, d);
  const I64 Tr = ceil_div(N, t.Br);
  const TrafficTotals got = count(Algorithm::FA2, Pass::Forward, p, t);
  const I64 Nd = I64{N} * d * kBytes;
  CHECK(got.total_read() == Nd + 2 * Tr * Nd);
  CHECK(got.total_written() == Nd + I64{N} * kBytes);
  CHECK(got.peak_sram_bytes <= 100 * 1024);
}

TEST_CASE("the arithmetic run and count-only emit the same event stream") {
  Problem p = problem(45, 38, 8, CausalAlign::BottomRight, 2, 4);
  p.shape.heads_kv = 2;
  p.options.dropout_p = 0.1;
  const Tiling t{.Br = 8, .Bc = 16};
  const Qkv in = random_qkv(p.shape, DType::F64, 7);
  const HostTensor dO = random_like_o(p.shape, DType::F64, 8);
  for (const Algorithm a : {Algorithm::FA1, Algorithm::FA2}) {
    CAPTURE(to_string(a));
    Recorder fwd_run, fwd_count, bwd_run, bwd_count;
    const ForwardOut f = tiled_forward<double>(a, p, in, t, &fwd_run, kBytes);
    tiled_backward<float>(a, p, in, f, dO, t, &bwd_run, kBytes);
    count_traffic(a, Pass::Forward, p, t, kBytes, fwd_count);
    count_traffic(a, Pass::Backward, p, t, kBytes, bwd_count);
    for (auto [run, counted] : {std::pair{&fwd_run, &fwd_count}, std::pair{&bwd_run, &bwd_count}}) {
      REQUIRE(run->events.size() == counted->events.size());
      REQUIRE(!run->events.empty());
      std::size_t mismatches = 0;
      for (std::size_t n = 0; n < run->events.size(); ++n)
        mismatches += !same_event(run->events[n], counted->events[n]);
      CHECK(mismatches == 0);
    }
  }
  {  // naive attention reports standard attention's stream
    Recorder naive_run, counted;
    naive_forward<double>(p, in, &naive_run);
    count_traffic(Algorithm::Standard, Pass::Forward, p, cpu_variant_tiling(p.shape.head_dim), sizeof(double),
                  counted);
    REQUIRE(naive_run.events.size() == counted.events.size());
    std::size_t mismatches = 0;
    for (std::size_t n = 0; n < counted.events.size(); ++n)
      mismatches += !same_event(naive_run.events[n], counted.events[n]);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("the parts of a forward nest, walked in the nest's order, are the whole walk") {
  Problem p = problem(45, 38, 8, CausalAlign::BottomRight, 2, 4);
  p.shape.heads_kv = 2;
  const Tiling t{.Br = 8, .Bc = 16};
  const int BH = p.shape.batch * p.shape.heads_q, Tr = int(ceil_div(p.shape.seq_q, t.Br));
  for (const Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2}) {
    CAPTURE(to_string(a));
    Recorder whole, parts;
    count_traffic(a, Pass::Forward, p, t, kBytes, whole);
    for (int bh = 0; bh < BH; ++bh) {
      if (a == Algorithm::FA1) count_part_traffic(a, p, t, kBytes, NestPart{.bh = bh}, parts);
      if (a == Algorithm::FA2)
        for (int i = 0; i < Tr; ++i) count_part_traffic(a, p, t, kBytes, NestPart{.bh = bh, .i = i}, parts);
      if (a == Algorithm::Standard)
        for (NestPhase phase : {NestPhase::Scores, NestPhase::Softmax, NestPhase::Output})
          for (int i = 0; i < Tr; ++i)
            count_part_traffic(a, p, t, kBytes, NestPart{.bh = bh, .i = i, .phase = phase}, parts);
    }
    REQUIRE(parts.events.size() == whole.events.size());
    std::size_t mismatches = 0;
    for (std::size_t n = 0; n < whole.events.size(); ++n) {
      TileEvent e = parts.events[n];
      e.index = whole.events[n].index;  // each part counts its events from 0; the SRAM ledger is 0 between parts
      mismatches += !same_event(e, whole.events[n]);
    }
    CHECK(mismatches == 0);
  }
  SUBCASE("a part outside the problem, a phase of a FlashAttention nest, or a query block of FA1: one sentence") {
    TrafficCounter c;
    CHECK_THROWS_WITH_AS(count_part_traffic(Algorithm::FA2, p, t, kBytes, NestPart{.bh = BH}, c),
                         doctest::Contains("bh 8 is outside 0..7"), InputError);
    CHECK_THROWS_WITH_AS(count_part_traffic(Algorithm::FA2, p, t, kBytes, NestPart{.bh = 0, .i = Tr}, c),
                         doctest::Contains("query block 6 is outside 0..5"), InputError);
    CHECK_THROWS_WITH_AS(
        count_part_traffic(Algorithm::FA2, p, t, kBytes, NestPart{.bh = 0, .i = 0, .phase = NestPhase::Softmax}, c),
        doctest::Contains("only standard attention has phases"), InputError);
    CHECK_THROWS_WITH_AS(count_part_traffic(Algorithm::FA1, p, t, kBytes, NestPart{.bh = 0, .i = 0}, c),
                         doctest::Contains("a part is a whole (batch, head)"), InputError);
  }
}

TEST_CASE("every event is well formed and its pseudocode line names the tensor it moves") {
  Problem p = problem(37, 53, 8, CausalAlign::TopLeft, 1, 2);
  const Tiling t{.Br = 8, .Bc = 16};
  for (const Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2})
    for (const Pass pass : {Pass::Forward, Pass::Backward}) {
      CAPTURE(to_string(a));
      CAPTURE(pass == Pass::Forward ? "forward" : "backward");
      const std::vector<std::string>& listing = pseudocode(a, pass);
      REQUIRE(listing.size() >= 4);
      Recorder r;
      count_traffic(a, pass, p, t, kBytes, r);
      REQUIRE(!r.events.empty());
      const int Tr = static_cast<int>(ceil_div(37, t.Br)), Tc = static_cast<int>(ceil_div(53, t.Bc));
      std::size_t bad = 0, unnamed = 0;
      std::string first_unnamed;
      for (std::size_t n = 0; n < r.events.size(); ++n) {
        const TileEvent& e = r.events[n];
        const bool moves = e.direction == Direction::Load || e.direction == Direction::Store;
        bad += e.index != static_cast<I64>(n) || e.algorithm != a || e.pass != pass;
        bad += e.line < 1 || e.line > static_cast<int>(listing.size());
        bad += e.bh < 0 || e.bh >= 2 || e.i < -1 || e.i >= Tr || e.j < -1 || e.j >= Tc;
        bad += e.bytes != (moves ? I64{e.rows} * e.cols * kBytes : 0);
        bad += e.sram_bytes < 0;
        if (moves && e.line >= 1 && e.line <= static_cast<int>(listing.size())) {
          if (!names(listing[e.line - 1], to_string(e.tensor)) && unnamed++ == 0)
            first_unnamed = "line " + std::to_string(e.line) + " '" + listing[e.line - 1] + "' does not name " +
                            to_string(e.tensor);
        }
      }
      CHECK(bad == 0);
      INFO(first_unnamed);
      CHECK(unnamed == 0);
      CHECK(r.events.back().sram_bytes == 0);  // every tile that entered SRAM left it
    }
}

TEST_CASE("peak SRAM is Q_i, O_i, l_i, m_i, K_j, V_j and S_ij, and fits M with the paper's block sizes") {
  const int d = 64;
  const I64 M_bytes = 100 * 1024;
  const Tiling t = tiling_from_sram(M_bytes, d, kBytes);
  const Problem p = problem(4096, 4096, d);
  const I64 want = (2 * I64{t.Br} * d + 2 * I64{t.Br} + 2 * I64{t.Bc} * d + I64{t.Br} * t.Bc) * kBytes;
  for (const Algorithm a : {Algorithm::FA1, Algorithm::FA2}) {
    CAPTURE(to_string(a));
    const TrafficTotals got = count(a, Pass::Forward, p, t);
    CHECK(got.peak_sram_bytes == want);
    CHECK(got.peak_sram_bytes <= M_bytes);
  }
  // Standard attention holds one row block of Q and one K tile and S tile at a time.
  const TrafficTotals std_fwd = count(Algorithm::Standard, Pass::Forward, p, t);
  CHECK(std_fwd.peak_sram_bytes == (I64{t.Br} * d + I64{t.Bc} * d + I64{t.Br} * t.Bc) * kBytes);
}

TEST_CASE("standard attention's traffic grows as N^2") {
  const Tiling t = tiling_from_sram(100 * 1024, 64, kBytes);
  auto total = [&](int N) { return double(count(Algorithm::Standard, Pass::Forward, problem(N, N, 64), t).total()); };
  const double small = total(4096), large = total(8192);
  INFO("ratio ", large / small);
  CHECK(large / small == doctest::Approx(4.0).epsilon(0.02));
}

TEST_CASE("FlashAttention's traffic falls as 1/M in its dominant term") {
  const int N = 16384;
  // FA1: the dominant term re-reads Q and O (and writes O) Tc = N / Bc times, Bc = ceil(M / 4d).
  // FA2 forward: K and V are read Tr = N / Br times, Br = min(Bc, d): 1/M while M < 4 d^2.
  // FA2 backward: Q, dO, dQ, L, D are re-read Tc times.
  struct Case {
    Algorithm a;
    Pass pass;
    int d;
    std::vector<I64> sram;  // doubling
  };
  const std::vector<Case> cases = {
      {.a = Algorithm::FA1, .pass = Pass::Forward, .d = 64, .sram = {64 * 1024, 128 * 1024, 256 * 1024}},
      {.a = Algorithm::FA2, .pass = Pass::Forward, .d = 128, .sram = {16 * 1024, 32 * 1024, 64 * 1024}},
      {.a = Algorithm::FA2, .pass = Pass::Backward, .d = 64, .sram = {64 * 1024, 128 * 1024, 256 * 1024}}};
  for (const Case& c : cases) {
    CAPTURE(to_string(c.a));
    const Problem p = problem(N, N, c.d);
    const I64 compulsory = 4 * I64{N} * c.d * kBytes;  // each of Q, K, V, O moved once
    std::vector<double> dominant;
    for (I64 m : c.sram)
      dominant.push_back(
          static_cast<double>(count(c.a, c.pass, p, tiling_from_sram(m, c.d, kBytes)).total() - compulsory));
    for (std::size_t n = 1; n < dominant.size(); ++n) {
      INFO("traffic beyond compulsory at M = ", c.sram[n - 1], ": ", dominant[n - 1], ", at 2M: ", dominant[n]);
      CHECK(dominant[n - 1] / dominant[n] == doctest::Approx(2.0).epsilon(0.1));
    }
  }
  SUBCASE("and tracks the paper's Theta(N^2 d^2 / M)") {
    const int d = 64;
    const I64 M = 100 * 1024;
    const double model = double(N) * N * d * d / (M / kBytes) * kBytes;
    const double fa1 = static_cast<double>(count(Algorithm::FA1, Pass::Forward, problem(N, N, d),
                                                 tiling_from_sram(M, d, kBytes)).total());
    INFO("FA1 forward / (N^2 d^2 / M): ", fa1 / model);
    CHECK(fa1 / model > 1.0);
    CHECK(fa1 / model < 20.0);
  }
}

TEST_CASE("FA1 moves more O bytes than FA2, and causal moves fewer bytes") {
  const int N = 4096, d = 64;
  const Tiling t = tiling_from_sram(100 * 1024, d, kBytes);
  const TrafficTotals fa1 = count(Algorithm::FA1, Pass::Forward, problem(N, N, d), t);
  const TrafficTotals fa2 = count(Algorithm::FA2, Pass::Forward, problem(N, N, d), t);
  const I64 o1 = rd(fa1, TensorId::O) + wr(fa1, TensorId::O), o2 = rd(fa2, TensorId::O) + wr(fa2, TensorId::O);
  CHECK(o1 > 10 * o2);
  for (const Algorithm a : {Algorithm::FA1, Algorithm::FA2})
    for (const Pass pass : {Pass::Forward, Pass::Backward}) {
      CAPTURE(to_string(a));
      const double full = static_cast<double>(count(a, pass, problem(N, N, d), t).total());
      for (const CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
        const double causal = static_cast<double>(count(a, pass, problem(N, N, d, align), t).total());
        CHECK(causal < full);
        CHECK(causal > 0.4 * full);  // about half the tiles remain, plus the compulsory traffic
      }
    }
}

TEST_CASE("tiling_from_sram follows the paper: Bc = ceil(M / 4d), Br = min(Bc, d)") {
  auto check = [](I64 sram, int d, int bytes, int Br, int Bc) {
    const Tiling t = tiling_from_sram(sram, d, bytes);
    CAPTURE(sram);
    CAPTURE(d);
    CHECK(t.Br == Br);
    CHECK(t.Bc == Bc);
  };
  check(100 * 1024, 64, 2, 64, 200);  // M = 51200: Bc = 200, Br = d
  check(512, 64, 2, 1, 1);            // M = 256 = 4d exactly: one row each
  check(48 * 1024, 256, 2, 24, 24);   // M = 24576: Bc = 24 < d
  check(1001 * 4, 10, 4, 10, 26);     // M = 1001: Bc = ceil(1001 / 40) = 26
  try {
    tiling_from_sram(1000, 64, 4);  // M = 250 < 4d = 256
    FAIL("no InputError");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("1000") != std::string::npos);
    CHECK(msg.find("256") != std::string::npos);
  }
  CHECK_THROWS_AS(tiling_from_sram(4096, 0, 2), InputError);
  TrafficCounter counter;
  CHECK_THROWS_AS(count_traffic(Algorithm::FA2, Pass::Forward, problem(8, 8, 8), Tiling{.Br = 0, .Bc = 8}, 2, counter),
                  InputError);
}

TEST_CASE("the L2 level: capacity 0 is the paper's two-level count, a large L2 leaves only compulsory traffic") {
  const int N = 2048, d = 64;
  const Tiling t = tiling_from_sram(100 * 1024, d, kBytes);
  const Problem p = problem(N, N, d, CausalAlign::None, 1, 2);
  const I64 BH = 2, Nd = BH * I64{N} * d * kBytes;
  SUBCASE("no L2: DRAM traffic equals the TrafficCounter totals") {
    for (const Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2})
      for (const Pass pass : {Pass::Forward, Pass::Backward}) {
        CAPTURE(to_string(a));
        L2Model l2(0);
        count_traffic(a, pass, p, t, kBytes, l2);
        l2.flush();
        const TrafficTotals want = count(a, pass, p, t);
        CHECK(l2.dram().read == want.read);
        CHECK(l2.dram().written == want.written);
        CHECK(l2.hit_bytes() == 0);
      }
  }
  SUBCASE("an H100-sized L2 absorbs FA2's re-reads of K and V: DRAM reads are Q, K, V once") {
    L2Model l2(50 * 1000 * 1000);
    count_traffic(Algorithm::FA2, Pass::Forward, p, t, kBytes, l2);
    l2.flush();
    CHECK(l2.dram().total_read() == 3 * Nd);
    CHECK(l2.dram().total_written() == Nd + BH * N * kBytes);  // O and L once
    CHECK(l2.hit_bytes() == count(Algorithm::FA2, Pass::Forward, p, t).total_read() - 3 * Nd);
  }
  SUBCASE("a large L2 turns FA1's round trips of O into one read and one write") {
    L2Model l2(50 * 1000 * 1000);
    count_traffic(Algorithm::FA1, Pass::Forward, p, t, kBytes, l2);
    l2.flush();
    CHECK(rd(l2.dram(), TensorId::O) == Nd);
    CHECK(wr(l2.dram(), TensorId::O) == Nd);
    CHECK(rd(l2.dram(), TensorId::Q) == Nd);
  }
  SUBCASE("an L2 smaller than one head's K and V thrashes: LRU misses on every cyclic re-read") {
    L2Model l2(256 * 1024);  // K and V of one head: 2 * N * d * 2 bytes = 512 KB
    count_traffic(Algorithm::FA2, Pass::Forward, p, t, kBytes, l2);
    l2.flush();
    const TrafficTotals two_level = count(Algorithm::FA2, Pass::Forward, p, t);
    CHECK(rd(l2.dram(), TensorId::K) == rd(two_level, TensorId::K));
    CHECK(rd(l2.dram(), TensorId::V) == rd(two_level, TensorId::V));
  }
}

// A reference LRU, written the plain way (a list of keys, most recent first), for the L2Model's flat one.
struct ReferenceLru {
  struct Tile {
    std::uint64_t key;
    I64 bytes;
    bool dirty;
  };
  I64 capacity, read = 0, written = 0, hits = 0;
  std::vector<Tile> tiles{};  // most recent first
  void access(std::uint64_t key, I64 bytes, bool store) {
    auto it = std::find_if(tiles.begin(), tiles.end(), [&](const Tile& t) { return t.key == key; });
    Tile t{key, bytes, store};
    if (it != tiles.end()) {
      hits += !store ? bytes : 0;
      t.dirty = it->dirty || store;
      tiles.erase(it);
    } else if (!store) {
      read += bytes;
    }
    tiles.insert(tiles.begin(), t);
    I64 resident = 0;
    for (const Tile& x : tiles) resident += x.bytes;
    while (resident > capacity && !tiles.empty()) {
      resident -= tiles.back().bytes;
      written += tiles.back().dirty ? tiles.back().bytes : 0;
      tiles.pop_back();
    }
  }
};

TEST_CASE("the L2 level is an LRU of whole tiles: the same hits, misses and write-backs as a plain list") {
  // Random loads and stores over a few hundred tiles of a few sizes, into caches that hold a few dozen:
  // every eviction, re-insertion and hash-table deletion path runs many times.
  std::uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (const I64 capacity : {I64{0}, I64{4096}, I64{40000}, I64{200000}}) {
    CAPTURE(capacity);
    L2Model l2(capacity);
    ReferenceLru ref{capacity};
    for (int n = 0; n < 20000; ++n) {
      TileEvent e;
      e.bh = int(next() % 3);
      e.tensor = next() % 2 ? TensorId::K : TensorId::O;
      e.tile_row = int(next() % 50);
      e.tile_col = 0;
      e.bytes = 512 * I64(1 + e.tile_row % 4);
      e.direction = e.tensor == TensorId::O && next() % 2 ? Direction::Store : Direction::Load;
      const std::uint64_t key = (std::uint64_t(e.bh) << 20) | (std::uint64_t(e.tensor) << 16) | std::uint64_t(e.tile_row);
      ref.access(key, e.bytes, e.direction == Direction::Store);
      l2.on_event(e);
    }
    CHECK(l2.dram().total_read() == ref.read);
    CHECK(l2.dram().total_written() == ref.written);
    CHECK(l2.hit_bytes() == ref.hits);
    I64 dirty = 0;
    for (const auto& t : ref.tiles) dirty += t.dirty ? t.bytes : 0;
    CHECK(l2.dirty_bytes() == dirty);
    l2.flush();
    CHECK(l2.dram().total_written() == ref.written + dirty);
    CHECK(l2.dirty_bytes() == 0);
  }
}

TEST_CASE("the L2 level with a Shape: query heads that share a K/V head share its tiles") {
  Problem p = problem(512, 512, 64, CausalAlign::None, 2, 8);
  p.shape.heads_kv = 2;
  const Tiling t{.Br = 64, .Bc = 64};
  const I64 kv_head_bytes = I64{512} * 64 * kBytes;
  L2Model shared(I64{1} << 40, &p.shape), separate(I64{1} << 40);
  count_traffic(Algorithm::FA2, Pass::Forward, p, t, kBytes, shared);
  count_traffic(Algorithm::FA2, Pass::Forward, p, t, kBytes, separate);
  CHECK(rd(shared.dram(), TensorId::K) == 2 * 2 * kv_head_bytes);  // batch 2 x 2 K/V heads
  CHECK(rd(separate.dram(), TensorId::K) == 2 * 8 * kv_head_bytes);  // every query head its own copy
  CHECK(rd(shared.dram(), TensorId::Q) == rd(separate.dram(), TensorId::Q));
  TileEvent e;
  e.direction = Direction::Store;
  e.tensor = TensorId::O;
  e.bytes = 100;
  L2Model l2(1000);
  l2.on_event(e);  // a store: write-allocate, dirty, nothing read
  e.direction = Direction::Load;
  l2.on_event(e);  // a hit
  CHECK(l2.dram().total_read() == 0);
  CHECK(l2.hit_bytes() == 100);
  CHECK(l2.dirty_bytes() == 100);
}

// flashlab bench counts one head's nest and multiplies (src/cli/bench.cpp): every head moves the same bytes.
TEST_CASE("the two-level count of B x H heads is B * H times one head's, with GQA and every mask") {
  for (const CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
    for (const Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2})
      for (const Pass pass : {Pass::Forward, Pass::Backward}) {
        CAPTURE(to_string(a));
        CAPTURE(int(pass));
        CAPTURE(int(causal));
        Problem many = problem(300, 200, 32, causal, 2, 6);
        many.shape.heads_kv = 3;
        const Problem one = problem(300, 200, 32, causal, 1, 1);
        const Tiling t{.Br = 32, .Bc = 48};
        const TrafficTotals all = count(a, pass, many, t), single = count(a, pass, one, t);
        CHECK(single.total() > 0);
        CHECK(all.total() == 12 * single.total());
        for (std::size_t n = 0; n < all.read.size(); ++n) {
          CHECK(all.read[n] == 12 * single.read[n]);
          CHECK(all.written[n] == 12 * single.written[n]);
        }
      }
}

TEST_CASE("CompulsoryTraffic lets through what an endless L2Model does, byte for byte") {
  auto same = [](const TrafficTotals& a, const TrafficTotals& b) {
    CHECK(a.read == b.read);
    CHECK(a.written == b.written);
    CHECK(a.events == b.events);
    CHECK(a.peak_sram_bytes == b.peak_sram_bytes);
  };
  SUBCASE("every loop nest, both passes, with query heads sharing K/V heads") {
    Problem p = problem(640, 384, 64, CausalAlign::BottomRight, 2, 8);
    p.shape.heads_kv = 2;
    const Tiling t{.Br = 64, .Bc = 32};
    for (const Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2})
      for (const Pass pass : {Pass::Forward, Pass::Backward}) {
        CAPTURE(to_string(a));
        CAPTURE(int(pass));
        L2Model endless(std::numeric_limits<I64>::max(), &p.shape);
        CompulsoryTraffic compulsory(&p.shape);
        count_traffic(a, pass, p, t, kBytes, endless);
        count_traffic(a, pass, p, t, kBytes, compulsory);
        endless.flush();
        compulsory.flush();
        same(compulsory.dram(), endless.dram());
        CHECK(compulsory.dram().total_read() > 0);
        CHECK(compulsory.dram().total_written() > 0);
      }
  }
  SUBCASE("random loads, stores and other events over tiles whose bytes change (enough tiles to grow its table)") {
    std::uint64_t state = 777;
    auto next = [&] {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return state >> 33;
    };
    L2Model endless(std::numeric_limits<I64>::max());
    CompulsoryTraffic compulsory;
    for (int n = 0; n < 50000; ++n) {
      TileEvent e;
      e.bh = int(next() % 4);
      e.tensor = next() % 2 ? TensorId::K : TensorId::O;
      e.tile_row = int(next() % 1000);
      e.tile_col = int(next() % 3);
      e.bytes = 256 * I64(1 + next() % 4);
      const auto kind = next() % 8;
      e.direction = kind < 4 ? Direction::Load : kind < 7 ? Direction::Store : Direction::Compute;
      if (e.direction == Direction::Compute) e.bytes = 0;
      e.sram_bytes = I64(next() % 100000);
      endless.on_event(e);
      compulsory.on_event(e);
      if (next() % 5 == 0) {  // the same tile again at once (the last-tile shortcut)
        e.direction = Direction::Load;
        e.bytes = 128;
        endless.on_event(e);
        compulsory.on_event(e);
      }
    }
    endless.flush();
    compulsory.flush();
    same(compulsory.dram(), endless.dram());
    CHECK(compulsory.dram().total_written() > 0);
  }
}

TEST_CASE("the CPU variants report the traffic of their own loop nest, in their dtype's bytes") {
  const Problem p = problem(100, 77, 16, CausalAlign::TopLeft, 1, 2);
  const Qkv in = random_qkv(p.shape, DType::F32, 3);
  for (const Variant& v : variants()) {
    if (v.device != Device::Cpu) continue;
    for (const DType dtype : {DType::F64, DType::F32}) {
      CAPTURE(v.name);
      CAPTURE(to_string(dtype));
      TrafficCounter reported;
      v.forward(p, dtype, in, &reported);
      const TrafficTotals want =
          count(v.algorithm, Pass::Forward, p, cpu_variant_tiling(p.shape.head_dim), dtype_bytes(dtype));
      CHECK(reported.totals().read == want.read);
      CHECK(reported.totals().written == want.written);
      CHECK(reported.totals().events == want.events);
    }
  }
}
