// cuda-fa3-ws's backward (the warp-specialized Hopper kernel of fa3_ws/backward_kernel.cuh) against naive
// attention in double, by the FlashAttention rule of core/tolerance.hpp: dQ, dK and dV may be at most 3x
// the error of naive attention run in the same low precision, plus a small slack. Inputs are fresh random
// numbers each run (the seed is printed on failure); the variant poisons dQ, dK and dV with NaN before
// launching, so an element it never writes fails. The forward it differentiates is its own (cuda-fa3-ws).
// Every case runs in both dtypes, at every head dim the backward has, in the default mode and the
// deterministic one; a separate case checks that the deterministic mode gives the same bits run after run.
//
// The kernel runs on compute capability 9.0 only: elsewhere the cases say so and return (the refusal
// there is checked by gpu_fa3_ws_tests).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <iterator>
#include <string>

#include "core/bench.hpp"
#include "core/tolerance.hpp"
#include "cuda/constraints.hpp"
#include "cuda/cuda_variants.hpp"
#include "cuda/device.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cpu_reference/naive.hpp"
#include "gpu/flashattention_rule.hpp"
#include "gpu/fresh_inputs.hpp"
#include "registry/variants.hpp"

namespace {

using namespace flashlab;

constexpr DType kDtypes[] = {DType::F16, DType::BF16};
using cuda::fa3_ws::kBackwardHeadDims;

bool skip_unless_hopper() {
  if (cuda_compute_capability() == 90) return false;
  MESSAGE("skipped: cuda-fa3-ws runs on compute capability 9.0 (Hopper) only, and this GPU is " << cuda_device_name());
  return true;
}

// The backward a check runs: the registry's (the plan's choice of kernel), or a given consumer count's.
using BackwardCall = Grads (*)(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor&);
Grads registry_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& out, const HostTensor& dO) {
  return find_variant("cuda-fa3-ws").backward(p, dtype, in, out, dO);
}
Grads three_consumers_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& out, const HostTensor& dO) {
  return cuda_fa3_ws_backward_with_consumers(3, p, dtype, in, out, dO);
}
// Two consumers with each group of query heads shared between two thread blocks, launched K/V block by K/V block.
Grads split_groups_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& out, const HostTensor& dO) {
  return cuda_fa3_ws_backward_on_grid(2, 2, true, p, dtype, in, out, dO);
}

// The forward and backward of cuda-fa3-ws on fresh random inputs, at every head dim and dtype (or those given), the
// backward in the default and the deterministic mode, against one reference per (head dim, dtype).
void check_problem(Shape shape, Options options, std::initializer_list<DType> dtypes,
                   std::initializer_list<int> head_dims, BackwardCall backward = registry_backward) {
  const Variant& fa3 = find_variant("cuda-fa3-ws");
  for (DType dtype : dtypes)
    for (int d : head_dims) {
      shape.head_dim = d;
      const std::uint64_t seed = fresh_seed();
      Problem p{.shape = shape, .options = options};
      INFO(describe(p, dtype, seed) << (backward == three_consumers_backward ? ", three consumer warpgroups"
                                        : backward == split_groups_backward ? ", each group split between two blocks"
                                                                            : ""));
      const Qkv in = random_qkv(shape, dtype, seed);
      const HostTensor dO = random_like_o(shape, dtype, seed);
      const ForwardOut ref = naive_forward<double>(p, in);
      const ForwardOut lowp = naive_forward_lowp(p, dtype, in);
      const Grads gref = naive_backward<double>(p, in, ref, dO);
      const Grads glowp = naive_backward_lowp(p, dtype, in, lowp, dO);
      const ForwardOut out = fa3.forward(p, dtype, in, nullptr);
      check_output("O", dtype, Quantity::Forward, out.o, ref.o, lowp.o);
      for (bool deterministic : {false, true}) {
        INFO((deterministic ? "deterministic mode" : "default mode"));
        p.options.deterministic = deterministic;
        const Grads g = backward(p, dtype, in, out, dO);
        check_output("dQ", dtype, Quantity::Gradient, g.dq, gref.dq, glowp.dq);
        check_output("dK", dtype, Quantity::Gradient, g.dk, gref.dk, glowp.dk);
        check_output("dV", dtype, Quantity::Gradient, g.dv, gref.dv, glowp.dv);
      }
    }
}

// The same at d = 64 with three consumer warpgroups (Bc = 192) whatever the plan would choose: small problems take two.
void check_three_consumers(Shape shape, Options options) {
  check_problem(shape, options, {DType::F16, DType::BF16}, {64}, three_consumers_backward);
}

