// FP8 (e4m3) on the CPU: the conversion of core/fp8.hpp, checked on all 256 patterns, every midpoint, the
// subnormals, zeros, saturation and NaN, and against a brute-force nearest search; the per-head quantizer, the
// Walsh-Hadamard rotation (against the Sylvester matrix; orthogonal; Q K^T unchanged) and the emulated FP8
// forward of cpu_reference/fp8.hpp (known answers, the causal alignments, GQA, and the rule: within its stated
// bound of attention in double on the dequantized inputs); the kernel's operands (quantize_e4m3_qkv) and the
// rule a kernel is held to (check_fp8_kernel: within 2x the emulation); bad input is an InputError.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "core/fp8.hpp"
#include "core/half.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/fp8.hpp"
#include "cpu_reference/naive.hpp"

using namespace flashlab;

namespace {

// The value the format assigns to a pattern, from its fields alone (sign, exponent e, mantissa m).
double e4m3_defined_value(int bits) {
  const int e = (bits >> 3) & 15, m = bits & 7;
  const double mag = e == 0 ? m * std::pow(2.0, -9) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return (bits & 0x80) ? -mag : mag;
}

// The 127 non-negative finite values, ascending (patterns 0x00 .. 0x7e).
std::vector<float> positive_e4m3_values() {
  std::vector<float> v;
  for (int b = 0; b <= 0x7e; ++b) v.push_back(static_cast<float>(e4m3_defined_value(b)));
  return v;
}

Problem make_problem(Shape s, CausalAlign causal = CausalAlign::None) {
  Problem p;
  p.shape = s;
  p.options.causal = causal;
  return p;
}

double max_abs(const HostTensor& t) {
  double m = 0;
  for (double x : t.data) m = std::max(m, std::abs(x));
  return m;
}

// Channels `channels` of every (b, s, h) row multiplied by `factor`: the outlier channels of real activations.
void scale_channels(HostTensor& t, const std::vector<int>& channels, double factor) {
  for (std::size_t base = 0; base < t.data.size(); base += static_cast<std::size_t>(t.dims[3]))
    for (int c : channels) t.data[base + static_cast<std::size_t>(c)] *= factor;
}

}  // namespace

// ---- core/fp8.hpp --------------------------------------------------------------------------------------

TEST_CASE("every e4m3 pattern decodes to the value its fields define and re-encodes to itself") {
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float x = e4m3_bits_to_float(bits);
    INFO("pattern ", b);
    if ((b & 0x7f) == 0x7f) {  // S.1111.111
      CHECK(std::isnan(x));
      CHECK(float_to_e4m3_bits(x) == kE4m3NanBits);
      ++nans;
      continue;
    }
    CHECK(static_cast<double>(x) == e4m3_defined_value(b));
    CHECK(std::signbit(x) == ((b & 0x80) != 0));  // 0x80 is -0
    CHECK(float_to_e4m3_bits(x) == bits);
  }
  CHECK(nans == 2);
  // Anchors of the format, and its spacing: 2^-9 through the subnormals and the first normal binade, then
  // doubling every 8 patterns.
  CHECK(e4m3_bits_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(e4m3_bits_to_float(0x07) == 7 * std::ldexp(1.0f, -9));
  CHECK(e4m3_bits_to_float(0x08) == std::ldexp(1.0f, -6));
  CHECK(e4m3_bits_to_float(0x38) == 1.0f);
  CHECK(e4m3_bits_to_float(0x7d) == 416.0f);
  CHECK(e4m3_bits_to_float(0x7e) == 448.0f);
  const std::vector<float> v = positive_e4m3_values();
  for (int b = 1; b < static_cast<int>(v.size()); ++b) {
    const float step = v[static_cast<std::size_t>(b)] - v[static_cast<std::size_t>(b - 1)];
    const float expected = std::ldexp(1.0f, std::max((b - 1) >> 3, 1) - 10);  // 2^(e - 10), e the exponent field
    INFO("between patterns ", b - 1, " and ", b);
    CHECK(step == expected);
  }
}

