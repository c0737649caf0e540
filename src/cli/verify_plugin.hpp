#pragma once
// What the files of `flashlab verify` share: verify.cpp (the command, and plugins on host memory), verify_cuda.cpp
// (plugins on CUDA device memory; compiled only in a CUDA build) and verify_bench.cpp (--bench). A plugin is a C ABI
// (include/flashlab/plugin.h); these turn FlashLab's problems and tensors into its terms and back.
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "flashlab/plugin.h"
#include "verify/verify.hpp"

namespace flashlab::cli {

flashlab_dtype abi_dtype(DType);  // InputError (one sentence) for a dtype plugins do not take (f64, e4m3)
flashlab_problem abi_problem(const Problem&, DType);

// Throws std::runtime_error ("forward returned 3: <the plugin's sentence>") unless a plugin call returned 0.
void require_ok(int rc, const char* call, const char* message);
// The plugin's supports() as verify's KernelUnderTest::refuses ("" when it runs the problem); only for a plugin
// that has one.
std::function<std::string(const Problem&, DType)> plugin_refusal(const flashlab_attention_plugin&);

// A tensor in the plugin's element type, contiguous, in host memory: float for f32, the 16-bit patterns of f16 and
// bf16 otherwise. What a plugin on host memory reads and writes, and what goes to and comes from the device for a
// plugin on CUDA memory.
class HostBuffer {
 public:
  HostBuffer(const HostTensor&, DType);                   // rounded to the dtype
  HostBuffer(std::vector<std::int64_t> dims, DType);      // every element NaN: an element never written fails
  HostBuffer(const std::vector<float>& values, DType);    // one dimension, rounded to the dtype
  void* data();
  const void* data() const;
  std::size_t bytes() const;
  flashlab_strides strides() const;  // of a contiguous (B, S, H, D) tensor
  HostTensor tensor() const;         // the values, as doubles
  DType dtype() const { return dtype_; }

 private:
  std::vector<float> f32_;
  std::vector<std::uint16_t> bits_;
  DType dtype_;
  std::vector<std::int64_t> dims_;
};

// The strides, in elements, of a contiguous (B, S, H, D) tensor.
flashlab_strides contiguous_strides(const std::vector<std::int64_t>& dims);

// --bench's timing of one plugin call: the median of kBenchTimedRuns timed runs after one warm-up, each timed by
// `run_ms` (which makes the call once and returns its milliseconds); a single timed run when the warm-up took over
// kBenchSlowRunMs. FlashLab's own variants get one warm-up and kBenchTimedRuns runs too.
constexpr int kBenchTimedRuns = 3;
constexpr double kBenchSlowRunMs = 1000;
double bench_median_ms(const std::function<double()>& run_ms);

// The plugin's times on one problem: the forward, and the backward (reading the forward's O and LSE) when asked and
// possible; -1 when not timed, with why in `no_backward`.
struct PluginTimes {
  double forward_ms = -1, backward_ms = -1;
  std::string no_backward;
};

// verify_bench.cpp: after a verdict of `report` (every case passed), the plugin timed on a few large problems in the
// dtypes and at a head dim it passed, beside FlashLab's variants that run the same problems on the same device and
// PyTorch's SDPA (timed on that device by `python`, sdpa_child.hpp), as one table. `seqs`: the sequence lengths
// (empty: the defaults for the plugin's memory).
void print_verify_bench(std::ostream& out, std::ostream& err, const flashlab_attention_plugin&, const VerifyReport&,
                        const std::vector<int>& seqs, const std::string& python);

#ifdef FLASHLAB_HAVE_CUDA
// verify_cuda.cpp: a plugin on CUDA device memory as verify's kernel (inputs copied to device 0, outputs poisoned
// with NaN there, the plugin called on a stream created here, the stream synchronized, the outputs copied back), and
// its times on one problem (CUDA events on that stream).
KernelUnderTest cuda_kernel_of(const flashlab_attention_plugin&);
PluginTimes time_cuda_plugin(const flashlab_attention_plugin&, const Problem&, DType, bool backward);
#endif

// verify_bench.cpp: the same for a plugin on host memory (a host clock).
PluginTimes time_host_plugin(const flashlab_attention_plugin&, const Problem&, DType, bool backward);

}  // namespace flashlab::cli