void check_problem(Shape shape, Options options) {
  check_problem(shape, options, {DType::F16, DType::BF16}, {64, 128, 256});
  static_assert(std::size(kBackwardHeadDims) == 3 && kBackwardHeadDims[0] == 64 && kBackwardHeadDims[2] == 256,
                "check_problem's head dims are the backward's");
}

Options opts(CausalAlign align, double dropout_p = 0.0, double scale = 0.0) {
  Options o;
  o.causal = align;
  o.dropout_p = dropout_p;
  o.scale = scale;
  o.seed = fresh_seed();
  return o;
}

Shape shape(int batch, int heads_q, int heads_kv, int seq_q, int seq_k) {
  return Shape{.batch = batch, .heads_q = heads_q, .heads_kv = heads_kv, .seq_q = seq_q, .seq_k = seq_k, .head_dim = 64};
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(a.data[0])) == 0;
}

}  // namespace

TEST_CASE("cuda-fa3-ws's backward: the table row says backward, its head dims, and a deterministic mode") {
  const Variant& v = find_variant("cuda-fa3-ws");
  CHECK(v.has_backward());
  CHECK(v.supports.deterministic);
  REQUIRE(v.backward_head_dims.has_value());
  CHECK(v.backward_head_dims->describe() == "64, 128, 256");
  CHECK((v.device_backward_fn != nullptr));
}

TEST_CASE("cuda-fa3-ws's backward: length 1, odd lengths, seq_q != seq_k both ways, no multiple of a block") {
  if (skip_unless_hopper()) return;
  const int lengths[][2] = {{1, 1}, {1, 17}, {17, 1}, {17, 113}, {257, 17}, {113, 257}, {200, 200}};
  for (const auto& len : lengths) check_problem(shape(1, 2, 2, len[0], len[1]), opts(CausalAlign::None));
}

TEST_CASE("cuda-fa3-ws's backward: many query blocks per K/V block (the Q / dO pipeline wraps many times)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 2, 2, 1500, 130), opts(CausalAlign::None));
  check_problem(shape(1, 1, 1, 1024, 1024), opts(CausalAlign::None));
}

TEST_CASE("cuda-fa3-ws's backward: causal, top-left and bottom-right, seq_q < seq_k and seq_q > seq_k") {
  if (skip_unless_hopper()) return;
  for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
    check_problem(shape(1, 2, 2, 515, 515), opts(align));
    check_problem(shape(1, 1, 1, 300, 700), opts(align));
    check_problem(shape(1, 1, 1, 700, 300), opts(align));  // bottom-right: the first 400 rows see no key
  }
}

TEST_CASE("cuda-fa3-ws's backward: GQA and MQA (dK, dV summed over the query heads of a group)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(2, 4, 2, 97, 131), opts(CausalAlign::None));
  check_problem(shape(1, 6, 1, 131, 97), opts(CausalAlign::BottomRight));
  check_problem(shape(1, 4, 2, 200, 200), opts(CausalAlign::TopLeft));
}

TEST_CASE("cuda-fa3-ws's backward: GQA on too few K/V blocks to fill the GPU shares each group among thread blocks") {
  if (skip_unless_hopper()) return;
  // The small GQA problems above take every group apart (a thread block per query head and K/V block). Here the
  // batch is the GPU's SM count, so that half the group per thread block is the fewest that gives every SM two blocks
  // (the fill rule the plan starts from; backward_plan_tests checks the rule itself): the blocks of one K/V block then
  // add partial dK, dV sums of two query heads each, the last to finish adding them up. That grid runs here whatever
  // the plan takes for the problem (under the mask its replay estimates whole groups shorter: one block an SM, each of
  // 8 steps).
  const int sms = cuda::device_sm_count();
  REQUIRE(sms > 0);
  for (int heads_q : {4, 6})  // one K/V block a (batch, K/V head) at d = 64 and 128
    check_problem(shape(sms, heads_q, 1, 128, 128), opts(CausalAlign::TopLeft), {DType::BF16}, {64, 128},
                  split_groups_backward);
}