TEST_CASE("e4m3 rounds midpoints to the even neighbour, and values beside them to the nearer one") {
  for (const float sign : {1.0f, -1.0f}) {
    for (int b = 0; b < 0x7e; ++b) {
      const float lo = sign * e4m3_bits_to_float(static_cast<std::uint8_t>(b));
      const float hi = sign * e4m3_bits_to_float(static_cast<std::uint8_t>(b + 1));
      const float mid = (lo + hi) / 2;  // exact: at most 5 significant bits
      REQUIRE(mid != lo);
      REQUIRE(mid != hi);
      const int even = (b & 1) ? b + 1 : b;
      const std::uint8_t s = sign < 0 ? 0x80 : 0x00;
      INFO("between patterns ", b, " and ", b + 1, ", sign ", sign);
      CHECK(float_to_e4m3_bits(mid) == (s | even));
      CHECK(float_to_e4m3_bits(std::nextafter(mid, hi)) == (s | (b + 1)));
      CHECK(float_to_e4m3_bits(std::nextafter(mid, lo)) == (s | b));
    }
  }
  // The ties named: 2^-10 (0 and the smallest subnormal) to 0; 3 * 2^-10 to 2 * 2^-9; 15 * 2^-10 (the last
  // subnormal and the first normal) up to 2^-6; 1.9375 (1.875 and 2) to 2; 432 (416 and 448) to 448.
  CHECK(float_to_e4m3_bits(std::ldexp(1.0f, -10)) == 0x00);
  CHECK(float_to_e4m3_bits(3 * std::ldexp(1.0f, -10)) == 0x02);
  CHECK(float_to_e4m3_bits(15 * std::ldexp(1.0f, -10)) == 0x08);
  CHECK(float_to_e4m3_bits(1.9375f) == 0x40);
  CHECK(float_to_e4m3_bits(432.0f) == 0x7e);
  CHECK(float_to_e4m3_bits(431.9f) == 0x7d);
}

TEST_CASE("e4m3 rounds to the nearest value: a brute-force search over a sweep of floats agrees") {
  const std::vector<float> v = positive_e4m3_values();
  // Every 4099th float from +0 up to 448 (about 270000 of them), each against all 127 values.
  const std::uint32_t top = float_to_bits(448.0f);
  for (std::uint32_t u = 0; u <= top; u += 4099) {
    const float x = bits_to_float(u);
    const float r = round_to_e4m3(x);
    float best = std::abs(r - x);
    for (float c : v) best = std::min(best, std::abs(c - x));
    INFO("x = ", x, ", rounded to ", r);
    REQUIRE(std::abs(r - x) == best);
    REQUIRE(round_to_e4m3(-x) == -r);
  }
}

TEST_CASE("e4m3: zeros, values below half the smallest subnormal, saturation and NaN") {
  CHECK(float_to_e4m3_bits(0.0f) == 0x00);
  CHECK(float_to_e4m3_bits(-0.0f) == 0x80);
  CHECK(std::signbit(round_to_e4m3(-0.0f)));
  CHECK(float_to_e4m3_bits(std::ldexp(1.0f, -11)) == 0x00);
  CHECK(float_to_e4m3_bits(-std::ldexp(1.0f, -11)) == 0x80);
  CHECK(float_to_e4m3_bits(std::numeric_limits<float>::denorm_min()) == 0x00);
  CHECK(float_to_e4m3_bits(-FLT_MIN) == 0x80);
  // Past 448 every magnitude saturates, including the would-be tie at 464 and infinity.
  for (const float x : {448.0f, std::nextafter(448.0f, 1e9f), 449.0f, 463.99f, 464.0f, 465.0f, 480.0f, 1e6f, FLT_MAX,
                        std::numeric_limits<float>::infinity()}) {
    INFO("x = ", x);
    CHECK(float_to_e4m3_bits(x) == 0x7e);
    CHECK(float_to_e4m3_bits(-x) == 0xfe);
  }
  CHECK(float_to_e4m3_bits(std::nextafter(448.0f, 0.0f)) == 0x7e);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(float_to_e4m3_bits(nan) == 0x7f);
  CHECK(float_to_e4m3_bits(-nan) == 0x7f);
  CHECK(std::isnan(round_to_e4m3(nan)));
  CHECK(std::isnan(e4m3_bits_to_float(0xff)));
}

// ---- Per-head quantization -----------------------------------------------------------------------------

