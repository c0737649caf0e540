// Ring attention on one GPU (cuda/ring.hpp: P ranks as P streams, K/V shares and their dK/dV partials moved by
// device-to-device copies, cuda-fa3-ws as the block kernel, the LSE merge and the partial sums in fp32) against
// naive attention in double, by the FlashAttention rule of core/tolerance.hpp for O, L and the backward's dQ, dK,
// dV (from the ring's own O and L, as a ring would run them): every layout, P = 1..4 and 8, no mask and both
// causal alignments, GQA, batch > 1, odd lengths where the layout allows them. The outputs are poisoned with NaN
// before the run, so a token no rank writes fails. And what it refuses, in one sentence.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <string>

#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "cuda/ring.hpp"
#include "cuda/ring_nccl.hpp"
#include "gpu/flashattention_rule.hpp"
#include "gpu/fresh_inputs.hpp"
#include "model/ring.hpp"
#include "registry/ring.hpp"
#include "registry/variants.hpp"

namespace {

using namespace flashlab;

bool skip_unless_hopper() {
  if (cuda_compute_capability() == 90) return false;
  MESSAGE("skipped: the GPU ring's blocks are cuda-fa3-ws's, which run on compute capability 9.0 only, and this GPU is "
          << cuda_device_name());
  return true;
}

// The ring's backward from its own forward's O and L, against naive attention's backward.
void check_ring_backward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in, std::uint64_t seed,
                         const ForwardOut& out, const ForwardOut& ref, const ForwardOut& lowp,
                         RingBlockKernel kernel = RingBlockKernel::Fa3Ws) {
  const HostTensor dO = random_like_o(p.shape, dtype, seed);
  const Grads gref = naive_backward<double>(p, in, ref, dO);
  const Grads glowp = naive_backward_lowp(p, dtype, in, lowp, dO);
  const Grads g = cuda_ring_backward(ring, p, dtype, in, out, dO, kernel);
  check_output("dQ", dtype, Quantity::Gradient, g.dq, gref.dq, glowp.dq);
  check_output("dK", dtype, Quantity::Gradient, g.dk, gref.dk, glowp.dk);
  check_output("dV", dtype, Quantity::Gradient, g.dv, gref.dv, glowp.dv);
}

void check_ring(RingLayout layout, int P, Shape shape, CausalAlign causal, DType dtype,
                RingBlockKernel kernel = RingBlockKernel::Fa3Ws) {
  const std::uint64_t seed = fresh_seed();
  Problem p{.shape = shape, .options = Options{.causal = causal}};
  INFO(to_string(layout) << " P=" << P << " " << to_string(kernel) << " blocks, " << describe(p, dtype, seed));
  const Qkv in = random_qkv(shape, dtype, seed);
  const ForwardOut ref = naive_forward<double>(p, in);
  const ForwardOut lowp = naive_forward_lowp(p, dtype, in);
  const RingSchedule ring = ring_schedule(layout, P, shape.seq_q, shape.seq_k, causal);
  const ForwardOut out = cuda_ring_forward(ring, p, dtype, in, kernel);
  check_output("O", dtype, Quantity::Forward, out.o, ref.o, lowp.o);
  check_output("L", dtype, Quantity::Forward, out.lse, ref.lse, lowp.lse);
  check_ring_backward(ring, p, dtype, in, seed, out, ref, lowp, kernel);
}

Shape shape(int batch, int heads_q, int heads_kv, int seq, int head_dim) {
  return Shape{.batch = batch, .heads_q = heads_q, .heads_kv = heads_kv, .seq_q = seq, .seq_k = seq, .head_dim = head_dim};
}

}  // namespace

TEST_CASE("the GPU ring equals naive attention on every layout, P = 1..4 and 8, with and without a causal mask") {
  if (skip_unless_hopper()) return;
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped})
    for (int P : {1, 2, 3, 4, 8})
      for (CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
        check_ring(layout, P, shape(1, 2, 2, 240, 64), causal, DType::BF16);
}

