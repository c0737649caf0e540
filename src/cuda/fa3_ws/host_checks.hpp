#pragma once
// What cuda-fa3-ws's launchers (fa3_ws/forward_kernel.cuh, fa3_ws/backward.cu) check on the host: a CUDA runtime
// call's result, and their preconditions. The problem itself (dtype, head dim, options, the GPU's generation) is
// checked once, by the registry, against cuda/constraints.hpp, before any entry point calls in; a launcher only
// asserts what the registry promised, so a failure here is a bug of the caller (std::logic_error), never a
// second sentence for the user.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/gpu_facts.hpp"

namespace flashlab::cuda::fa3_ws {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda-fa3-ws: ") + what + " failed: " + cudaGetErrorString(e));
}

// A launcher's precondition: `what` is its sentence, or a function that builds the sentence from the values at hand.
// The sentence is made only when the precondition fails: the checks run on every launch, and a string built there
// costs the host a heap allocation each time.
[[noreturn]] inline void precondition_failed(const std::string& what) {
  throw std::logic_error("cuda-fa3-ws: " + what + " (the registry, or the launcher's caller, should have seen to it)");
}
inline void expect(bool holds, const char* what) {
  if (!holds) precondition_failed(what);
}
template <class Describe>
  requires std::is_invocable_r_v<std::string, Describe&>
void expect(bool holds, Describe&& describe) {
  if (!holds) precondition_failed(describe());
}

// The current GPU runs the sm_90a kernels (compute capability 9.0). (What the launchers ask of the GPU, and ask
// once: cuda/gpu_facts.hpp.)
inline bool on_hopper() { return current_gpu().compute_capability == 90; }

}  // namespace flashlab::cuda::fa3_ws
