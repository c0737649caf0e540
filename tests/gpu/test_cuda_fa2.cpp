// cuda-fa2 (tensor-core FlashAttention-2, fp16/bf16) against naive attention in double, by the
// FlashAttention rule of core/tolerance.hpp: the kernel's max error may be at most 2x (O, LSE) or 3x
// (dQ, dK, dV) the error of naive attention run in the same low precision, plus a small slack.
// Inputs are fresh random numbers each run (the seed is printed on failure); the variant poisons its
// outputs with NaN before launching, so an element it never writes fails the comparison.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>

#include "core/tolerance.hpp"
#include "registry/variants.hpp"
#include "cpu_reference/naive.hpp"

namespace {

using namespace flashlab;

std::uint64_t fresh_seed() {
  static std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

std::string describe(const Problem& p, DType dtype, std::uint64_t seed) {
  const Shape& s = p.shape;
  std::ostringstream os;
  os << to_string(dtype) << " B=" << s.batch << " Hq=" << s.heads_q << " Hkv=" << s.heads_kv << " Sq=" << s.seq_q
     << " Sk=" << s.seq_k << " d=" << s.head_dim << " causal=" << to_string(p.options.causal)
     << " dropout=" << p.options.dropout_p << " scale=" << p.softmax_scale() << " seed=" << seed;
  return os.str();
}

// One output against the double reference, bounded by the low-precision naive baseline.
void check_output(const char* name, DType dtype, Quantity quantity, const HostTensor& out, const HostTensor& ref,
                  const HostTensor& lowp) {
  const ErrorStats err = compare(out, ref);
  const ErrorStats baseline = compare(lowp, ref);
  const Bound bound = tolerance(dtype, quantity, err, &baseline);
  INFO(std::string(name) << ": max abs error " << err.max_abs << " (rel " << err.rel << "), bound " << bound.rule
            << (err.has_nan ? ", has NaN (an unwritten or non-finite element)" : ""));
  CHECK(bound.passes(err));
}

// Forward (and backward) of cuda-fa2 on fresh random inputs against the CPU references.
void check_problem(const Shape& shape, const Options& options, DType dtype, bool backward = true) {
  const Problem p{shape, options};
  const std::uint64_t seed = fresh_seed();
  INFO(describe(p, dtype, seed));
  const Variant& fa2 = find_variant("cuda-fa2");
  const Qkv in = random_qkv(shape, dtype, seed);

  const ForwardOut ref = naive_forward<double>(p, in);
  const ForwardOut lowp = naive_forward_lowp(p, dtype, in);
  const ForwardOut out = fa2.forward(p, dtype, in, nullptr);
  check_output("O", dtype, Quantity::Forward, out.o, ref.o, lowp.o);
  check_output("LSE", dtype, Quantity::Forward, out.lse, ref.lse, lowp.lse);
  if (!backward) return;

  const HostTensor dO = random_like_o(shape, dtype, seed);
  const Grads gref = naive_backward<double>(p, in, ref, dO);
  const Grads glowp = naive_backward_lowp(p, dtype, in, lowp, dO);
  const Grads g = fa2.backward(p, dtype, in, out, dO);
  check_output("dQ", dtype, Quantity::Gradient, g.dq, gref.dq, glowp.dq);
  check_output("dK", dtype, Quantity::Gradient, g.dk, gref.dk, glowp.dk);
  check_output("dV", dtype, Quantity::Gradient, g.dv, gref.dv, glowp.dv);
}

Shape shape_of(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim) {
  return Shape{batch, heads_q, heads_kv, seq_q, seq_k, head_dim};
}

Options causal_opts(CausalAlign align, double dropout_p = 0.0) {
  Options o;
  o.causal = align;
  o.dropout_p = dropout_p;
  o.seed = fresh_seed();
  return o;
}

constexpr DType kDtypes[] = {DType::F16, DType::BF16};

}  // namespace

TEST_CASE("cuda-fa2 matches naive attention for every supported head dim, fp16 and bf16") {
  for (DType dtype : kDtypes)
    for (int d : {32, 64, 96, 128, 256}) {
      check_problem(shape_of(2, 3, 3, 113, 157, d), causal_opts(CausalAlign::None), dtype);
      check_problem(shape_of(1, 2, 2, 130, 77, d), causal_opts(CausalAlign::BottomRight), dtype);
    }
}

// Sets an environment variable for one scope, and restores its absence after.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
};

TEST_CASE("cuda-fa2's compact backward tiles (what a GPU with less shared memory than an H100 runs) match too") {
  const ScopedEnv compact("FLASHLAB_FA2_COMPACT_BACKWARD", "1");
  for (DType dtype : kDtypes)
    for (int d : {64, 128}) {
      check_problem(shape_of(2, 3, 3, 113, 157, d), causal_opts(CausalAlign::None), dtype);
      check_problem(shape_of(1, 4, 2, 130, 77, d), causal_opts(CausalAlign::BottomRight, 0.1), dtype);
      check_problem(shape_of(1, 2, 1, 257, 257, d), causal_opts(CausalAlign::TopLeft), dtype);
    }
}