TEST_CASE("the GPU ring: odd lengths (contiguous, striped), GQA, batch > 1, f16, head dims 128 and 256") {
  if (skip_unless_hopper()) return;
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Striped})
    for (CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft}) {
      check_ring(layout, 3, shape(2, 4, 2, 301, 128), causal, DType::BF16);
      check_ring(layout, 4, shape(3, 2, 1, 257, 64), causal, DType::F16);
    }
  check_ring(RingLayout::Zigzag, 4, shape(2, 4, 1, 392, 128), CausalAlign::BottomRight, DType::F16);
  check_ring(RingLayout::Zigzag, 2, shape(1, 2, 2, 512, 256), CausalAlign::TopLeft, DType::BF16);
  // Non-causal, seq_q != seq_k: every pair is fully visible.
  Shape cross = shape(2, 2, 2, 200, 64);
  cross.seq_k = 333;
  const Problem p{.shape = cross, .options = {}};
  const std::uint64_t seed = fresh_seed();
  INFO(describe(p, DType::BF16, seed));
  const Qkv in = random_qkv(cross, DType::BF16, seed);
  const ForwardOut ref = naive_forward<double>(p, in), lowp = naive_forward_lowp(p, DType::BF16, in);
  const RingSchedule ring = ring_schedule(RingLayout::Striped, 3, 200, 333, CausalAlign::None);
  const ForwardOut out = cuda_ring_forward(ring, p, DType::BF16, in);
  check_output("O", DType::BF16, Quantity::Forward, out.o, ref.o, lowp.o);
  check_output("L", DType::BF16, Quantity::Forward, out.lse, ref.lse, lowp.lse);
  check_ring_backward(ring, p, DType::BF16, in, seed, out, ref, lowp);
}

TEST_CASE("bench_ring_on_one_gpu times both passes and counts the ranks' buffers in its peak memory") {
  if (skip_unless_hopper()) return;
  const Problem p{.shape = shape(1, 4, 4, 1024, 128), .options = Options{.causal = CausalAlign::BottomRight}};
  const BenchResult r = bench_ring_on_one_gpu(RingLayout::Zigzag, 4, p, DType::BF16,
                                              BenchSettings{.warmup = 0, .iters = 2, .backward = true});
  CHECK(r.forward_ms > 0);
  CHECK(r.backward_ms > 0);
  // Beyond q, k, v, o, lse, dO, dq, dk, dv: at least each rank's packed queries and two K/V slots.
  CHECK(r.peak_bytes > r.io_bytes + std::size_t(1024) * 4 * 128 * 2 * 3);
  const BenchResult fa2 = bench_ring_on_one_gpu(RingLayout::Striped, 3, p, DType::F16,
                                                BenchSettings{.warmup = 0, .iters = 1, .backward = true}, "cuda-fa2");
  CHECK(fa2.forward_ms > 0);
  CHECK(fa2.backward_ms > 0);
  CHECK(refusal([&] { bench_ring_on_one_gpu(RingLayout::Striped, 3, p, DType::F16, BenchSettings{}, "cuda-fa1"); }) ==
        "the ring's blocks run on cuda-fa3-ws or cuda-fa2, not cuda-fa1");
}

TEST_CASE("the GPU ring on cuda-fa2 blocks (any GPU): every layout and alignment, GQA, odd lengths, head dims 32 and 96") {
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Zigzag, RingLayout::Striped})
    for (int P : {2, 3, 4})
      for (CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft, CausalAlign::BottomRight})
        check_ring(layout, P, shape(1, 2, 2, 240, 64), causal, DType::BF16, RingBlockKernel::Fa2);
  for (RingLayout layout : {RingLayout::Contiguous, RingLayout::Striped}) {
    check_ring(layout, 3, shape(2, 4, 2, 301, 96), CausalAlign::TopLeft, DType::F16, RingBlockKernel::Fa2);
    check_ring(layout, 4, shape(1, 2, 1, 257, 32), CausalAlign::None, DType::BF16, RingBlockKernel::Fa2);
  }
  check_ring(RingLayout::Zigzag, 2, shape(1, 2, 2, 512, 256), CausalAlign::BottomRight, DType::BF16, RingBlockKernel::Fa2);
  CHECK(refusal([&] {
          const Shape s = shape(1, 2, 2, 96, 48);
          cuda_ring_forward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None), Problem{.shape = s, .options = {}},
                            DType::BF16, random_qkv(s, DType::BF16, 5), RingBlockKernel::Fa2);
        }) == "the GPU ring's blocks are cuda-fa2's, whose forward supports head dims 32, 64, 96, 128, 256, not 48");
}

