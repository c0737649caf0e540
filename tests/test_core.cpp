// src/core: .npy I/O (uint8 too, for e4m3 bytes), fp16/bf16 rounding (e4m3 refused), Philox dropout draws, the
// causal mask, the tolerance rule and problem validation. Everything here is exact: known answers, not "close
// enough".
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "core/layout.hpp"
#include "core/mask.hpp"
#include "core/npy.hpp"
#include "core/philox.hpp"
#include "core/problem.hpp"
#include "core/scratch.hpp"
#include "core/tensor.hpp"
#include "core/tolerance.hpp"

using namespace flashlab;

namespace {

// A scratch file in the temp folder, removed when the test ends.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name) {
    path = (std::filesystem::temp_directory_path() / ("flashlab_core_" + std::to_string(::getpid()) + "_" + name))
               .string();
  }
  ~TempFile() { std::remove(path.c_str()); }
  void write(const std::string& bytes) const {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string read() const {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

// A .npy file built by hand: version, header dict, and data bytes.
std::string npy_bytes(int major, const std::string& dict, const std::string& data) {
  std::string header = dict;
  const std::size_t prelude = major == 1 ? 10 : 12;
  while ((prelude + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = header.size();
  for (std::size_t n = 0; n < prelude - 8; ++n) out += static_cast<char>((len >> (8 * n)) & 0xff);
  return out + header + data;
}

std::string f32_bytes(std::initializer_list<float> values) {
  std::string out;
  for (float f : values) {
    const std::uint32_t u = float_to_bits(f);
    for (int n = 0; n < 4; ++n) out += static_cast<char>((u >> (8 * n)) & 0xff);
  }
  return out;
}

HostTensor random_tensor(std::vector<std::int64_t> dims, DType dtype, unsigned seed) {
  HostTensor t(std::move(dims));
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (double& x : t.data) x = normal(rng);
  if (!t.data.empty()) t.data[0] = -0.0;  // the sign of zero survives too
  round_to(t, dtype);
  return t;
}

// Expects read_npy to throw an InputError that names the file and says `what`.
void check_rejected(const TempFile& f, const std::string& what) {
  try {
    read_npy(f.path);
    FAIL("read_npy accepted a bad file: expected '" << what << "'");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find(f.path) != std::string::npos, msg);
    CHECK_MESSAGE(msg.find(what) != std::string::npos, msg);
  }
}

}  // namespace

TEST_CASE("npy round trip keeps dims, dtype and every value exactly") {
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {1}, {7}, {3, 5}, {2, 3, 4, 5}, {0, 4}, {1, 33, 2, 64}};
  for (DType dtype : {DType::F64, DType::F32, DType::F16}) {
    for (const auto& dims : shapes) {
      SUBCASE((std::string(to_string(dtype)) + " " + HostTensor(dims).dims_string()).c_str()) {
        const HostTensor t = random_tensor(dims, dtype, 17);
        TempFile f("roundtrip.npy");
        write_npy(f.path, t, dtype);
        const NpyArray back = read_npy(f.path);
        CHECK(back.dtype == dtype);
        CHECK(back.tensor.dims == t.dims);
        REQUIRE(back.tensor.data.size() == t.data.size());
        for (std::size_t n = 0; n < t.data.size(); ++n) {
          CHECK(back.tensor.data[n] == t.data[n]);
          CHECK(std::signbit(back.tensor.data[n]) == std::signbit(t.data[n]));
        }
        // The data starts on a 64-byte boundary, as NumPy writes it.
        const std::string bytes = f.read();
        CHECK((bytes.size() - t.data.size() * dtype_bytes(dtype)) % 64 == 0);
      }
    }
  }
}

TEST_CASE("npy writes the bytes NumPy writes and reads infinities and NaN") {
  HostTensor t({2, 3});
  t.data = {1, 2, 3, -INFINITY, INFINITY, NAN};
  TempFile f("layout.npy");
  write_npy(f.path, t, DType::F32);
  const std::string expected_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  CHECK(f.read() == npy_bytes(1, expected_dict, f32_bytes({1, 2, 3, -INFINITY, INFINITY, NAN})));
  const NpyArray back = read_npy(f.path);
  CHECK(back.tensor.data[3] == -INFINITY);
  CHECK(back.tensor.data[4] == INFINITY);
  CHECK(std::isnan(back.tensor.data[5]));

  HostTensor one({3});
  TempFile g("tuple1.npy");
  write_npy(g.path, one, DType::F64);
  CHECK(g.read().find("'shape': (3,), }") != std::string::npos);  // Python's 1-tuple
}

TEST_CASE("npy reads format versions 2.0 and 3.0 and free header spacing") {
  for (int major : {2, 3}) {
    TempFile f(major == 2 ? "v2.npy" : "v3.npy");
    f.write(npy_bytes(major, "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(1,2,)}", f32_bytes({0.5f, -4.0f})));
    const NpyArray a = read_npy(f.path);
    CHECK(a.dtype == DType::F32);
    CHECK(a.tensor.dims == std::vector<std::int64_t>{1, 2});
    CHECK(a.tensor.data == std::vector<double>{0.5, -4.0});
  }
}

TEST_CASE("npy rejects malformed and unsupported files with a sentence naming the file") {
  const std::string good_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  TempFile f("bad.npy");
  SUBCASE("missing file") { check_rejected(f, "cannot be opened"); }
  SUBCASE("bad magic") {
    f.write("\x93NUMPZ" + npy_bytes(1, good_dict, f32_bytes({1, 2})).substr(6));
    check_rejected(f, "not a .npy file");
  }
  SUBCASE("empty file") {
    f.write("");
    check_rejected(f, "not a .npy file");
  }
  SUBCASE("unknown version") {
    std::string b = npy_bytes(1, good_dict, f32_bytes({1, 2}));
    b[6] = 4;
    f.write(b);
    check_rejected(f, "version 4.0");
  }
  SUBCASE("truncated header") {
    f.write(npy_bytes(1, good_dict, "").substr(0, 40));
    check_rejected(f, "truncated inside its .npy header");
  }
  SUBCASE("truncated data") {
    f.write(npy_bytes(1, good_dict, f32_bytes({1, 2})).substr(0, 128 + 7));
    check_rejected(f, "truncated");
  }
  SUBCASE("data longer than the shape") {
    f.write(npy_bytes(1, good_dict, f32_bytes({1, 2, 3})));
    check_rejected(f, "after the data");
  }
  SUBCASE("header is not a dict") {
    f.write(npy_bytes(1, "not a dict", f32_bytes({1, 2})));
    check_rejected(f, "malformed .npy header");
  }
  SUBCASE("header without shape") {
    f.write(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False}", f32_bytes({1, 2})));
    check_rejected(f, "malformed .npy header");
  }
  SUBCASE("negative extent") {
    f.write(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f32_bytes({1, 2})));
    check_rejected(f, "malformed .npy header");
  }
  SUBCASE("big-endian") {
    f.write(npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f32_bytes({1, 2})));
    check_rejected(f, "big-endian");
  }
  SUBCASE("Fortran order") {
    f.write(npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", f32_bytes({1, 2})));
    check_rejected(f, "Fortran");
  }
  SUBCASE("integer dtype") {
    f.write(npy_bytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", f32_bytes({1, 2})));
    check_rejected(f, "dtype '<i4'");
  }
  SUBCASE("complex dtype") {
    f.write(npy_bytes(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", f32_bytes({1, 2})));
    check_rejected(f, "dtype '<c8'");
  }
}

TEST_CASE("npy refuses to write bf16, which NumPy has no dtype for") {
  TempFile f("bf16.npy");
  CHECK_THROWS_WITH_AS(write_npy(f.path, HostTensor({2}), DType::BF16), doctest::Contains("bfloat16"), InputError);
}

TEST_CASE("f16 conversions: exact values, ties to even, subnormals, inf and NaN") {
  CHECK(float_to_f16_bits(1.0f) == 0x3c00);
  CHECK(float_to_f16_bits(-2.0f) == 0xc000);
  CHECK(float_to_f16_bits(-0.0f) == 0x8000);
  CHECK(float_to_f16_bits(65504.0f) == 0x7bff);                  // largest finite
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);     // smallest normal
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);     // smallest subnormal
  CHECK(float_to_f16_bits(std::ldexp(1023.0f, -24)) == 0x03ff);  // largest subnormal
  // Ties go to the even neighbour.
  CHECK(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // 1 | 1+2^-10: even is 1
  CHECK(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // 1+2^-10 | 1+2^-9: even is 0x3c02
  CHECK(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -23)) == 0x3c01);  // past a tie: up
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000);                                 // 0 | 2^-24: even is 0
  CHECK(float_to_f16_bits(std::ldexp(3.0f, -25)) == 0x0002);                                 // 2^-24 | 2^-23
  CHECK(float_to_f16_bits(std::ldexp(2047.0f, -25)) == 0x0400);  // subnormal carries into normal
  CHECK(float_to_f16_bits(65519.0f) == 0x7bff);                  // below the tie with 65536
  CHECK(float_to_f16_bits(65520.0f) == 0x7c00);                  // the tie rounds to inf (even)
  CHECK(float_to_f16_bits(INFINITY) == 0x7c00);
  CHECK(float_to_f16_bits(-INFINITY) == 0xfc00);
  const std::uint16_t nan = float_to_f16_bits(NAN);
  CHECK((nan & 0x7c00) == 0x7c00);
  CHECK((nan & 0x03ff) != 0);

  CHECK(f16_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(f16_bits_to_float(0x7bff) == 65504.0f);
  CHECK(f16_bits_to_float(0xfc00) == -INFINITY);
  CHECK(std::isnan(f16_bits_to_float(0x7e00)));
  CHECK(round_to_f16(0.1) == 0.0999755859375);

  // Every non-NaN pattern survives bits -> float -> bits.
  int mismatches = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x03ff)) continue;
    if (float_to_f16_bits(f16_bits_to_float(bits)) != bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bf16 conversions: exact values, ties to even, subnormals, inf and NaN") {
  CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
  CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);        // tie: even is 1
  CHECK(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);    // tie: even is 0x3f82
  CHECK(float_to_bf16_bits(std::ldexp(1.0f, -133)) == 0x0001);             // smallest bf16 subnormal
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest finite
  CHECK(float_to_bf16_bits(INFINITY) == 0x7f80);
  CHECK(float_to_bf16_bits(-INFINITY) == 0xff80);
  const std::uint16_t nan = float_to_bf16_bits(NAN);
  CHECK((nan & 0x7f80) == 0x7f80);
  CHECK((nan & 0x007f) != 0);
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  CHECK(std::isnan(bf16_bits_to_float(float_to_bf16_bits(bits_to_float(0x7f800001u)))));
  CHECK(bf16_bits_to_float(0x7f7f) == 0x1.fep127f);
  CHECK(round_to_bf16(0.1) == 0.10009765625);

  int mismatches = 0;
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7f80) == 0x7f80 && (bits & 0x007f)) continue;
    if (float_to_bf16_bits(bf16_bits_to_float(bits)) != bits) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("round_to rounds a tensor to each dtype") {
  HostTensor t({3});
  t.data = {0.1, 1.0 / 3.0, 70000.0};
  HostTensor f32 = t, f16 = t, bf16 = t, f64 = t;
  round_to(f64, DType::F64);
  round_to(f32, DType::F32);
  round_to(f16, DType::F16);
  round_to(bf16, DType::BF16);
  CHECK(f64.data == t.data);
  CHECK(f32.data[0] == static_cast<double>(0.1f));
  CHECK(f16.data[2] == INFINITY);  // beyond f16's 65504
  CHECK(bf16.data[2] == 70144.0);  // bf16 keeps 8 significant bits
}

