// Lesson 05's test: your FA2 kernel (exercise.cu) on the GPU against the project's reference
// (naive_forward<double>): O and the log-sum-exp L, on one K/V block and on many, ragged last blocks,
// seq_q != seq_k. It also checks what the loop swap buys: every row of O is written to HBM exactly
// once (lesson 04's FA1 read and wrote it once per K/V block), and the grid has one block per Q block.
// A failure says in plain words what to look at. Without a CUDA device the suite exits 77 (skipped).
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "verify/verify.hpp"
#include "cuda/common.cuh"
#include "lesson.hpp"

using namespace flashlab;
using namespace flashlab::cuda;
namespace lesson = flashlab::lesson05;

namespace {

struct Fa2Run {
  HostTensor O;    // (1, seq_q, 1, d)
  HostTensor lse;  // (1, 1, seq_q)
  unsigned long long o_row_writes = 0;
};

Problem one_head(int seq_q, int seq_k, int d) {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  return p;
}

Fa2Run run_your_kernel(const Problem& p, const Qkv& in) {
  const Shape& s = p.shape;
  auto q = upload<float>(in.q), k = upload<float>(in.k), v = upload<float>(in.v);
  DeviceBuffer<float> O(q.size()), L(s.seq_q);
  DeviceBuffer<unsigned long long> writes(1);
  poison(O);  // an element your kernel never writes stays NaN
  poison(L);
  zero(writes);
  lesson::launch_fa2_forward(q.data(), k.data(), v.data(), O.data(), L.data(), writes.data(), s.seq_q, s.seq_k,
                             s.head_dim, static_cast<float>(p.softmax_scale()));
  CUDA_CHECK(cudaDeviceSynchronize());
  Fa2Run r{download(O, q_dims(s)), download(L, lse_dims(s)), 0};
  CUDA_CHECK(cudaMemcpy(&r.o_row_writes, writes.data(), sizeof r.o_row_writes, cudaMemcpyDeviceToHost));
  return r;
}

// "" when O and L are right, else what is wrong and where to look.
std::string diagnose(const Problem& p, const Fa2Run& got, const ForwardOut& ref) {
  const ErrorStats eo = compare(got.O, ref.o), el = compare(got.lse, ref.lse);
  const Bound bo = tolerance(DType::F32, Quantity::Forward, eo, nullptr);
  const Bound bl = tolerance(DType::F32, Quantity::Forward, el, nullptr);
  const int Tc = (p.shape.seq_k + lesson::kBc - 1) / lesson::kBc;
  std::string msg;
  const int blocks = lesson::fa2_blocks(p.shape.seq_q), want = (p.shape.seq_q + lesson::kBr - 1) / lesson::kBr;
  if (blocks != want)
    msg += "your fa2_blocks(" + std::to_string(p.shape.seq_q) + ") launches " + std::to_string(blocks) +
           " thread blocks, so the query rows past the first " + std::to_string(blocks * lesson::kBr) +
           " are never computed: FA2 needs one block per " + std::to_string(lesson::kBr) + " query rows, " +
           std::to_string(want) + " here (TODO 3). ";
  if (eo.has_nan)
    msg += "O contains NaN: TODO 2 must write every element O_i = O~_i / l_i (and l_i must not stay 0: TODO 1 "
           "adds each 2^(s - m_new) into it). ";
  else if (!bo.passes(eo))
    msg += "O differs from the reference by relative error " + std::to_string(eo.rel) + " (allowed " + bo.rule +
           ")" +
           (Tc > 1 ? ": with " + std::to_string(Tc) +
                         " K/V blocks, both l_i and O~_i must be multiplied by 2^(m_old - m_new) before the new "
                         "block is added, and the exponentials taken against m_new. "
                   : ". ");
  if (el.has_nan || !bl.passes(el))
    msg += "L, the log-sum-exp, is wrong (relative error " + std::to_string(el.rel) +
           "): m_i is in base 2, so L_i = m_i * ln 2 + log(l_i).";
  return msg;
}

void check_against_reference(int seq_q, int seq_k, int d) {
  const Problem p = one_head(seq_q, seq_k, d);
  const std::uint64_t seed = 0x5eed04 + seq_q * 131 + seq_k * 7 + d;
  INFO("seq_q = " << seq_q << ", seq_k = " << seq_k << ", d = " << d << ", seed = " << seed);
  const Qkv in = random_qkv(p.shape, DType::F32, seed);
  const ForwardOut ref = naive_forward<double>(p, in);
  const std::string problem = diagnose(p, run_your_kernel(p, in), ref);
  CHECK_MESSAGE(problem.empty(), problem);
}

}  // namespace

TEST_CASE("your FA2 kernel matches the reference with a single K/V block") { check_against_reference(20, 32, 16); }

TEST_CASE("your FA2 kernel matches the reference over many K/V blocks and ragged tiles") {
  check_against_reference(64, 64, 64);
  check_against_reference(37, 100, 16);
  check_against_reference(100, 37, 64);
  check_against_reference(129, 250, 40);
}

TEST_CASE("FA2 writes every row of O to HBM exactly once, from one thread block per Q block") {
  const Problem p = one_head(96, 200, 32);
  const Fa2Run got = run_your_kernel(p, random_qkv(p.shape, DType::F32, 4));
  CHECK_MESSAGE(got.o_row_writes == static_cast<unsigned long long>(p.shape.seq_q),
                "expected each of the " << p.shape.seq_q << " rows of O to be written once, counted "
                                        << got.o_row_writes << " writes");
  // Parallel over query blocks: the grid grows with the sequence, so one long sequence fills the GPU.
  for (const int n : {1, lesson::kBr - 1, lesson::kBr, lesson::kBr + 1, 96, 1000})
    CHECK_MESSAGE(lesson::fa2_blocks(n) == (n + lesson::kBr - 1) / lesson::kBr,
                  "your fa2_blocks(" << n << ") is " << lesson::fa2_blocks(n) << ": FA2 launches one thread block per "
                                     << lesson::kBr << " query rows, ceil(" << n << " / " << lesson::kBr << ") = "
                                     << (n + lesson::kBr - 1) / lesson::kBr << " (TODO 3)");
}

// The cases `flashlab verify` runs anyone's kernel through (docs/VERIFY.md), as many as your one-head, unmasked
// kernel takes: heads and batches one at a time, seq_q != seq_k both ways, up to 1024 keys. When some fail,
// verify's diagnosis says what they have in common (a missing rescale shows as "rescale").
TEST_CASE("your FA2 kernel passes flashlab verify's quick suite (its unmasked f32 cases)") {
  const auto yours = [](const Problem& p, const Qkv& in) {
    const auto r = run_your_kernel(p, in);
    return ForwardOut{r.O, r.lse};
  };
  const VerifyReport report = verify_one_head("your FA2 kernel (lesson 05)", lesson::kMaxHeadDim, 0x5eed04, yours);
  INFO(verify_report_text(report, "exercise.cu"));
  CHECK(report.ok());
  CHECK(report.passed >= 10);  // the unmasked cases of the 20
}