// `flashlab ring ARGS` as a command (its ranks are processes): exit code and stdout + stderr.
std::pair<int, std::string> flashlab_ring(const std::string& args) {
  const std::string command = std::string(FLASHLAB_CLI) + " ring " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST_CASE("flashlab ring over NCCL with one rank (the smoke test NCCL allows on one GPU): checked, timed, and refused") {
  if (skip_unless_hopper()) return;
  if (!nccl_available()) {
    MESSAGE("skipped: this build has no NCCL");
    return;
  }
  for (const char* layout : {"contiguous", "zigzag", "striped"}) {
    const auto [code, output] = flashlab_ring(std::string("--gpus 1 --check --backward --layout ") + layout +
                                              " --seq-q 300 --heads 4 --heads-kv 2 --head-dim 128 --causal bottom-right");
    INFO(output);
    CHECK(code == 0);
    CHECK(output.find("5 passed, 0 failed") != std::string::npos);
  }
  {
    const auto [code, output] = flashlab_ring(
        "--gpus 1 --check --backward --blocks cuda-fa2 --seq-q 200 --heads 2 --head-dim 96 --causal top-left");
    INFO(output);
    CHECK(code == 0);
    CHECK(output.find("5 passed, 0 failed") != std::string::npos);
  }
  {
    const auto [code, output] = flashlab_ring("--gpus 1 --backward --seq-q 2048 --heads 4 --head-dim 64 --iters 2");
    INFO(output);
    CHECK(code == 0);
    CHECK(output.find("forward") != std::string::npos);
    CHECK(output.find("backward") != std::string::npos);
  }
  if (cuda_device_count() < 2) {
    const auto [code, output] = flashlab_ring("--gpus 2 --check");
    CHECK(code == 2);
    CHECK(output.find("a ring of 2 ranks over NCCL needs 2 GPUs, one process per GPU, and this machine has 1") !=
          std::string::npos);
  }
}

TEST_CASE("the GPU ring refuses, in one sentence: split diagonal blocks, another problem's schedule, dropout, f32, d = 32") {
  const Shape s = shape(1, 2, 2, 96, 64);
  const Qkv in = random_qkv(s, DType::BF16, 1);
  Shape cross = s;
  cross.seq_k = 160;
  const Qkv in_cross = random_qkv(cross, DType::BF16, 2);
  const Problem causal_cross{.shape = cross, .options = Options{.causal = CausalAlign::BottomRight}};
  CHECK(refusal([&] {
          cuda_ring_forward(ring_schedule(RingLayout::Contiguous, 2, 96, 160, CausalAlign::BottomRight), causal_cross,
                            DType::BF16, in_cross);
        }).find("which would need a block of their own: it supports causal masks with seq_q == seq_k") != std::string::npos);
  const Problem plain{.shape = s, .options = {}};
  CHECK(refusal([&] {
          cuda_ring_forward(ring_schedule(RingLayout::Contiguous, 2, 96, 96, CausalAlign::TopLeft), plain, DType::BF16, in);
        }).find("the ring's schedule was made for") == 0);
  const Problem dropout{.shape = s, .options = Options{.dropout_p = 0.1}};
  CHECK(refusal([&] {
          cuda_ring_forward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None), dropout, DType::BF16, in);
        }).find("the GPU ring has no dropout") == 0);
  CHECK(refusal([&] {
          cuda_ring_forward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None), plain, DType::F32, in);
        }).find("take f16 or bf16, not f32") != std::string::npos);
  const Shape d32 = shape(1, 2, 2, 96, 32);
  CHECK(refusal([&] {
          cuda_ring_forward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None),
                            Problem{.shape = d32, .options = {}}, DType::BF16, random_qkv(d32, DType::BF16, 3));
        }) == "the GPU ring's blocks are cuda-fa3-ws's, whose forward supports head dims 64, 128, 256, not 32");
  // The backward refuses what the forward does, before any work.
  const ForwardOut fwd = cuda_ring_forward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None), plain,
                                           DType::BF16, in);
  const HostTensor dO = random_like_o(s, DType::BF16, 4);
  CHECK(refusal([&] {
          cuda_ring_backward(ring_schedule(RingLayout::Contiguous, 2, 160, 96, CausalAlign::None), plain, DType::BF16, in,
                             fwd, dO);
        }).find("the ring's schedule was made for") == 0);
  CHECK(refusal([&] {
          cuda_ring_backward(ring_schedule(RingLayout::Striped, 2, 96, 96, CausalAlign::None), dropout, DType::BF16, in,
                             fwd, dO);
        }).find("the GPU ring has no dropout") == 0);
  CHECK(refusal([&] {
          cuda_ring_backward(ring_schedule(RingLayout::Contiguous, 2, 96, 160, CausalAlign::BottomRight), causal_cross,
                             DType::BF16, in_cross, fwd, dO);
        }).find("which would need a block of their own") != std::string::npos);
}
