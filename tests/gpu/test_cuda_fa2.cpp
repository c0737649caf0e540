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
#include "gpu/flashattention_rule.hpp"
#include "gpu/fresh_inputs.hpp"
#include "gpu/fully_masked_rows.hpp"
#include "registry/variants.hpp"
#include "cpu_reference/naive.hpp"

namespace {

using namespace flashlab;

// Forward (and backward) of cuda-fa2 on fresh random inputs against the CPU references.
void check_problem(const Shape& shape, const Options& options, DType dtype, bool backward = true) {
  const Problem p{.shape = shape, .options = options};
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
      check_problem(Shape{.batch = 2, .heads_q = 3, .heads_kv = 3, .seq_q = 113, .seq_k = 157, .head_dim = d},
                    causal_opts(CausalAlign::None), dtype);
      check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 130, .seq_k = 77, .head_dim = d},
                    causal_opts(CausalAlign::BottomRight), dtype);
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
      check_problem(Shape{.batch = 2, .heads_q = 3, .heads_kv = 3, .seq_q = 113, .seq_k = 157, .head_dim = d},
                    causal_opts(CausalAlign::None), dtype);
      check_problem(Shape{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 130, .seq_k = 77, .head_dim = d},
                    causal_opts(CausalAlign::BottomRight, 0.1), dtype);
      check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 257, .seq_k = 257, .head_dim = d},
                    causal_opts(CausalAlign::TopLeft), dtype);
    }
}

TEST_CASE("cuda-fa2 handles any length: 1, odd, seq_q != seq_k both ways, several tiles") {
  const int lengths[][2] = {{1, 1}, {1, 17}, {17, 1}, {17, 113}, {257, 17}, {113, 257}, {257, 257}, {64, 64}};
  for (DType dtype : kDtypes)
    for (const auto& len : lengths)
      for (CausalAlign align : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
        check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = len[0], .seq_k = len[1], .head_dim = 64},
                      causal_opts(align), dtype);
}

TEST_CASE("cuda-fa2 causal, both alignments, large enough to skip tiles (d=128)") {
  for (DType dtype : kDtypes)
    for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
      check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 515, .seq_k = 515, .head_dim = 128},
                    causal_opts(align), dtype);
      check_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 300, .seq_k = 700, .head_dim = 128},
                    causal_opts(align), dtype);
      check_problem(Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 700, .seq_k = 300, .head_dim = 128},
                    causal_opts(align), dtype);
    }
}

TEST_CASE("cuda-fa2 applies a given softmax scale, a negative one too (the forward negates Q for it)") {
  for (DType dtype : kDtypes)
    for (double scale : {0.35, -0.2})
      for (CausalAlign align : {CausalAlign::None, CausalAlign::BottomRight})
        for (int d : {64, 128}) {
          Options o = causal_opts(align);
          o.scale = scale;
          check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 150, .seq_k = 203, .head_dim = d}, o,
                        dtype);
        }
}

TEST_CASE("cuda-fa2 GQA and MQA: dK and dV sum over the query heads of a group") {
  for (DType dtype : kDtypes) {
    check_problem(Shape{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 97, .seq_k = 131, .head_dim = 64},
                  causal_opts(CausalAlign::None), dtype);
    check_problem(Shape{.batch = 1, .heads_q = 6, .heads_kv = 1, .seq_q = 131, .seq_k = 97, .head_dim = 128},
                  causal_opts(CausalAlign::BottomRight), dtype);
    check_problem(Shape{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 200, .seq_k = 200, .head_dim = 32},
                  causal_opts(CausalAlign::TopLeft), dtype);
  }
}

TEST_CASE("cuda-fa2 dropout drops the same elements as the CPU reference (same Philox seed)") {
  for (DType dtype : kDtypes) {
    check_problem(Shape{.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = 129, .seq_k = 141, .head_dim = 64},
                  causal_opts(CausalAlign::None, 0.17), dtype);
    check_problem(Shape{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 150, .seq_k = 90, .head_dim = 128},
                  causal_opts(CausalAlign::BottomRight, 0.3), dtype);
    check_problem(Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 77, .seq_k = 77, .head_dim = 96},
                  causal_opts(CausalAlign::TopLeft, 0.5), dtype);
  }
}

TEST_CASE("cuda-fa2 fully masked rows give O = 0 and LSE = -inf, never NaN") {
  // Bottom-right alignment with seq_q > seq_k: the first seq_q - seq_k queries see no key.
  const Shape shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 150, .seq_k = 40, .head_dim = 64};
  const Problem p{.shape = shape, .options = causal_opts(CausalAlign::BottomRight)};
  const Qkv in = random_qkv(shape, DType::BF16, fresh_seed());
  check_fully_masked_rows(find_variant("cuda-fa2").forward(p, DType::BF16, in, nullptr), shape,
                          shape.seq_q - shape.seq_k);
}

TEST_CASE("cuda-fa2 rejects more (batch, head) rows than the grid holds, before touching the GPU") {
  const Problem p{.shape = Shape{.batch = 2, .heads_q = 32768, .heads_kv = 1, .seq_q = 1, .seq_k = 1, .head_dim = 32},
                  .options = Options{}};  // batch 2 x 32768 query heads = 65536 rows
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
  const Problem p{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 16, .seq_k = 16, .head_dim = 80},
                  .options = Options{}};
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
  const Problem p64{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 16, .seq_k = 16, .head_dim = 64},
                    .options = Options{}};
  CHECK_THROWS_AS(fa2.forward(p64, DType::F32, random_qkv(p64.shape, DType::F32, 2), nullptr), InputError);
}