TEST_CASE("per-head quantization: the amax lands on 448, every value is e4m3, dequantizing is within 2^-4") {
  Shape s{.batch = 2, .heads_q = 3, .heads_kv = 3, .seq_q = 17, .seq_k = 17, .head_dim = 64};
  HostTensor x = random_qkv(s, DType::F64, 11).q;  // (2, 17, 3, 64)
  for (std::int64_t n = 0; n < 17; ++n)
    for (std::int64_t d = 0; d < 64; ++d) {
      x.at(0, n, 1, d) *= 100.0;  // head (0, 1): 100 times larger
      x.at(1, n, 2, d) = 0.0;     // head (1, 2): all zeros
    }
  const Fp8Tensor t = quantize_e4m3_per_head(x, "X");
  REQUIRE(t.q.dims == x.dims);
  REQUIRE(t.descale.size() == 6);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 3; ++h) {
      double amax = 0, qmax = 0;
      for (std::int64_t n = 0; n < 17; ++n)
        for (std::int64_t d = 0; d < 64; ++d) {
          amax = std::max(amax, std::abs(static_cast<double>(static_cast<float>(x.at(b, n, h, d)))));
          qmax = std::max(qmax, std::abs(t.q.at(b, n, h, d)));
        }
      INFO("b = ", b, ", h = ", h);
      if (amax == 0) {
        CHECK(t.descale_at(b, h) == 1.0f);
        CHECK(qmax == 0);
        continue;
      }
      CHECK(qmax == 448.0);
      CHECK(t.descale_at(b, h) == 1.0f / (448.0f / static_cast<float>(amax)));
    }
  CHECK(t.descale_at(0, 1) > 50 * t.descale_at(0, 0));  // the large head got its own scale
  const HostTensor back = dequantize(t);
  const std::vector<std::uint8_t> bytes = e4m3_bytes(t);
  for (std::size_t n = 0; n < x.data.size(); ++n) {
    const auto q = static_cast<float>(t.q.data[n]);
    REQUIRE(e4m3_bits_to_float(bytes[n]) == q);  // representable, and the bytes say so
    // Relative 2^-4 above the smallest normal (2^-6 in q units), absolute half a subnormal step below it.
    const std::int64_t b = static_cast<std::int64_t>(n) / (17 * 3 * 64), h = (static_cast<std::int64_t>(n) / 64) % 3;
    const double descale = t.descale_at(static_cast<int>(b), static_cast<int>(h));
    REQUIRE(std::abs(back.data[n] - x.data[n]) <=
            std::ldexp(1.0, -4) * std::abs(x.data[n]) + std::ldexp(1.0, -10) * descale + 1e-6 * std::abs(x.data[n]));
  }
}

TEST_CASE("per-head quantization refuses non-finite input and tensors that are not 4-d") {
  HostTensor x({1, 2, 1, 64}, 0.5);
  x.data[70] = NAN;
  CHECK_THROWS_AS(quantize_e4m3_per_head(x, "Q"), InputError);
  x.data[70] = INFINITY;
  CHECK_THROWS_AS(quantize_e4m3_per_head(x, "Q"), InputError);
  x.data[70] = 1e300;  // finite in double, not in float
  CHECK_THROWS_AS(quantize_e4m3_per_head(x, "Q"), InputError);
  CHECK_THROWS_AS(quantize_e4m3_per_head(HostTensor({2, 64}), "Q"), InputError);
}

// ---- The Hadamard rotation -----------------------------------------------------------------------------

TEST_CASE("the fast Walsh-Hadamard transform is the Sylvester Hadamard matrix") {
  // Sylvester's H_n has entry (i, j) = (-1)^popcount(i & j).
  for (int n = 1; n <= 256; n *= 2) {
    std::vector<double> x(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) x[static_cast<std::size_t>(i)] = std::sin(1.0 + 3.7 * i) + 0.1 * i;
    std::vector<double> y = x;
    fast_walsh_hadamard(y);
    for (int i = 0; i < n; ++i) {
      double want = 0;
      for (int j = 0; j < n; ++j)
        want += (std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0) * x[static_cast<std::size_t>(j)];
      INFO("n = ", n, ", i = ", i);
      REQUIRE(std::abs(y[static_cast<std::size_t>(i)] - want) <= 1e-12 * (1 + std::abs(want)));
    }
  }
  std::vector<double> bad(96, 1.0);
  CHECK_THROWS_AS(fast_walsh_hadamard(bad), InputError);
}

TEST_CASE("the rotation is orthogonal, undone by its transpose, and leaves Q K^T unchanged") {
  for (const int d : {64, 128, 256}) {
    Shape s{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 9, .seq_k = 7, .head_dim = d};
    const Qkv in = random_qkv(s, DType::F64, 100 + static_cast<std::uint64_t>(d));
    const std::uint64_t seed = 0xabcdef;
    const HostTensor rq = hadamard_rotate(in.q, seed), rk = hadamard_rotate(in.k, seed);
    const HostTensor back = hadamard_rotate_transpose(rq, seed);
    for (std::size_t n = 0; n < in.q.data.size(); ++n) REQUIRE(std::abs(back.data[n] - in.q.data[n]) <= 1e-13);
    INFO("d = ", d);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 4; ++h) {
        const int hk = h / s.group();
        for (int i = 0; i < 9; ++i) {
          double n0 = 0, n1 = 0;
          for (int c = 0; c < d; ++c) n0 += in.q.at(b, i, h, c) * in.q.at(b, i, h, c), n1 += rq.at(b, i, h, c) * rq.at(b, i, h, c);
          REQUIRE(std::abs(n1 - n0) <= 1e-13 * n0);
          for (int j = 0; j < 7; ++j) {
            double dot0 = 0, dot1 = 0, mag = 0;
            for (int c = 0; c < d; ++c) {
              dot0 += in.q.at(b, i, h, c) * in.k.at(b, j, hk, c);
              dot1 += rq.at(b, i, h, c) * rk.at(b, j, hk, c);
              mag += std::abs(in.q.at(b, i, h, c) * in.k.at(b, j, hk, c));
            }
            REQUIRE(std::abs(dot1 - dot0) <= 1e-13 * mag);
          }
        }
      }
  }
}