TEST_CASE("cuda-fa2 handles any length: 1, odd, seq_q != seq_k both ways, several tiles") {
  const int lengths[][2] = {{1, 1}, {1, 17}, {17, 1}, {17, 113}, {257, 17}, {113, 257}, {257, 257}, {64, 64}};
  for (DType dtype : kDtypes)
    for (const auto& len : lengths)
      for (CausalAlign align : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
        check_problem(shape_of(1, 2, 2, len[0], len[1], 64), causal_opts(align), dtype);
}

TEST_CASE("cuda-fa2 causal, both alignments, large enough to skip tiles (d=128)") {
  for (DType dtype : kDtypes)
    for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
      check_problem(shape_of(1, 2, 2, 515, 515, 128), causal_opts(align), dtype);
      check_problem(shape_of(1, 1, 1, 300, 700, 128), causal_opts(align), dtype);
      check_problem(shape_of(1, 1, 1, 700, 300, 128), causal_opts(align), dtype);
    }
}

TEST_CASE("cuda-fa2 applies a given softmax scale, a negative one too (the forward negates Q for it)") {
  for (DType dtype : kDtypes)
    for (double scale : {0.35, -0.2})
      for (CausalAlign align : {CausalAlign::None, CausalAlign::BottomRight})
        for (int d : {64, 128}) {
          Options o = causal_opts(align);
          o.scale = scale;
          check_problem(shape_of(1, 2, 2, 150, 203, d), o, dtype);
        }
}

TEST_CASE("cuda-fa2 GQA and MQA: dK and dV sum over the query heads of a group") {
  for (DType dtype : kDtypes) {
    check_problem(shape_of(2, 4, 2, 97, 131, 64), causal_opts(CausalAlign::None), dtype);
    check_problem(shape_of(1, 6, 1, 131, 97, 128), causal_opts(CausalAlign::BottomRight), dtype);
    check_problem(shape_of(1, 4, 2, 200, 200, 32), causal_opts(CausalAlign::TopLeft), dtype);
  }
}

TEST_CASE("cuda-fa2 dropout drops the same elements as the CPU reference (same Philox seed)") {
  for (DType dtype : kDtypes) {
    check_problem(shape_of(2, 2, 2, 129, 141, 64), causal_opts(CausalAlign::None, 0.17), dtype);
    check_problem(shape_of(1, 4, 2, 150, 90, 128), causal_opts(CausalAlign::BottomRight, 0.3), dtype);
    check_problem(shape_of(1, 2, 2, 77, 77, 96), causal_opts(CausalAlign::TopLeft, 0.5), dtype);
  }
}

TEST_CASE("cuda-fa2 fully masked rows give O = 0 and LSE = -inf, never NaN") {
  // Bottom-right alignment with seq_q > seq_k: the first seq_q - seq_k queries see no key.
  const Shape shape = shape_of(1, 2, 2, 150, 40, 64);
  const Problem p{shape, causal_opts(CausalAlign::BottomRight)};
  const Qkv in = random_qkv(shape, DType::BF16, fresh_seed());
  const ForwardOut out = find_variant("cuda-fa2").forward(p, DType::BF16, in, nullptr);
  for (int h = 0; h < shape.heads_q; ++h)
    for (int row = 0; row < shape.seq_q; ++row) {
      const bool empty = row < shape.seq_q - shape.seq_k;
      const double lse = out.lse.data[std::size_t(h) * shape.seq_q + row];
      CHECK_MESSAGE((empty ? lse == -INFINITY : std::isfinite(lse)), "row " << row << " LSE " << lse);
      double abs_sum = 0;
      for (int d = 0; d < shape.head_dim; ++d) abs_sum += std::abs(out.o.at(0, row, h, d));
      if (empty) CHECK_MESSAGE(abs_sum == 0.0, "row " << row << " sees no key but O != 0");
      else CHECK_MESSAGE(abs_sum > 0.0, "row " << row << " sees keys but O == 0");
    }
}

TEST_CASE("cuda-fa2 rejects more (batch, head) rows than the grid holds, before touching the GPU") {
  const Problem p{shape_of(2, 32768, 1, 1, 1, 32), Options{}};  // batch 2 x 32768 query heads = 65536 rows
  const Qkv in = random_qkv(p.shape, DType::BF16, 1);
  try {
    (void)find_variant("cuda-fa2").forward(p, DType::BF16, in, nullptr);
    FAIL("65536 (batch, head) rows were accepted");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find("65536") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("65535") != std::string::npos, msg);
  }
}

TEST_CASE("cuda-fa2 rejects an unsupported head dim with the supported list") {
  const Problem p{shape_of(1, 1, 1, 16, 16, 80), Options{}};
  const Variant& fa2 = find_variant("cuda-fa2");
  const Qkv in = random_qkv(p.shape, DType::F16, 1);
  try {
    (void)fa2.forward(p, DType::F16, in, nullptr);
    FAIL("head_dim 80 was accepted");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK_MESSAGE(msg.find("80") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("32, 64, 96, 128, 256") != std::string::npos, msg);
  }
  // fp32 is the readable kernels' business: cuda-fa2 says it computes in f16 and bf16 only.
  const Problem p64{shape_of(1, 1, 1, 16, 16, 64), Options{}};
  CHECK_THROWS_AS(fa2.forward(p64, DType::F32, random_qkv(p64.shape, DType::F32, 2), nullptr), InputError);
}