TEST_CASE("cuda-fa3-ws's bench times its backward on the plan's grid, or on one it is given, and says which") {
  if (skip_unless_hopper()) return;
  // A Llama's attention at 4k (16 query heads on 4 K/V heads, causal), whose plan backward_plan_tests checks.
  Problem p{.shape = Shape{.batch = 1, .heads_q = 16, .heads_kv = 4, .seq_q = 4096, .seq_k = 4096, .head_dim = 128},
            .options = opts(CausalAlign::TopLeft)};
  const Variant& fa3 = find_variant("cuda-fa3-ws");
  const cuda::fa3_ws::BackwardPlan plan = cuda::fa3_ws::backward_plan(
      1, 16, 4, 4096, 4096, 128, CausalAlign::TopLeft, false, cuda::device_sm_count());
  const BenchResult planned = fa3.bench(p, DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = true});
  REQUIRE(planned.backward_grid.has_value());
  CHECK(planned.backward_grid->consumers == plan.consumers);
  CHECK(planned.backward_grid->group_splits == plan.split.group_splits);
  CHECK(planned.backward_grid->key_blocks_outer == plan.key_blocks_outer);
  CHECK(planned.backward_ms > 0);
  // A grid the plan does not take, asked for: each group shared among four thread blocks, row by row.
  REQUIRE_FALSE((plan.split.group_splits == 4 && !plan.key_blocks_outer));
  const BenchResult given = fa3.bench(p, DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = true,
                                                                    .backward_grid = BackwardGrid{2, 4, false}});
  REQUIRE(given.backward_grid.has_value());
  CHECK(given.backward_grid->consumers == 2);
  CHECK(given.backward_grid->group_splits == 4);
  CHECK_FALSE(given.backward_grid->key_blocks_outer);
  CHECK(given.backward_ms > 0);
  // Forward only: no backward grid.
  CHECK_FALSE(fa3.bench(p, DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = false}).backward_grid);
}

TEST_CASE("cuda-fa3-ws's backward with three consumer warpgroups at d = 64 (Bc = 192), on small problems") {
  if (skip_unless_hopper()) return;
  // The kernel the plan takes for long even grids, held to the same rule on problems small enough for the CPU
  // reference: odd lengths, both causal alignments with seq_q != seq_k, GQA with a group shared among thread blocks
  // (its partial dK, dV sums), dropout, a K/V block's keys past the end.
  check_three_consumers(shape(1, 2, 2, 17, 113), opts(CausalAlign::None));
  check_three_consumers(shape(1, 2, 2, 700, 450), opts(CausalAlign::None));
  for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
    check_three_consumers(shape(1, 2, 1, 300, 700), opts(align));
    check_three_consumers(shape(1, 1, 1, 700, 300), opts(align));
  }
  check_three_consumers(shape(2, 8, 2, 200, 400), opts(CausalAlign::TopLeft));
  check_three_consumers(shape(1, 4, 2, 150, 390), opts(CausalAlign::BottomRight, 0.3));
  check_three_consumers(shape(1, 2, 2, 129, 200), opts(CausalAlign::None, 0.17));
}

TEST_CASE("cuda-fa3-ws's backward: dropout with the forward's mask (same Philox seed as the CPU reference)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(2, 2, 2, 129, 141), opts(CausalAlign::None, 0.17));
  check_problem(shape(1, 4, 2, 150, 90), opts(CausalAlign::BottomRight, 0.3));
  check_problem(shape(1, 2, 2, 77, 77), opts(CausalAlign::TopLeft, 0.5));
}

TEST_CASE("cuda-fa3-ws's backward: a given softmax scale, a negative one, and batch > 1") {
  if (skip_unless_hopper()) return;
  for (double scale : {0.35, -0.2})
    for (CausalAlign align : {CausalAlign::None, CausalAlign::BottomRight})
      check_problem(shape(1, 2, 2, 150, 203), opts(align, 0.0, scale));
  check_problem(shape(3, 2, 2, 190, 250), opts(CausalAlign::TopLeft));
}

TEST_CASE("cuda-fa3-ws's backward, deterministic mode: repeated runs give bit-identical gradients") {
  if (skip_unless_hopper()) return;
  // 16 K/V blocks add to every query block, over 32 (batch, K/V head) rows of blocks: the default mode's adds
  // race there; the deterministic mode's must not. The second shape, a Llama's 16 query heads on 4 K/V heads at
  // batch 1, has too few K/V blocks for the GPU: its groups are shared among thread blocks, and causal, they are
  // launched K/V block by K/V block.
  for (DType dtype : kDtypes)
    for (int d : kBackwardHeadDims)
      for (CausalAlign align : {CausalAlign::None, CausalAlign::TopLeft})
        for (Shape s : {shape(4, 16, 8, 2048, 2048), shape(1, 16, 4, 2048, 2048)}) {
          s.head_dim = d;
          const bool llama = s.batch == 1, causal = align != CausalAlign::None;
          CHECK(cuda::fa3_ws::backward_key_blocks_outer(causal, s.batch, s.heads_kv, s.seq_k, d,
                                                        cuda::device_sm_count()) == (llama && causal));
          Problem p{.shape = s, .options = opts(align)};
          p.options.deterministic = true;
          const std::uint64_t seed = fresh_seed();
          INFO(describe(p, dtype, seed));
          const Variant& fa3 = find_variant("cuda-fa3-ws");
          const Qkv in = random_qkv(s, dtype, seed);
          const HostTensor dO = random_like_o(s, dtype, seed);
          const ForwardOut out = fa3.forward(p, dtype, in, nullptr);
          const Grads first = fa3.backward(p, dtype, in, out, dO);
          for (int run = 1; run < 4; ++run) {
            const Grads again = fa3.backward(p, dtype, in, out, dO);
            CHECK_MESSAGE(same_bits(again.dq, first.dq), "run " << run << ": dQ differs");
            CHECK_MESSAGE(same_bits(again.dk, first.dk), "run " << run << ": dK differs");
            CHECK_MESSAGE(same_bits(again.dv, first.dv), "run " << run << ": dV differs");
          }
        }
}