TEST_CASE("the rotation's signs come from the seed, and it spreads an outlier channel over all channels") {
  const std::vector<double> a = rotation_signs(128, 1), b = rotation_signs(128, 1), c = rotation_signs(128, 2);
  CHECK(a == b);
  CHECK(a != c);
  int negatives = 0;
  for (double x : a) {
    REQUIRE(std::abs(x) == 1.0);
    negatives += x < 0;
  }
  CHECK(negatives > 32);  // of 128 fair coins: below 33 or above 95 has probability ~1e-8
  CHECK(negatives < 96);
  for (const int d : {64, 128, 256}) {
    HostTensor x({1, 1, 1, d}, 0.0);
    x.data[5] = 100.0;  // one outlier channel
    const HostTensor y = hadamard_rotate(x, 7);
    for (double v : y.data) REQUIRE(std::abs(std::abs(v) - 100.0 / std::sqrt(d)) <= 1e-12);
  }
  for (const int d : {32, 96, 512}) CHECK_THROWS_AS(rotation_signs(d, 1), InputError);
  CHECK_THROWS_AS(hadamard_rotate(HostTensor({1, 1, 1, 96}), 1), InputError);
}

// ---- The emulated forward: known answers ---------------------------------------------------------------

TEST_CASE("fp8 forward, known answer: equal scores give O = mean(V) and LSE = log(S_k)") {
  // K = 0 makes every score 0, so P = 1 everywhere, stored as 448 exactly. V's values are e4m3 values and its
  // amax is 448, so its scale is 1 and V is carried exactly; with S_k = 4 the mean is exact too.
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 3, .seq_k = 4, .head_dim = 64});
  Qkv in{HostTensor(q_dims(p.shape)), HostTensor(kv_dims(p.shape), 0.0), HostTensor(kv_dims(p.shape))};
  for (std::size_t n = 0; n < in.q.data.size(); ++n) in.q.data[n] = std::cos(0.3 * static_cast<double>(n));
  const std::vector<float> v = positive_e4m3_values();
  for (std::size_t n = 0; n < in.v.data.size(); ++n) in.v.data[n] = (n % 3 ? 1 : -1) * v[(n * 37) % v.size()];
  in.v.data[0] = 448.0;
  const EmulatedForward e = fp8_attention_emulated(p, in);
  for (int i = 0; i < 3; ++i) {
    CHECK(e.out.lse.data[static_cast<std::size_t>(i)] == static_cast<double>(std::log(4.0f)));
    for (int c = 0; c < 64; ++c) {
      double mean = 0;
      for (int j = 0; j < 4; ++j) mean += in.v.at(0, j, 0, c);
      REQUIRE(e.out.o.at(0, i, 0, c) == round_to_bf16(mean / 4));
    }
  }
}

TEST_CASE("fp8 forward, known answer: P is stored as round_to_e4m3(448 P), not as P itself") {
  // Two keys: score 0 and score -t with t = ln(1 / 0.3), so P = (1, 0.3) / 1.3. V's rows are 448 e_0 and
  // 448 e_1 (exact, scale 1), so O_1 / O_0 is P's second entry as the kernel stored it: 448 * 0.3 = 134.4
  // rounds to 128, giving 128 / 448 = 0.2857 (P rounded unscaled would give 0.3125, exact P 0.3).
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 1, .seq_k = 2, .head_dim = 64});
  const double t = std::log(1 / 0.3);
  Qkv in{HostTensor(q_dims(p.shape), 0.0), HostTensor(kv_dims(p.shape), 0.0), HostTensor(kv_dims(p.shape), 0.0)};
  in.q.at(0, 0, 0, 0) = 1.0;
  in.k.at(0, 1, 0, 0) = -t / p.softmax_scale();
  in.v.at(0, 0, 0, 0) = 448.0;
  in.v.at(0, 1, 0, 1) = 448.0;
  const EmulatedForward e = fp8_attention_emulated(p, in);
  const double o0 = e.out.o.at(0, 0, 0, 0), o1 = e.out.o.at(0, 0, 0, 1);
  INFO("O_0 = ", o0, ", O_1 = ", o1);
  CHECK(std::abs(o1 / o0 - 128.0 / 448.0) <= std::ldexp(1.0, -7) * (128.0 / 448.0));  // two bf16 roundings
  CHECK(std::abs(o0 - 448.0 / 1.3) <= std::ldexp(1.0, -8) * (448.0 / 1.3) + 0.05);   // l is the unrounded sum
}

