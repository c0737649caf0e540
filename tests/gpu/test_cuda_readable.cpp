// GPU tests of the readable CUDA kernels (cuda-naive, cuda-cublas, cuda-fa1, cuda-fa2-simt): each one,
// forward and backward, against naive attention in double on the CPU, within core/tolerance.hpp's
// fp32 rule. Inputs are fresh random numbers every run (the seed is printed on failure); every
// variant poisons its outputs with NaN first, so an element a kernel never writes fails.
// Without a CUDA device this suite exits 77 (tests/gpu_main.cpp): CTest reports it skipped.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/mask.hpp"
#include "core/tolerance.hpp"
#include "gpu/fresh_inputs.hpp"
#include "registry/variants.hpp"
#include "cpu_reference/naive.hpp"

using namespace flashlab;

namespace {

const std::vector<std::string> kReadable = {"cuda-naive", "cuda-cublas", "cuda-fa1", "cuda-fa2-simt"};

Problem make_problem(Shape shape, CausalAlign causal = CausalAlign::None, double dropout = 0.0) {
  Problem p;
  p.shape = shape;
  p.options.causal = causal;
  p.options.dropout_p = dropout;
  p.options.seed = fresh_seed();
  return p;
}

std::string describe(const Problem& p) {
  const Shape& s = p.shape;
  return "B=" + std::to_string(s.batch) + " Hq=" + std::to_string(s.heads_q) + " Hkv=" + std::to_string(s.heads_kv) +
         " Sq=" + std::to_string(s.seq_q) + " Sk=" + std::to_string(s.seq_k) + " d=" + std::to_string(s.head_dim) +
         " causal=" + to_string(p.options.causal) + " dropout=" + std::to_string(p.options.dropout_p) +
         " seed=" + std::to_string(p.options.seed);
}

void check_close(const char* what, const HostTensor& got, const HostTensor& ref, Quantity quantity) {
  const ErrorStats e = compare(got, ref);
  const Bound bound = tolerance(DType::F32, quantity, e, nullptr);
  INFO(what << ": max abs error " << e.max_abs << ", relative error " << e.rel << " (" << bound.rule << ")"
            << (e.has_nan ? ", has NaN: an element was never written" : ""));
  CHECK(bound.passes(e));
}

// Every readable kernel, forward (O, LSE) and backward (dQ, dK, dV), against the double reference.
void check_all_variants(const Problem& p, bool backward = true) {
  const std::uint64_t data_seed = fresh_seed();
  INFO(describe(p) << " data_seed=" << data_seed);
  const Qkv in = random_qkv(p.shape, DType::F32, data_seed);
  const HostTensor dO = random_like_o(p.shape, DType::F32, data_seed + 1);
  const ForwardOut ref = naive_forward<double>(p, in);
  const Grads ref_grads = backward ? naive_backward<double>(p, in, ref, dO) : Grads{};
  for (const std::string& name : kReadable) {
    INFO("variant " << name);
    const Variant& v = find_variant(name);
    const ForwardOut got = v.forward(p, DType::F32, in, nullptr);
    check_close("O", got.o, ref.o, Quantity::Forward);
    check_close("LSE", got.lse, ref.lse, Quantity::Forward);
    if (!backward) continue;
    const Grads g = v.backward(p, DType::F32, in, got, dO);  // from the variant's own O and LSE
    check_close("dQ", g.dq, ref_grads.dq, Quantity::Gradient);
    check_close("dK", g.dk, ref_grads.dk, Quantity::Gradient);
    check_close("dV", g.dv, ref_grads.dv, Quantity::Gradient);
  }
}

}  // namespace

TEST_CASE("readable CUDA kernels equal the double reference on plain shapes") {
  SUBCASE("one tile exactly: S = 64, d = 64") {
    check_all_variants(
        make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 64, .seq_k = 64, .head_dim = 64}));
  }
  SUBCASE("several tiles, batch and heads: S = 192, d = 64") {
    check_all_variants(
        make_problem({.batch = 2, .heads_q = 3, .heads_kv = 3, .seq_q = 192, .seq_k = 192, .head_dim = 64}));
  }
  SUBCASE("length 1") {
    check_all_variants(make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 1, .seq_k = 1, .head_dim = 32}));
  }
}

