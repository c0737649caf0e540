// Lesson 04's test: your FA1 kernel (exercise.cu) on the GPU against the project's reference
// (naive_forward<double>), on one K/V block and on many, ragged last blocks, seq_q != seq_k. A failure
// says in plain words what to look at. (How often FA1 reads each row of O, once per K/V block, is the
// loop order's cost, not your code's: `flashlab trace --algorithm fa1` counts it, and lesson 05 removes it.)
// Without a CUDA device the suite exits 77 and CTest reports it skipped.
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
namespace lesson = flashlab::lesson04;

namespace {

struct Fa1Run {
  HostTensor O;    // (1, seq_q, 1, d)
  HostTensor lse;  // (1, 1, seq_q): m + log l, as left in HBM
};

// One head (B = H = 1): the (B, S, H, D) tensors are then plain (S, d) row-major arrays.
Problem one_head(int seq_q, int seq_k, int d) {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = seq_q, .seq_k = seq_k, .head_dim = d};
  return p;
}

Fa1Run run_your_kernel(const Problem& p, const Qkv& in) {
  const Shape& s = p.shape;
  auto q = upload<float>(in.q), k = upload<float>(in.k), v = upload<float>(in.v);
  DeviceBuffer<float> O(q.size()), m(s.seq_q), l(s.seq_q);
  poison(O);  // an element your kernel never writes stays NaN
  poison(m);
  poison(l);
  lesson::launch_fa1_forward(q.data(), k.data(), v.data(), O.data(), m.data(), l.data(), s.seq_q, s.seq_k,
                             s.head_dim, static_cast<float>(p.softmax_scale()));
  CUDA_CHECK(cudaDeviceSynchronize());
  Fa1Run r{download(O, q_dims(s)), HostTensor(lse_dims(s))};
  const HostTensor mh = download(m, {s.seq_q}), lh = download(l, {s.seq_q});
  for (int i = 0; i < s.seq_q; ++i) r.lse.data[i] = mh.data[i] + std::log(lh.data[i]);
  return r;
}

bool all_zero(const HostTensor& t) {
  for (double x : t.data)
    if (x != 0.0) return false;
  return true;
}

// "" when O is right, else what is wrong and where to look.
std::string diagnose_output(const Problem& p, const HostTensor& O, const HostTensor& ref) {
  const ErrorStats e = compare(O, ref);
  const Bound bound = tolerance(DType::F32, Quantity::Forward, e, nullptr);
  if (bound.passes(e)) return "";
  const int Tc = (p.shape.seq_k + lesson::kBc - 1) / lesson::kBc;
  if (e.has_nan)
    return "O contains NaN: are K_j and V_j copied into shared memory (TODO 1) before they are used, "
           "and is l_new never 0?";
  if (all_zero(O)) return "O is all zeros: TODO 2 must compute the new O_i (Algorithm 1, line 12) and keep it in o[]";
  std::string msg = "O differs from the reference by relative error " + std::to_string(e.rel) + " (allowed " +
                    bound.rule + ")";
  if (Tc > 1)
    msg += "; with " + std::to_string(Tc) + " K/V blocks every update matters: the old O_i must be scaled by "
           "l_old * exp(m_old - m_new), the new P~_ij V_j by exp(m~ - m_new), and the sum divided by l_new";
  else
    msg += "; with a single K/V block, check the tile copy (TODO 1: key c of block j is row j * kBc + c of K)";
  return msg;
}

void check_against_reference(int seq_q, int seq_k, int d) {
  const Problem p = one_head(seq_q, seq_k, d);
  const std::uint64_t seed = 0x5eed03 + seq_q * 131 + seq_k * 7 + d;
  INFO("seq_q = " << seq_q << ", seq_k = " << seq_k << ", d = " << d << ", seed = " << seed);
  const Qkv in = random_qkv(p.shape, DType::F32, seed);
  const ForwardOut ref = naive_forward<double>(p, in);
  const Fa1Run got = run_your_kernel(p, in);
  const std::string problem = diagnose_output(p, got.O, ref.o);
  CHECK_MESSAGE(problem.empty(), problem);
  const ErrorStats e = compare(got.lse, ref.lse);
  CHECK_MESSAGE(tolerance(DType::F32, Quantity::Forward, e, nullptr).passes(e),
                "m and l left in HBM are not the row max and row sum: m + log(l) should be the log-sum-exp of "
                "each row of S, relative error " << e.rel);
}

}  // namespace

TEST_CASE("your FA1 kernel matches the reference with a single K/V block") { check_against_reference(20, 32, 16); }

TEST_CASE("your FA1 kernel matches the reference over many K/V blocks and ragged tiles") {
  check_against_reference(64, 64, 64);
  check_against_reference(37, 100, 16);
  check_against_reference(100, 37, 64);
  check_against_reference(129, 250, 40);
}

// The cases `flashlab verify` runs anyone's kernel through (docs/VERIFY.md), as many as your one-head, unmasked
// kernel takes: heads and batches one at a time, seq_q != seq_k both ways, up to 1024 keys. When some fail,
// verify's diagnosis says what they have in common (a missing rescale shows as "rescale").
TEST_CASE("your FA1 kernel passes flashlab verify's quick suite (its unmasked f32 cases)") {
  const auto yours = [](const Problem& p, const Qkv& in) {
    const auto r = run_your_kernel(p, in);
    return ForwardOut{r.O, r.lse};
  };
  const VerifyReport report = verify_one_head("your FA1 kernel (lesson 04)", lesson::kMaxHeadDim, 0x5eed04, yours);
  INFO(verify_report_text(report, "exercise.cu"));
  CHECK(report.ok());
  CHECK(report.passed >= 10);  // the unmasked cases of the 20
}