TEST_CASE("Philox4x32-10 matches Random123's known-answer vectors") {
  // Random123 tests/kat_vectors: counter (4 words), key (2 words) -> output (4 words). Our seed is the
  // key: low 32 bits first.
  struct Kat {
    Philox4 counter;
    std::uint32_t key0, key1;
    Philox4 expected;
  };
  const Kat kats[] = {
      {.counter = {{0, 0, 0, 0}},
       .key0 = 0,
       .key1 = 0,
       .expected = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {.counter = {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       .key0 = 0xffffffff,
       .key1 = 0xffffffff,
       .expected = {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {.counter = {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       .key0 = 0xa4093822,
       .key1 = 0x299f31d0,
       .expected = {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Kat& k : kats) {
    const std::uint64_t seed = (std::uint64_t(k.key1) << 32) | k.key0;
    const Philox4 r = philox4x32_10(k.counter, seed);
    for (int n = 0; n < 4; ++n) CHECK(r.x[n] == k.expected.x[n]);
  }
}

TEST_CASE("dropout threshold and drop rate") {
  CHECK(dropout_threshold(0.0) == 0u);  // every draw >= 0: nothing dropped
  CHECK(dropout_threshold(0.5) == 0x80000000u);
  CHECK(dropout_threshold(0.25) == 0x40000000u);
  CHECK(dropout_threshold(1.0) == 0xffffffffu);

  // One Philox call covers four neighbouring columns.
  const std::uint64_t seed = 0x1234abcd5678ull;
  const std::uint32_t t = dropout_threshold(0.3);
  for (int col = 0; col < 8; ++col)
    CHECK(dropout_keep(seed, t, 1, 2, 3, col) == (dropout_draws4(seed, 1, 2, 3, col >> 2).x[col & 3] >= t));

  for (double p : {0.1, 0.5, 0.9}) {
    const std::uint32_t threshold = dropout_threshold(p);
    const int rows = 200, cols = 1000;
    long dropped = 0, differs_from_other_head = 0;
    for (int row = 0; row < rows; ++row) {
      for (int col = 0; col < cols; ++col) {
        const bool keep = dropout_keep(seed, threshold, 0, 0, row, col);
        dropped += !keep;
        differs_from_other_head += keep != dropout_keep(seed, threshold, 0, 1, row, col);
      }
    }
    const double n = double(rows) * cols;
    const double sigma = std::sqrt(p * (1 - p) / n);
    CHECK(std::abs(dropped / n - p) < 5 * sigma);
    // Independent masks per head: they disagree with probability 2p(1-p).
    CHECK(std::abs(differs_from_other_head / n - 2 * p * (1 - p)) < 0.01);
  }
}

TEST_CASE("causal mask in both alignments, element- and tile-wise") {
  using enum CausalAlign;
  // Top-left (PyTorch is_causal): query i sees keys 0..i.
  CHECK(last_visible_key(TopLeft, 0, 3, 5) == 0);
  CHECK(last_visible_key(TopLeft, 2, 3, 5) == 2);
  CHECK(last_visible_key(TopLeft, 4, 5, 3) == 2);  // clamped to the last key
  // Bottom-right (FlashAttention >= 2.1): the last query sees every key.
  CHECK(last_visible_key(BottomRight, 0, 3, 5) == 2);
  CHECK(last_visible_key(BottomRight, 2, 3, 5) == 4);
  CHECK(last_visible_key(BottomRight, 0, 5, 3) < 0);  // sees nothing
  CHECK(last_visible_key(BottomRight, 1, 5, 3) < 0);
  CHECK(last_visible_key(BottomRight, 2, 5, 3) == 0);
  CHECK(last_visible_key(None, 0, 5, 3) == 2);
  CHECK(!is_masked(None, 0, 2, 5, 3));
  CHECK(is_masked(TopLeft, 1, 2, 4, 4));
  CHECK(!is_masked(TopLeft, 2, 2, 4, 4));

  // The tile predicates agree with the element mask on every tile of odd-shaped problems.
  for (CausalAlign align : {None, TopLeft, BottomRight}) {
    for (auto [sq, sk] : {std::pair{7, 7}, {5, 11}, {11, 5}, {1, 9}, {9, 1}}) {
      for (int br : {1, 2, 3}) {
        for (int bc : {1, 2, 4}) {
          for (int r0 = 0; r0 < sq; r0 += br) {
            for (int c0 = 0; c0 < sk; c0 += bc) {
              const int r1 = std::min(r0 + br, sq), c1 = std::min(c0 + bc, sk);
              bool all = true, any = false;
              for (int r = r0; r < r1; ++r)
                for (int c = c0; c < c1; ++c) {
                  const bool m = is_masked(align, r, c, sq, sk);
                  all = all && m;
                  any = any || m;
                }
              CHECK(tile_fully_masked(align, r0, r1, c0, sq, sk) == all);
              CHECK(tile_needs_mask(align, r0, c1, sq, sk) == any);
            }
          }
        }
      }
      // first_row_seeing_key is the smallest unmasked row of each key's column (seq_q or more: none).
      for (int c = 0; c < sk; ++c) {
        int first = sq;
        for (int r = sq - 1; r >= 0; --r)
          if (!is_masked(align, r, c, sq, sk)) first = r;
        const int got = first_row_seeing_key(align, c, sq, sk);
        CHECK((first < sq ? got == first : got >= sq));
      }
    }
  }
}

TEST_CASE("tolerance rule: NaN fails, matching infinities pass, per-dtype bounds") {
  HostTensor ref({4});
  ref.data = {1.0, -2.0, 3.0, -INFINITY};

  SUBCASE("NaN never passes, even with a huge bound") {
    HostTensor out = ref;
    out.data[1] = NAN;
    const ErrorStats e = compare(out, ref);
    CHECK(e.has_nan);
    CHECK_FALSE(Bound{false, 1e300, ""}.passes(e));
    CHECK_FALSE(tolerance(DType::F32, Quantity::Forward, e, nullptr).passes(e));
  }
  SUBCASE("matching infinities count as equal, mismatched ones do not") {
    const ErrorStats same = compare(ref, ref);
    CHECK(same.max_abs == 0);
    CHECK(same.rel == 0);
    CHECK(same.ref_max == 3.0);
    CHECK(tolerance(DType::F64, Quantity::Forward, same, nullptr).passes(same));
    HostTensor out = ref;
    out.data[3] = INFINITY;
    const ErrorStats flipped = compare(out, ref);
    CHECK(std::isinf(flipped.max_abs));
    CHECK_FALSE(tolerance(DType::F32, Quantity::Forward, flipped, nullptr).passes(flipped));
    out.data[3] = 0.0;  // a finite value where the reference is -inf
    CHECK_FALSE(tolerance(DType::F32, Quantity::Forward, compare(out, ref), nullptr).passes(compare(out, ref)));
  }
  SUBCASE("a shape mismatch never passes") {
    const ErrorStats e = compare(HostTensor({3}), ref);
    CHECK_FALSE(tolerance(DType::F64, Quantity::Forward, e, nullptr).passes(e));
  }
  SUBCASE("f32 and f64 bound the relative error") {
    HostTensor base({1000}), out({1000});
    for (int n = 0; n < 1000; ++n) base.data[n] = std::sin(n + 1.0);
    const auto perturbed = [&](double rel) {
      out = base;
      for (double& x : out.data) x *= 1 + rel;  // ||out - ref|| / ||ref|| == rel
      return compare(out, base);
    };
    const ErrorStats small = perturbed(0.5e-5), large = perturbed(2e-5);
    CHECK(small.rel == doctest::Approx(0.5e-5));
    CHECK(tolerance(DType::F32, Quantity::Forward, small, nullptr).passes(small));
    CHECK_FALSE(tolerance(DType::F32, Quantity::Forward, large, nullptr).passes(large));
    const ErrorStats tiny = perturbed(0.5e-12), bigger = perturbed(2e-12);
    CHECK(tolerance(DType::F64, Quantity::Gradient, tiny, nullptr).passes(tiny));
    CHECK_FALSE(tolerance(DType::F64, Quantity::Gradient, bigger, nullptr).passes(bigger));
  }
  SUBCASE("f16/bf16: 2x the low-precision baseline forward, 3x for gradients, plus slack") {
    ErrorStats baseline;
    baseline.max_abs = 1e-3;
    ErrorStats e;
    e.ref_max = 4.0;  // slack = 1e-5 * max(1, 4)
    for (DType dtype : {DType::F16, DType::BF16}) {
      const Bound fwd = tolerance(dtype, Quantity::Forward, e, &baseline);
      const Bound grad = tolerance(dtype, Quantity::Gradient, e, &baseline);
      CHECK_FALSE(fwd.uses_rel);
      CHECK(fwd.limit == doctest::Approx(2e-3 + 4e-5));
      CHECK(grad.limit == doctest::Approx(3e-3 + 4e-5));
      e.max_abs = 2.5e-3;  // between the two bounds
      CHECK_FALSE(fwd.passes(e));
      CHECK(grad.passes(e));
      e.max_abs = 0;
    }
    // No baseline (or a NaN one) leaves only the slack: never a free pass.
    ErrorStats nan_baseline;
    nan_baseline.has_nan = true;
    nan_baseline.max_abs = NAN;
    CHECK(tolerance(DType::F16, Quantity::Forward, e, &nan_baseline).limit == doctest::Approx(4e-5));
    CHECK(tolerance(DType::F16, Quantity::Forward, e, nullptr).limit == doctest::Approx(4e-5));
  }
}

TEST_CASE("validate() rejects bad problems with one sentence saying what is supported") {
  Problem p;
  p.shape = Shape{.batch = 2, .heads_q = 8, .heads_kv = 2, .seq_q = 16, .seq_k = 24, .head_dim = 64};
  CHECK_NOTHROW(validate(p));
  const auto rejects = [&](auto change, const char* what) {
    Problem bad = p;
    change(bad);
    CHECK_THROWS_WITH_AS(validate(bad), doctest::Contains(what), InputError);
  };
  rejects([](Problem& q) { q.shape.batch = 0; }, "batch must be at least 1");
  rejects([](Problem& q) { q.shape.seq_k = -3; }, "seq_k must be at least 1");
  rejects([](Problem& q) { q.shape.head_dim = 257; }, "head dims 1..256");
  rejects([](Problem& q) { q.shape.heads_q = 6, q.shape.heads_kv = 4; }, "multiple of heads_kv");
  rejects([](Problem& q) { q.options.dropout_p = 1.0; }, "[0, 1)");
  rejects([](Problem& q) { q.options.dropout_p = -0.1; }, "[0, 1)");
  rejects([](Problem& q) { q.options.dropout_p = NAN; }, "[0, 1)");
  rejects([](Problem& q) { q.options.scale = INFINITY; }, "scale must be finite");

  CHECK(p.softmax_scale() == doctest::Approx(0.125));
  p.options.scale = 0.5;
  CHECK(p.softmax_scale() == 0.5);
}

TEST_CASE("e4m3 is a dtype of its own: named, one byte, never rounded to or written as a float") {
  for (const char* name : {"e4m3", "E4M3", "fp8", "f8", "fp8_e4m3", "float8_e4m3", "float8_e4m3fn", "f8e4m3fn"}) {
    CAPTURE(name);
    CHECK(parse_dtype(name) == DType::E4M3);
  }
  CHECK(std::string(to_string(DType::E4M3)) == "e4m3");
  CHECK(parse_dtype(to_string(DType::E4M3)) == DType::E4M3);
  // e5m2 is FP8 too, but no kernel here takes it: refused, naming e4m3 among what is supported.
  CHECK_THROWS_WITH_AS(parse_dtype("e5m2"), doctest::Contains("and e4m3 (fp8)"), InputError);
  CHECK(dtype_bytes(DType::F64) == 8);
  CHECK(dtype_bytes(DType::F32) == 4);
  CHECK(dtype_bytes(DType::F16) == 2);
  CHECK(dtype_bytes(DType::BF16) == 2);
  CHECK(dtype_bytes(DType::E4M3) == 1);

  // Rounding to e4m3 without a scale per head is refused (quantize_e4m3_per_head does it with one), and so are
  // inputs drawn "in e4m3", which would be rounded that way.
  HostTensor t({2, 2});
  t.data = {0.1, -3, 500, 1e-4};
  const HostTensor before = t;
  CHECK_THROWS_WITH_AS(round_to(t, DType::E4M3), doctest::Contains("quantize_e4m3_per_head"), InputError);
  CHECK(t.data == before.data);  // untouched
  CHECK_THROWS_AS(random_qkv(Shape{}, DType::E4M3, 1), InputError);

  // No .npy float type for it (the bytes go out as uint8, below), and no f16/bf16 tolerance for it.
  TempFile f("e4m3.npy");
  CHECK_THROWS_WITH_AS(write_npy(f.path, t, DType::E4M3), doctest::Contains("NumPy has no float8 dtype"), InputError);
  CHECK_THROWS_WITH_AS(tolerance(DType::E4M3, Quantity::Forward, ErrorStats{}, nullptr),
                       doctest::Contains("check_fp8_kernel"), InputError);
}

TEST_CASE("npy writes bytes as uint8, the way NumPy saves a uint8 array") {
  TempFile f("bytes.npy");
  const std::vector<std::uint8_t> bytes = {0x00, 0x7e, 0xfe, 0x38, 0x80, 0x01};  // e4m3: 0, 448, -448, 1, -0, 2^-9
  write_npy_u8(f.path, {1, 2, 3}, bytes);
  const std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 2, 3), }";
  CHECK(f.read() == npy_bytes(1, dict, std::string(bytes.begin(), bytes.end())));
  // A 1-d array gets Python's 1-tuple, as write_npy's do.
  write_npy_u8(f.path, {6}, bytes);
  CHECK(f.read().find("'shape': (6,), }") != std::string::npos);
  // FlashLab reads floats only: its own uint8 file is refused in one sentence, not misread.
  CHECK_THROWS_WITH_AS(read_npy(f.path), doctest::Contains("has dtype '|u1'"), InputError);
  // A shape that does not hold the bytes is the caller's bug.
  CHECK_THROWS_AS(write_npy_u8(f.path, {2, 2}, bytes), std::logic_error);
}

TEST_CASE("write_e4m3_npy: the FP8 inputs as uint8 bytes and float32 descales, per (batch, head)") {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("flashlab_core_" + std::to_string(::getpid()) + "_e4m3");
  struct RemoveAtEnd {
    std::filesystem::path path;
    ~RemoveAtEnd() { std::filesystem::remove_all(path); }
  } remove{folder};
  const Shape s{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 3, .seq_k = 5, .head_dim = 8};
  std::mt19937 rng(5);
  E4m3Qkv x;
  for (auto [bytes, n] : {std::pair{&x.q, 2 * 3 * 4 * 8}, {&x.k, 2 * 5 * 2 * 8}, {&x.v, 2 * 5 * 2 * 8}})
    for (int i = 0; i < n; ++i) bytes->push_back(std::uint8_t(rng()));
  for (auto [descale, n] : {std::pair{&x.q_descale, 8}, {&x.k_descale, 4}, {&x.v_descale, 4}})
    for (int i = 0; i < n; ++i) descale->push_back(std::ldexp(1.0f + float(i) / 16, -8 - i));

  const std::string dir = (folder / "nested" / "quantized").string();  // made with its parents
  const std::vector<std::string> files = write_e4m3_npy(dir, s, x);
  const std::vector<std::string> names = {"q.npy", "k.npy", "v.npy", "q_descale.npy", "k_descale.npy", "v_descale.npy"};
  REQUIRE(files.size() == names.size());
  for (std::size_t n = 0; n < names.size(); ++n) CHECK(files[n] == (std::filesystem::path(dir) / names[n]).string());
  // The bytes in C order behind NumPy's uint8 header of the tensor's shape, byte for byte.
  const std::pair<const std::vector<std::uint8_t>*, std::string> bytes[] = {
      {&x.q, "(2, 3, 4, 8)"}, {&x.k, "(2, 5, 2, 8)"}, {&x.v, "(2, 5, 2, 8)"}};
  for (std::size_t n = 0; n < 3; ++n) {
    std::ifstream in(files[n], std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': " + bytes[n].second + ", }";
    CHECK(file == npy_bytes(1, dict, std::string(bytes[n].first->begin(), bytes[n].first->end())));
  }
  // The descales, float32 (B, H), exactly.
  const std::pair<const std::vector<float>*, std::vector<std::int64_t>> descales[] = {
      {&x.q_descale, {2, 4}}, {&x.k_descale, {2, 2}}, {&x.v_descale, {2, 2}}};
  for (std::size_t n = 0; n < 3; ++n) {
    const NpyArray a = read_npy(files[3 + n]);
    CHECK(a.dtype == DType::F32);
    CHECK(a.tensor.dims == descales[n].second);
    REQUIRE(a.tensor.data.size() == descales[n].first->size());
    for (std::size_t i = 0; i < a.tensor.data.size(); ++i) CHECK(a.tensor.data[i] == (*descales[n].first)[i]);
  }
  // A folder where a file is: one sentence. Sizes that are not the shape's: the caller's bug.
  std::ofstream((folder / "a_file").string()) << "x";
  CHECK_THROWS_WITH_AS(write_e4m3_npy((folder / "a_file").string(), s, x),
                       doctest::Contains("cannot make the folder"), InputError);
  E4m3Qkv short_descales = x;
  short_descales.v_descale.pop_back();
  CHECK_THROWS_AS(write_e4m3_npy(dir, s, short_descales), std::logic_error);
}

TEST_CASE("names parse, and unknown ones list what is supported") {
  CHECK(parse_dtype("bf16") == DType::BF16);
  CHECK(parse_dtype("float16") == DType::F16);
  CHECK(parse_causal("bottom-right") == CausalAlign::BottomRight);
  CHECK(parse_algorithm("fa1") == Algorithm::FA1);
  CHECK_THROWS_WITH_AS(parse_dtype("int8"), doctest::Contains("f64, f32, f16, bf16 and e4m3"), InputError);
  CHECK_THROWS_WITH_AS(parse_causal("diagonal"), doctest::Contains("none, top-left and bottom-right"), InputError);
  CHECK_THROWS_WITH_AS(parse_algorithm("fa9"), doctest::Contains("standard, fa1 and fa2"), InputError);
}

TEST_CASE("check_dims names the tensor whose shape is wrong") {
  const Shape s{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 8, .seq_k = 6, .head_dim = 16};
  Qkv in{HostTensor(q_dims(s)), HostTensor(kv_dims(s)), HostTensor(kv_dims(s))};
  CHECK_NOTHROW(check_dims(s, in));
  in.v = HostTensor({1, 6, 4, 16});
  CHECK_THROWS_WITH_AS(check_dims(s, in), doctest::Contains("v has shape (1, 6, 4, 16)"), InputError);
  in.v = HostTensor(kv_dims(s));
  HostTensor dO({1, 8, 4, 15});
  CHECK_THROWS_WITH_AS(check_dims(s, in, &dO), doctest::Contains("dO has shape"), InputError);
}

TEST_CASE("shape_of_inputs reads the shape in either layout and names the tensor that disagrees, in its layout") {
  // q (B=2, S_q=8, H_q=4, D=16), k and v (S_k=6, H_kv=2), given as (B, S, H, D) and as (B, H, S, D).
  const Shape want{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 8, .seq_k = 6, .head_dim = 16};
  const InputDims q{"q", {2, 8, 4, 16}}, k{"k", {2, 6, 2, 16}}, v{"v", {2, 6, 2, 16}};
  const Shape got = shape_of_inputs(Layout::BSHD, q, k, v);
  CHECK(q_dims(got) == q_dims(want));
  CHECK(kv_dims(got) == kv_dims(want));
  const InputDims qh{"q", {2, 4, 8, 16}}, kh{"k", {2, 2, 6, 16}}, vh{"v", {2, 2, 6, 16}};
  const Shape got_bhsd = shape_of_inputs(Layout::BHSD, qh, kh, vh);
  CHECK(q_dims(got_bhsd) == q_dims(want));
  CHECK(kv_dims(got_bhsd) == kv_dims(want));
  CHECK(to_bshd({2, 4, 8, 16}, Layout::BHSD) == std::vector<std::int64_t>{2, 8, 4, 16});
  CHECK(from_bshd({2, 8, 4, 16}, Layout::BHSD) == std::vector<std::int64_t>{2, 4, 8, 16});

  CHECK_THROWS_WITH_AS(shape_of_inputs(Layout::BHSD, qh, kh, {"v", {2, 2, 6, 15}}),
                       doctest::Contains("v has shape (2, 2, 6, 15) but the problem needs (2, 2, 6, 16) in layout "
                                         "(batch, heads, seq, head_dim)"),
                       InputError);
  const InputDims dO{"dO", {2, 8, 4, 15}};
  CHECK_THROWS_WITH_AS(shape_of_inputs(Layout::BSHD, q, k, v, &dO), doctest::Contains("dO has shape (2, 8, 4, 15)"),
                       InputError);
  CHECK_THROWS_WITH_AS(shape_of_inputs(Layout::BSHD, {"q", {8, 16}}, k, v),
                       doctest::Contains("q has shape (8, 16) but inputs must be 4-d"), InputError);
  CHECK_THROWS_WITH_AS(shape_of_inputs(Layout::BSHD, q, {"k", {2, 0, 2, 16}}, v),
                       doctest::Contains("every extent must be between 1 and 2^30"), InputError);
  CHECK_THROWS_WITH_AS(shape_of_inputs(Layout::BSHD, q, {"k", {2, 6, 3, 16}}, {"v", {2, 6, 3, 16}}),
                       doctest::Contains("multiple of the key/value heads"), InputError);
  check_forward_outputs(Layout::BHSD, want, {"o", {2, 4, 8, 16}}, {"lse", {2, 4, 8}});
  CHECK_THROWS_WITH_AS(check_forward_outputs(Layout::BHSD, want, {"o", {2, 8, 4, 16}}, {"lse", {2, 4, 8}}),
                       doctest::Contains("o has shape (2, 8, 4, 16) but the problem needs (2, 4, 8, 16)"), InputError);
  CHECK_THROWS_WITH_AS(check_forward_outputs(Layout::BSHD, want, {"o", {2, 8, 4, 16}}, {"lse", {2, 8, 4}}),
                       doctest::Contains("lse has shape (2, 8, 4) but the problem needs (2, 4, 8)"), InputError);
  CHECK(parse_layout("BHSD") == Layout::BHSD);
  CHECK_THROWS_WITH_AS(parse_layout("bsdh"), doctest::Contains("supported are bshd"), InputError);
}

TEST_CASE("first_non_finite counts NaN and +-Inf and gives the first one's index, outermost dim first") {
  const Shape s{.batch = 2, .heads_q = 3, .heads_kv = 3, .seq_q = 20, .seq_k = 20, .head_dim = 8};
  HostTensor q = random_qkv(s, DType::F64, 5).q;  // (2, 20, 3, 8)
  NonFinite none = first_non_finite(q);
  CHECK(none.count == 0);
  CHECK(none.first.empty());

  const double inf = std::numeric_limits<double>::infinity();
  q.at(1, 2, 0, 0) = std::nan("");  // later in row-major order than the next two
  q.at(0, 17, 1, 5) = -inf;
  q.at(0, 19, 2, 7) = inf;
  const NonFinite found = first_non_finite(q);
  CHECK(found.count == 3);
  CHECK(found.first == std::vector<std::int64_t>{0, 17, 1, 5});

  HostTensor flat({7});
  flat.data[6] = std::nan("");
  const NonFinite last = first_non_finite(flat);
  CHECK(last.count == 1);
  CHECK(last.first == std::vector<std::int64_t>{6});
}

TEST_CASE("a call's scratch is carved into aligned arrays, and counting the same layout gives its size") {
  const auto layout = [](ScratchCarver& carve) {
    int* counter = carve.take<int>(2);
    float* rows = carve.take<float>(100);
    unsigned char* bytes = carve.take<unsigned char>(3);
    return std::vector<std::uintptr_t>{reinterpret_cast<std::uintptr_t>(counter),
                                       reinterpret_cast<std::uintptr_t>(rows), reinterpret_cast<std::uintptr_t>(bytes)};
  };
  ScratchCarver count;
  for (std::uintptr_t at : layout(count)) CHECK(at == 0);  // counting hands out no memory
  CHECK(count.used() == 3 * kScratchAlign + 3);            // 8 bytes, 400 (two boundaries on) and 3, each from one

  alignas(kScratchAlign) static unsigned char memory[4 * kScratchAlign];
  ScratchCarver carve(memory, count.used());
  const std::vector<std::uintptr_t> at = layout(carve);
  const auto base = reinterpret_cast<std::uintptr_t>(memory);
  CHECK(at == std::vector<std::uintptr_t>{base, base + kScratchAlign, base + 3 * kScratchAlign});
  CHECK(carve.used() == count.used());

  ScratchCarver too_small(memory, count.used() - 1);
  CHECK_THROWS_AS(layout(too_small), std::logic_error);
  CHECK_THROWS_AS(ScratchCarver(memory + 16, 64), std::logic_error);  // a base off the 256-byte boundary
}
