#pragma once
// `flashlab verify`: anyone's attention kernel through the cases FlashLab checks its own with, judged by the
// same rule against the same ground truth (cpu_reference/reference.hpp: naive attention in double, and for
// f16/bf16 a multiple of naive attention's own error in that precision), and a diagnosis: what the failing
// cases have in common, in words. A layer of its own on the CPU layers, so that the course's CPU-emulated
// exercises are checked through it too.
//
// The kernel comes as a KernelUnderTest: functions on host tensors. The CLI wraps a plugin's C ABI
// (include/flashlab/plugin.h) in one; anything else that can compute attention can be wrapped the same way.
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "core/tolerance.hpp"

namespace flashlab {

// Thrown by a KernelUnderTest's forward for a problem it does not run: verify lists the case as refused, not
// failed.
struct KernelRefusal : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct KernelUnderTest {
  std::string name;
  bool writes_lse = true;
  // Why the kernel cannot run a problem in a dtype, or "" when it can. Empty function: it runs everything.
  std::function<std::string(const Problem&, DType)> refuses;
  // O (and the LSE when writes_lse) from inputs already rounded to the dtype. Throws to report a failure.
  std::function<ForwardOut(const Problem&, DType, const Qkv&)> forward;
  // Empty: no backward. dQ, dK, dV from the inputs, O and the LSE, and dO. verify passes the reference's O
  // (rounded to the dtype) and LSE, so that the backward is judged on its own.
  std::function<Grads(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& d_o)> backward;
};

// A kernel that computes one head at a time (B = H = 1), without a mask, in f32, up to max_head_dim (the
// course's exercises): verify runs it on every (batch, head) of a case and refuses the masks, dtypes and head
// dims it does not have. `one_head` gets a one-head problem and its inputs and returns O and the LSE.
KernelUnderTest one_head_kernel(std::string name, int max_head_dim,
                                std::function<ForwardOut(const Problem&, const Qkv&)> one_head);

enum class VerifySuite { Quick, Full };
VerifySuite parse_verify_suite(const std::string&);  // "quick" or "full"; InputError otherwise

struct VerifyRequest {
  VerifySuite suite = VerifySuite::Quick;
  std::vector<DType> dtypes = {DType::F32, DType::F16, DType::BF16};  // tried; those the kernel refuses are listed
  std::vector<int> head_dims = {32, 64, 128, 256};                     // likewise
  std::uint64_t seed = 0;                                              // every case's inputs derive from it
  bool backward = true;                                                // when the kernel has one
};

struct VerifyCase {
  Problem problem;
  DType dtype = DType::F32;
};
std::string describe(const VerifyCase&);  // "B=1 H=4/2 S_q=127 S_k=200 d=64 bottom-right f32"

struct VerifyOutput {
  std::string name;  // "O", "LSE", "dQ", "dK", "dV"
  ErrorStats error;
  std::string bound;
  bool pass = false;
  double used = 0;  // the error as a fraction of its bound (over 1: out of bounds)
};
struct VerifyCaseResult {
  VerifyCase c;
  std::string error;                 // the kernel threw (a failure)
  std::vector<VerifyOutput> outputs;
  bool pass() const;
};
// The first element of the first failing output of the first failing case that is out of bounds (abs bound: over
// the limit; rel bound: |ours - ref| over limit x max |ref|), or the worst one when no single element is.
struct ElementFailure {
  std::string case_label, output;
  std::vector<std::int64_t> index;  // (b, s, h, d) or (b, h, s) for the LSE
  double ours = 0, reference = 0;
};
// What the failures have in common. id: "lse-base-2", "scale", "group-sum", "alignment", "mask", "tail",
// "rescale", or "unknown"; sentence: the same in words, with the numbers that show it.
struct Finding {
  std::string id, sentence;
};
struct Refusal {
  DType dtype;
  int head_dim;
  std::string why;
  std::string case_label;  // the case refused; empty when the kernel refused the pair outright
};

struct VerifyReport {
  std::string kernel;
  VerifySuite suite = VerifySuite::Quick;
  std::uint64_t seed = 0;
  bool backward = false;
  std::vector<Refusal> refused;        // the dtype / head-dim pairs the kernel said it does not run
  std::vector<VerifyCaseResult> cases; // the cases it ran
  int passed = 0, failed = 0;
  std::optional<Finding> diagnosis;    // when some case failed
  std::optional<ElementFailure> first_failure;
  bool ok() const { return failed == 0 && !cases.empty(); }
};

// The suite's cases for the dtype / head-dim pairs the kernel runs ("quick": about 20, "full": those for each pair
// and about 120 more), and the run. InputError when the kernel runs none of the pairs asked for.
VerifyReport verify(const KernelUnderTest&, const VerifyRequest&);

// The course's check of an exercise: its one-head kernel (one_head_kernel) through the quick suite, in f32,
// forward only, at the head dims 16, 40, 64 and 128 up to max_head_dim.
VerifyReport verify_one_head(const std::string& name, int max_head_dim, std::uint64_t seed,
                             std::function<ForwardOut(const Problem&, const Qkv&)> one_head);

// The report as `flashlab verify` prints it: what ran, what was refused, a line per case, the count, the
// diagnosis and the first failing element. `source` says where the kernel came from (a plugin's path).
std::string verify_report_text(const VerifyReport&, const std::string& source);

}  // namespace flashlab