TEST_CASE("readable CUDA kernels handle odd lengths and seq_q != seq_k") {
  SUBCASE("odd length, not a multiple of any block: S = 77") {
    check_all_variants(
        make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 77, .seq_k = 77, .head_dim = 64}));
  }
  SUBCASE("seq_q < seq_k: 50 x 133") {
    check_all_variants(
        make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 50, .seq_k = 133, .head_dim = 64}));
  }
  SUBCASE("seq_q > seq_k: 150 x 70") {
    check_all_variants(
        make_problem({.batch = 2, .heads_q = 1, .heads_kv = 1, .seq_q = 150, .seq_k = 70, .head_dim = 64}));
  }
}

TEST_CASE("readable CUDA kernels cover head dims 16 to 128, including ones not a multiple of 4") {
  for (int d : {16, 40, 64, 97, 128}) {
    SUBCASE(("head_dim " + std::to_string(d)).c_str()) {
      check_all_variants(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 130, .seq_k = 100, .head_dim = d}));
    }
  }
}

TEST_CASE("readable CUDA kernels apply the causal mask in both alignments") {
  for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
    const std::string a = to_string(align);
    SUBCASE((a + ", square 200").c_str()) {
      check_all_variants(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 200, .seq_k = 200, .head_dim = 64}, align));
    }
    SUBCASE((a + ", seq_q < seq_k: 70 x 200").c_str()) {
      check_all_variants(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 70, .seq_k = 200, .head_dim = 64}, align));
    }
    SUBCASE((a + ", seq_q > seq_k: 200 x 70").c_str()) {
      check_all_variants(
          make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 200, .seq_k = 70, .head_dim = 32}, align));
    }
  }
}

TEST_CASE("fully masked rows give O = 0 and LSE = -inf on every readable kernel") {
  // Bottom-right with seq_q > seq_k: the first seq_q - seq_k queries see no key at all.
  const Problem p = make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 150, .seq_k = 40, .head_dim = 64},
                                 CausalAlign::BottomRight);
  INFO(describe(p));
  const Qkv in = random_qkv(p.shape, DType::F32, fresh_seed());
  const int masked_rows = p.shape.seq_q - p.shape.seq_k;
  for (const std::string& name : kReadable) {
    INFO("variant " << name);
    const ForwardOut got = find_variant(name).forward(p, DType::F32, in, nullptr);
    int wrong = 0;
    for (int h = 0; h < p.shape.heads_q; ++h)
      for (int r = 0; r < masked_rows; ++r) {
        REQUIRE(last_visible_key(p.options.causal, r, p.shape.seq_q, p.shape.seq_k) < 0);
        if (got.lse.data[std::size_t(h) * p.shape.seq_q + r] != -INFINITY) ++wrong;
        for (int c = 0; c < p.shape.head_dim; ++c)
          if (got.o.at(0, r, h, c) != 0.0) ++wrong;
      }
    CHECK_MESSAGE(wrong == 0, wrong << " elements of fully masked rows are not O = 0 / LSE = -inf");
  }
}

TEST_CASE("readable CUDA kernels support grouped-query and multi-query attention") {
  SUBCASE("GQA: 4 query heads on 2 K/V heads") {
    check_all_variants(
        make_problem({.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 96, .seq_k = 96, .head_dim = 64}));
  }
  SUBCASE("MQA, causal: 3 query heads on 1 K/V head") {
    check_all_variants(make_problem(
        {.batch = 1, .heads_q = 3, .heads_kv = 1, .seq_q = 100, .seq_k = 130, .head_dim = 64}, CausalAlign::TopLeft));
  }
}

TEST_CASE("readable CUDA kernels drop exactly the elements the CPU reference drops") {
  // Same seed, same Philox mask: a kernel that dropped other elements would be off by O(p), far
  // beyond the fp32 bound.
  SUBCASE("dropout 0.2") {
    check_all_variants(make_problem(
        {.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 130, .seq_k = 90, .head_dim = 64}, CausalAlign::None, 0.2));
  }
  SUBCASE("dropout 0.1, causal bottom-right, GQA") {
    check_all_variants(
        make_problem({.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 100, .seq_k = 140, .head_dim = 64},
                     CausalAlign::BottomRight, 0.1));
  }
}