TEST_CASE("fp8 forward, causal alignments: the first row that sees one key returns that key's V") {
  for (const auto& [align, sq, sk, first] : {std::tuple{CausalAlign::TopLeft, 4, 6, 0},
                                             std::tuple{CausalAlign::BottomRight, 6, 4, 2}}) {
    Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = sq, .seq_k = sk, .head_dim = 64},
                             align);
    const Qkv in = random_qkv(p.shape, DType::F64, 5);
    const EmulatedForward e = fp8_attention_emulated(p, in);
    INFO("align = ", std::string(to_string(align)));
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < first; ++i) {  // rows that see no key
        CHECK(e.out.lse.data[static_cast<std::size_t>(h * sq + i)] == -std::numeric_limits<double>::infinity());
        for (int c = 0; c < 64; ++c) REQUIRE(e.out.o.at(0, i, h, c) == 0.0);
      }
      // One key seen: LSE = S = tau q . k on the dequantized inputs (up to fp32 rounding).
      double score = 0;
      for (int c = 0; c < 64; ++c) score += e.dequantized.q.at(0, first, h, c) * e.dequantized.k.at(0, 0, 0, c);
      score *= p.softmax_scale();
      CHECK(std::abs(e.out.lse.data[static_cast<std::size_t>(h * sq + first)] - score) <= 1e-5 * (1 + std::abs(score)));
      for (int c = 0; c < 64; ++c) {
        const double v0 = e.dequantized.v.at(0, 0, 0, c);
        REQUIRE(std::abs(e.out.o.at(0, first, h, c) - v0) <= std::ldexp(1.0, -8) * std::abs(v0) + 1e-7 * std::abs(v0));
      }
    }
  }
}

// ---- The rule ------------------------------------------------------------------------------------------

TEST_CASE("fp8 forward: within the stated bound of double attention on its dequantized inputs") {
  struct Case {
    Shape shape;
    CausalAlign causal;
    bool rotate;
  };
  const Case cases[] = {
      {{.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = 96, .seq_k = 96, .head_dim = 64}, CausalAlign::None, false},
      {{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 70, .seq_k = 130, .head_dim = 128}, CausalAlign::TopLeft, false},
      {{.batch = 1, .heads_q = 4, .heads_kv = 1, .seq_q = 130, .seq_k = 70, .head_dim = 128}, CausalAlign::BottomRight, true},
      {{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 64, .seq_k = 200, .head_dim = 256}, CausalAlign::None, true},
      {{.batch = 1, .heads_q = 3, .heads_kv = 3, .seq_q = 50, .seq_k = 50, .head_dim = 80}, CausalAlign::BottomRight, false},
  };
  for (const Case& k : cases) {
    const Problem p = make_problem(k.shape, k.causal);
    const Qkv in = random_qkv(p.shape, DType::F64, 42);
    const EmulatedForward e = fp8_attention_emulated(p, in, LowpAttentionOptions{.rotate_qk = k.rotate, .rotation_seed = 9});
    const Fp8Check c = check_fp8_emulation(p, e);
    const ErrorMetrics vs_unquantized = error_metrics(e.out.o, naive_forward<double>(p, in).o);
    INFO("d = ", k.shape.head_dim, ", causal = ", std::string(to_string(k.causal)), ", rotate = ", k.rotate, ": O max_abs ",
         c.o.max_abs, " (bound ", c.bounds.o_max_abs, "), rmse ", c.o.rmse, "; LSE max_abs ", c.lse.max_abs,
         " (bound ", c.bounds.lse_max_abs, "); vs unquantized rmse ", vs_unquantized.rmse);
    CHECK(c.passes());
    CHECK(c.o.max_abs > 0);  // P's rounding shows
    // Rounding the inputs costs more than everything the kernel rounds afterwards.
    CHECK(c.o.rmse < vs_unquantized.rmse);
  }
}

