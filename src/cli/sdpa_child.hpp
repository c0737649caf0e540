#pragma once
// PyTorch's scaled_dot_product_attention timed for `flashlab verify --bench`: the CLI cannot link PyTorch, so a
// Python interpreter runs python/flashlab/_sdpa_timer.py in a child process, given the problems as JSON on stdin and
// answering with SDPA's times as JSON on stdout (the timer's docstring has both formats). The timer's absolute path
// is baked in at configure time (src/cli/CMakeLists.txt), so a fresh build finds it without any setting. Whatever
// goes wrong (no interpreter, no PyTorch, no CUDA in it, a crash, a reply that is not the expected JSON) comes back
// as one sentence, never as an exception: a missing SDPA row is never verify's failure.
#include <cstddef>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "registry/variants.hpp"

namespace flashlab::cli {

// One problem for SDPA: its forward, and its forward + backward when `backward`.
struct SdpaProblem {
  Problem problem;
  DType dtype = DType::F32;
  bool backward = false;
};

// SDPA's times on one problem, -1 where it did not run it (why in `note`); the backend PyTorch's dispatcher picked
// ("flash", "cudnn", "efficient", "math"), empty where PyTorch does not say.
struct SdpaTime {
  double forward_ms = -1, forward_backward_ms = -1;
  std::string forward_backend, forward_backward_backend, note;
};

// The timer's answer: a time per problem asked, in order, and `about`, a phrase naming PyTorch's version, the device
// and the clock; or, when nothing was timed, `times` empty and `why_not` one sentence.
struct SdpaTimes {
  std::vector<SdpaTime> times;
  std::string about, why_not;
};

// The JSON request for the timer: SDPA on `device` (CUDA device 0, or the host CPU), with --bench's protocol
// (bench_median_ms: one warm-up, the median of kBenchTimedRuns, a single run after a slow warm-up).
std::string sdpa_request(const std::vector<SdpaProblem>& problems, Device device);

// The timer's reply read back, checked against the number of problems asked; `python` names the interpreter in the
// sentences.
SdpaTimes read_sdpa_reply(const std::string& reply, std::size_t problems, const std::string& python);

// What a child process printed and how it ended: its exit status, or the signal that ended it (then status -1).
struct ChildRun {
  int exit_status = -1, signal = 0;
  std::string out, err;
};

// Runs argv (argv[0] looked up on PATH when it holds no '/') with `input` as its stdin and waits for it. Throws
// std::runtime_error with one sentence when it cannot be started or waited for, or, with timeout_s > 0, when its
// output has not ended within timeout_s seconds (it is then killed, so that a hung interpreter cannot hang verify).
ChildRun run_child(const std::vector<std::string>& argv, const std::string& input, int timeout_s = 0);

// How long time_sdpa gives the timer: PyTorch's import plus every problem's warm-up and runs, with room for a CPU
// SDPA on --bench's largest shapes.
inline constexpr int kSdpaTimeoutSeconds = 900;

// The timer this flashlab was built with (python/flashlab/_sdpa_timer.py of its source tree).
std::string sdpa_timer_path();

// SDPA timed on the problems by `python` running `timer`. Never throws: every failure is `why_not`.
SdpaTimes time_sdpa(const std::string& python, const std::vector<SdpaProblem>& problems, Device device,
                    const std::string& timer = sdpa_timer_path());

}  // namespace flashlab::cli