TEST_CASE("cuda-fa3-ws's backward, deterministic and causal, with more K/V blocks in a head than the GPU holds at once") {
  if (skip_unless_hopper()) return;
  // 20000 keys are 157 K/V blocks at d <= 128 and 313 at d = 256, more than the 132 an H100 or H200 runs at once (one
  // per SM). Causal, each block waits for the next one's addition to dQ; launched in the wrong order the resident
  // blocks wait for blocks that cannot start, and this case never returns. The deterministic dQ is also checked
  // against the default mode's: the same fp32 partial sums added in another order, so they may differ by about
  // a rounding of the output dtype, never by a missing or doubled partial.
  for (int d : kBackwardHeadDims) {
    Shape s = shape(1, 1, 1, 20000, 20000);
    s.head_dim = d;
    Problem p{.shape = s, .options = opts(CausalAlign::TopLeft)};
    const std::uint64_t seed = fresh_seed();
    INFO(describe(p, DType::BF16, seed));
    const Variant& fa3 = find_variant("cuda-fa3-ws");
    const Qkv in = random_qkv(s, DType::BF16, seed);
    const HostTensor dO = random_like_o(s, DType::BF16, seed);
    const ForwardOut out = fa3.forward(p, DType::BF16, in, nullptr);
    const Grads any_order = fa3.backward(p, DType::BF16, in, out, dO);
    p.options.deterministic = true;
    const Grads first = fa3.backward(p, DType::BF16, in, out, dO);
    const Grads again = fa3.backward(p, DType::BF16, in, out, dO);
    CHECK_MESSAGE(same_bits(again.dq, first.dq), "dQ differs between two deterministic runs");
    double largest = 0;
    for (double b : any_order.dq.data) largest = std::max(largest, std::abs(b));
    std::size_t off = 0, first_off = 0;
    for (std::size_t e = 0; e < any_order.dq.data.size(); ++e) {
      const double a = first.dq.data[e], b = any_order.dq.data[e];
      if (!(std::abs(a - b) <= std::abs(b) / 128 + largest * 1e-5) && off++ == 0) first_off = e;  // NaN fails too
    }
    CHECK_MESSAGE(off == 0, off << " elements of the deterministic dQ differ from the default mode's by more than a bf16 "
                                   "rounding, the first at " << first_off << ": " << first.dq.data[first_off] << " vs "
                                << any_order.dq.data[first_off]);
  }
}

TEST_CASE("cuda-fa3-ws's backward refuses head dim 96 and cuda-fa2 refuses --deterministic, one sentence each") {
  Problem p{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 16, .seq_k = 16, .head_dim = 96},
            .options = Options{}};
  const Qkv in = random_qkv(p.shape, DType::BF16, 1);
  const ForwardOut fwd{HostTensor(q_dims(p.shape)), HostTensor(lse_dims(p.shape))};
  const HostTensor dO = random_like_o(p.shape, DType::BF16, 2);
  const std::string d96 = refusal([&] { (void)find_variant("cuda-fa3-ws").backward(p, DType::BF16, in, fwd, dO); });
  CHECK_MESSAGE(d96 == "variant cuda-fa3-ws does not support head_dim 96: it supports head dims 64, 128, 256", d96);

  p.shape.head_dim = 64;
  p.options.deterministic = true;
  const Qkv in64 = random_qkv(p.shape, DType::BF16, 3);
  const ForwardOut fwd64{HostTensor(q_dims(p.shape)), HostTensor(lse_dims(p.shape))};
  const std::string det =
      refusal([&] { (void)find_variant("cuda-fa2").backward(p, DType::BF16, in64, fwd64, random_like_o(p.shape, DType::BF16, 4)); });
  CHECK_MESSAGE(det.find("variant cuda-fa2's backward adds dQ's partial sums with atomics") == 0, det);
  CHECK_MESSAGE(det.find("cuda-fa3-ws") != std::string::npos, det);
}