TEST_CASE("fp8 forward in the kernel's order: one block is the whole-row softmax; many blocks stay within the bound") {
  const LowpAttentionOptions kernel_order{.block_keys = e4m3_kernel_block_keys(64)};
  // S_k <= one block: the online softmax sees the whole row at once, and every value is the same.
  {
    const Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 50, .seq_k = 100, .head_dim = 64},
                                   CausalAlign::BottomRight);
    const Qkv in = random_qkv(p.shape, DType::F64, 3);
    const EmulatedForward row = fp8_attention_emulated(p, in), blocks = fp8_attention_emulated(p, in, kernel_order);
    CHECK(blocks.out.o.data == row.out.o.data);
    CHECK(blocks.out.lse.data == row.out.lse.data);
  }
  // Many blocks, with scores that grow along the keys, so the running max rises in block after block: P is rounded
  // against a different max than the row's, the outputs differ, and both forms keep to the stated bound.
  for (const CausalAlign align : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight}) {
    const Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 300, .seq_k = 700, .head_dim = 128},
                                   align);
    Qkv in = random_qkv(p.shape, DType::F64, 11);
    for (std::int64_t j = 0; j < 700; ++j)
      for (std::int64_t h = 0; h < 2; ++h) in.k.at(0, j, h, 0) += 0.02 * static_cast<double>(j);
    for (std::int64_t i = 0; i < 300; ++i)
      for (std::int64_t h = 0; h < 2; ++h) in.q.at(0, i, h, 0) = 1.0 + std::abs(in.q.at(0, i, h, 0));
    const EmulatedForward row = fp8_attention_emulated(p, in), blocks = fp8_attention_emulated(p, in, kernel_order);
    const Fp8Check c_row = check_fp8_emulation(p, row), c_blocks = check_fp8_emulation(p, blocks);
    INFO("causal = ", std::string(to_string(align)), ": O max_abs whole row ", c_row.o.max_abs, ", in blocks ",
         c_blocks.o.max_abs, " (bound ", c_blocks.bounds.o_max_abs, ")");
    CHECK(c_row.passes());
    CHECK(c_blocks.passes());
    CHECK(blocks.out.o.data != row.out.o.data);
    CHECK(c_blocks.o.max_abs <= 2 * c_row.o.max_abs);  // the same arithmetic, the same error, in another order
  }
  const Problem p = make_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 4, .seq_k = 4, .head_dim = 64});
  CHECK_THROWS_AS((void)fp8_attention_emulated(p, random_qkv(p.shape, DType::F64, 1), LowpAttentionOptions{.block_keys = -1}),
                  InputError);
}

TEST_CASE("fp8 forward, GQA: each query head reads its own group's K and V") {
  // The two kv heads differ by far more than the bound: a query head reading the other group's V misses it.
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 40, .seq_k = 40, .head_dim = 64});
  Qkv in = random_qkv(p.shape, DType::F64, 8);
  for (std::int64_t j = 0; j < 40; ++j)
    for (std::int64_t c = 0; c < 64; ++c) in.v.at(0, j, 1, c) += 20.0;
  const EmulatedForward e = fp8_attention_emulated(p, in);
  const Fp8Check c = check_fp8_emulation(p, e);
  INFO("O max_abs ", c.o.max_abs, ", bound ", c.bounds.o_max_abs);
  CHECK(c.bounds.o_max_abs < 5.0);
  CHECK(c.passes());
}

TEST_CASE("fp8 forward: the rotation cuts the error on inputs with outlier channels; bf16 beats both") {
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 256, .seq_k = 256, .head_dim = 128});
  Qkv in = random_qkv(p.shape, DType::F64, 77);
  // Four outlier channels 30x larger in Q and K, then both divided by their root mean square, so that the scores
  // keep a spread of a few units (left as drawn, softmax would be nearly one-hot).
  for (HostTensor* t : {&in.q, &in.k}) {
    scale_channels(*t, {3, 40, 77, 101}, 30.0);
    const double rms = std::sqrt(std::inner_product(t->data.begin(), t->data.end(), t->data.begin(), 0.0) /
                                 static_cast<double>(t->data.size()));
    for (double& x : t->data) x /= rms;
  }
  const HostTensor ref = naive_forward<double>(p, in).o;
  const double plain = error_metrics(fp8_attention_emulated(p, in).out.o, ref).rmse;
  const double rotated =
      error_metrics(fp8_attention_emulated(p, in, LowpAttentionOptions{.rotate_qk = true, .rotation_seed = 3}).out.o, ref).rmse;
  const double bf16 = error_metrics(bf16_attention_emulated(p, in).out.o, ref).rmse;
  INFO("rmse: fp8 ", plain, ", fp8 rotated ", rotated, ", bf16 ", bf16);
  CHECK(rotated < plain / 2);  // about 4x on these inputs (tools/fp8_error_study.cpp)
  CHECK(bf16 < rotated);
}