TEST_CASE("cuda-fa2-simt is right on a longer sequence (many K/V blocks, many Q blocks)") {
  const Problem p = make_problem(
      {.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 1000, .seq_k = 1000, .head_dim = 64}, CausalAlign::TopLeft);
  const std::uint64_t data_seed = fresh_seed();
  INFO(describe(p) << " data_seed=" << data_seed);
  const Qkv in = random_qkv(p.shape, DType::F32, data_seed);
  const HostTensor dO = random_like_o(p.shape, DType::F32, data_seed + 1);
  const ForwardOut ref = naive_forward<double>(p, in);
  const Grads ref_grads = naive_backward<double>(p, in, ref, dO);
  for (const char* name : {"cuda-fa1", "cuda-fa2-simt"}) {
    INFO("variant " << name);
    const Variant& v = find_variant(name);
    const ForwardOut got = v.forward(p, DType::F32, in, nullptr);
    check_close("O", got.o, ref.o, Quantity::Forward);
    check_close("LSE", got.lse, ref.lse, Quantity::Forward);
    const Grads g = v.backward(p, DType::F32, in, got, dO);
    check_close("dQ", g.dq, ref_grads.dq, Quantity::Gradient);
    check_close("dK", g.dk, ref_grads.dk, Quantity::Gradient);
    check_close("dV", g.dv, ref_grads.dv, Quantity::Gradient);
  }
}

TEST_CASE("bad input is refused with an InputError before any launch") {
  SUBCASE("head_dim above the fused kernels' limit") {
    const Problem p = make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 160});
    const Qkv in = random_qkv(p.shape, DType::F32, 1);
    for (const char* name : {"cuda-fa1", "cuda-fa2-simt"}) {
      INFO("variant " << name);
      CHECK_THROWS_AS(find_variant(name).forward(p, DType::F32, in, nullptr), InputError);
      CHECK_THROWS_WITH(find_variant(name).forward(p, DType::F32, in, nullptr),
                        doctest::Contains("head dims 1..128"));
    }
  }
  SUBCASE("a dtype the variant does not compute in") {
    const Problem p = make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 64});
    const Qkv in = random_qkv(p.shape, DType::F16, 1);
    for (const std::string& name : kReadable) {
      INFO("variant " << name);
      CHECK_THROWS_AS(find_variant(name).forward(p, DType::F16, in, nullptr), InputError);
    }
  }
  SUBCASE("inputs whose dims do not match the problem") {
    const Problem p = make_problem({.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 64});
    Qkv in = random_qkv(p.shape, DType::F32, 1);
    in.k = HostTensor({1, 9, 1, 64});
    for (const std::string& name : kReadable) {
      INFO("variant " << name);
      CHECK_THROWS_AS(find_variant(name).forward(p, DType::F32, in, nullptr), InputError);
    }
  }
  SUBCASE("standard attention that will not fit in GPU memory is refused before allocating") {
    // B = 1, H = 16, N = 512k: S and P alone are 2 * 16 * 2^38 bytes = 8 TiB.
    const Problem p =
        make_problem({.batch = 1, .heads_q = 16, .heads_kv = 16, .seq_q = 1 << 19, .seq_k = 1 << 19, .head_dim = 64});
    for (const char* name : {"cuda-naive", "cuda-cublas"}) {
      INFO("variant " << name);
      CHECK_THROWS_WITH_AS(
          find_variant(name).bench(p, DType::F32, BenchSettings{.warmup = 0, .iters = 1, .backward = false}),
          doctest::Contains("free"), InputError);
    }
  }
}

TEST_CASE("a one-pass bench (for Nsight Compute) runs one forward and one backward, and times that run") {
  const Problem p = make_problem({.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 256, .seq_k = 256, .head_dim = 64});
  for (const std::string& name : kReadable) {
    INFO("variant " << name);
    const BenchResult r =
        find_variant(name).bench(p, DType::F32, BenchSettings{.warmup = 0, .iters = 1, .backward = true, .one_pass = true});
    CHECK(r.forward_ms > 0);
    CHECK(r.backward_ms > 0);
  }
}