TEST_CASE("bf16 forward: its inputs are the bf16-rounded ones, and P's rounding is the only other large error") {
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 64, .seq_k = 80, .head_dim = 64},
                           CausalAlign::BottomRight);
  const Qkv in = random_qkv(p.shape, DType::F64, 4);
  const EmulatedForward e = bf16_attention_emulated(p, in);
  for (std::size_t n = 0; n < in.v.data.size(); ++n) REQUIRE(e.dequantized.v.data[n] == round_to_bf16(in.v.data[n]));
  for (std::size_t n = 0; n < in.q.data.size(); ++n) REQUIRE(e.dequantized.q.data[n] == round_to_bf16(in.q.data[n]));
  const ForwardOut ref = naive_forward<double>(p, e.dequantized);
  // P rounded to bf16 (2^-8 relative) and O rounded to bf16 (2^-8): at most 2^-7 max|V| plus fp32 slack.
  const ErrorMetrics err = error_metrics(e.out.o, ref.o);
  INFO("max_abs ", err.max_abs);
  CHECK(err.max_abs <= (std::ldexp(1.0, -7) + 1e-4) * max_abs(e.dequantized.v));
  CHECK(err.max_abs > 0);
}

// ---- Errors and bad input ------------------------------------------------------------------------------

TEST_CASE("error_metrics: max abs and RMSE; equal infinities are no error; NaN poisons; dims must match") {
  HostTensor a({4}, 0.0), b({4}, 0.0);
  a.data = {1, 2, -INFINITY, 4};
  b.data = {1, 2.5, -INFINITY, 3};
  const ErrorMetrics e = error_metrics(a, b);
  CHECK(e.max_abs == 1.0);
  CHECK(e.rmse == doctest::Approx(std::sqrt((0.25 + 1.0) / 4)));
  b.data[2] = 0;
  CHECK(std::isinf(error_metrics(a, b).max_abs));
  a.data[0] = NAN;
  CHECK(std::isnan(error_metrics(a, b).rmse));
  CHECK_THROWS_AS(error_metrics(HostTensor({4}), HostTensor({2, 2})), InputError);
}

TEST_CASE("the emulated forwards refuse bad input with an InputError") {
  Problem p = make_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 96});
  Qkv in = random_qkv(p.shape, DType::F64, 1);
  CHECK_NOTHROW(fp8_attention_emulated(p, in));
  CHECK_THROWS_AS(fp8_attention_emulated(p, in, LowpAttentionOptions{.rotate_qk = true}), InputError);  // d = 96
  Problem dropout = p;
  dropout.options.dropout_p = 0.1;
  CHECK_THROWS_AS(fp8_attention_emulated(dropout, in), InputError);
  Problem wrong = p;
  wrong.shape.seq_k = 9;  // K and V have 8 rows
  CHECK_THROWS_AS(fp8_attention_emulated(wrong, in), InputError);
  CHECK_THROWS_AS(bf16_attention_emulated(wrong, in), InputError);
  in.k.data[3] = NAN;
  CHECK_THROWS_AS(fp8_attention_emulated(p, in), InputError);
  CHECK_THROWS_AS(bf16_attention_emulated(p, in), InputError);
}

// ---- The kernel's operands and its rule ------------------------------------------------------------------

TEST_CASE("quantize_e4m3_qkv: the kernel's bytes and descales are the emulation's operands, per head") {
  // GQA: Q is scaled per (b, query head), K and V per (b, kv head).
  const Shape s{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 10, .seq_k = 12, .head_dim = 16};
  Qkv in = random_qkv(s, DType::F64, 21);
  for (std::int64_t i = 0; i < 10; ++i) in.q.at(1, i, 3, 5) *= 30.0;  // one head with a larger amax than the rest
  const E4m3Qkv x = quantize_e4m3_qkv(in);
  REQUIRE(x.q.size() == std::size_t(2 * 10 * 4 * 16));
  REQUIRE(x.k.size() == std::size_t(2 * 12 * 2 * 16));
  REQUIRE(x.v.size() == x.k.size());
  REQUIRE(x.q_descale.size() == 8u);
  REQUIRE(x.k_descale.size() == 4u);
  REQUIRE(x.v_descale.size() == 4u);
  const Fp8Tensor q = quantize_e4m3_per_head(in.q, "Q"), v = quantize_e4m3_per_head(in.v, "V");
  CHECK(x.q == e4m3_bytes(q));
  CHECK(x.q_descale == q.descale);
  CHECK(x.v == e4m3_bytes(v));
  CHECK(x.v_descale == v.descale);
  CHECK(x.q_descale[1 * 4 + 3] > 10 * x.q_descale[1 * 4 + 2]);  // the loud head has its own scale
  // Byte times descale is exactly what the emulation computes on: the kernel and the emulation share operands.
  const Problem p = make_problem(s);
  const EmulatedForward e = fp8_attention_emulated(p, in);
  const auto check_operand = [](const std::vector<std::uint8_t>& bytes, const std::vector<float>& descale,
                                const HostTensor& dequantized) {
    const auto H = dequantized.dims[2], D = dequantized.dims[3], S = dequantized.dims[1];
    int wrong = 0;
    for (std::size_t n = 0; n < bytes.size(); ++n) {
      const auto b = std::int64_t(n) / (S * H * D), h = std::int64_t(n) / D % H;
      wrong += double(e4m3_bits_to_float(bytes[n])) * descale[std::size_t(b * H + h)] != dequantized.data[n];
    }
    return wrong;
  };
  CHECK(check_operand(x.q, x.q_descale, e.dequantized.q) == 0);
  CHECK(check_operand(x.k, x.k_descale, e.dequantized.k) == 0);
  CHECK(check_operand(x.v, x.v_descale, e.dequantized.v) == 0);
  // Non-finite input: one sentence naming the tensor.
  in.v.at(0, 3, 1, 2) = INFINITY;
  CHECK_THROWS_WITH_AS(quantize_e4m3_qkv(in), doctest::Contains("V at (b, s, h, d) = (0, 3, 1, 2)"), InputError);
}

TEST_CASE("check_fp8_kernel: the emulation itself passes, a planted wrong O or LSE fails, NaN fails") {
  struct Case {
    Shape shape;
    CausalAlign causal;
  };
  const Case cases[] = {
      {{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 48, .seq_k = 64, .head_dim = 128}, CausalAlign::None},
      // seq_q > seq_k bottom-right: the first rows see no key (O = 0, LSE = -inf on both sides, no error).
      {{.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = 40, .seq_k = 24, .head_dim = 256}, CausalAlign::BottomRight},
  };
  for (const Case& k : cases) {
    const Problem p = make_problem(k.shape, k.causal);
    const Qkv in = random_qkv(p.shape, DType::F64, 77);
    const EmulatedForward e = fp8_attention_emulated(p, in);
    CAPTURE(k.shape.head_dim);

    // The emulation as the kernel: its errors are the emulation's, within the rule (2x), and it passes.
    const Fp8KernelCheck same = check_fp8_kernel(p, e, e.out);
    INFO("emulation: O max_abs ", same.emulation.o.max_abs, ", LSE max_abs ", same.emulation.lse.max_abs);
    CHECK(same.emulation.passes());  // the emulation within its own worst-case bound
    CHECK(same.o.max_abs == same.emulation.o.max_abs);
    CHECK(same.lse.max_abs == same.emulation.lse.max_abs);
    CHECK(same.o_limit == kFp8KernelFactor * same.emulation.o.max_abs);
    CHECK(same.o.max_abs > 0);  // P's rounding shows, so the rule is not a demand for exactness
    CHECK(same.passes());

    // O 5% too large: fails on O, not on the LSE.
    ForwardOut loud = e.out;
    for (double& x : loud.o.data) x *= 1.05;
    const Fp8KernelCheck c_loud = check_fp8_kernel(p, e, loud);
    INFO("O x 1.05: max_abs ", c_loud.o.max_abs, " > limit ", c_loud.o_limit);
    CHECK_FALSE(c_loud.o_passes());
    CHECK(c_loud.lse_passes());
    CHECK_FALSE(c_loud.passes());

    // The LSE: a shift inside the slack passes, one past the whole limit fails (-inf rows stay -inf).
    double max_lse = 0;
    for (double x : same.emulation.reference.lse.data)
      if (std::isfinite(x)) max_lse = std::max(max_lse, std::abs(x));
    const double slack = kFp8LseSlack * (1 + max_lse);
    CHECK(same.lse_limit == doctest::Approx(kFp8KernelFactor * same.emulation.lse.max_abs + slack));
    const auto shifted = [&](double by) {
      ForwardOut f = e.out;
      for (double& x : f.lse.data) x += by;
      return check_fp8_kernel(p, e, f);
    };
    CHECK(shifted(0.5 * slack).lse_passes());
    const Fp8KernelCheck c_far = shifted(3 * same.emulation.lse.max_abs + 1.01 * slack);
    CHECK_FALSE(c_far.lse_passes());
    CHECK(c_far.o_passes());
    CHECK_FALSE(c_far.passes());

    // One NaN anywhere fails.
    ForwardOut nan_o = e.out;
    nan_o.o.data[nan_o.o.data.size() / 2] = NAN;
    CHECK_FALSE(check_fp8_kernel(p, e, nan_o).o_passes());
    ForwardOut nan_lse = e.out;
    nan_lse.lse.data.back() = NAN;
    CHECK_FALSE(check_fp8_kernel(p, e, nan_lse).lse_passes());
  }
  // An output of the wrong dims is one sentence, not a comparison.
  const Problem p = make_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 128});
  const EmulatedForward e = fp8_attention_emulated(p, random_qkv(p.shape, DType::F64, 3));
  ForwardOut wrong = e.out;
  wrong.o = HostTensor({1, 8, 1, 64});
  CHECK_THROWS_WITH_AS(check_fp8_kernel(p, e, wrong), doctest::Contains("the FP8 kernel's outputs have dims"), InputError);
}
