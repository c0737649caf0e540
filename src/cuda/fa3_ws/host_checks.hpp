#pragma once
// What cuda-fa3-ws's launchers (fa3_ws/forward_kernel.cuh, fa3_ws/backward.cu) check on the host: a CUDA runtime
// call's result, and their preconditions. The problem itself (dtype, head dim, options, the GPU's generation) is
// checked once, by the registry, against cuda/constraints.hpp, before any entry point calls in; a launcher only
// asserts what the registry promised, so a failure here is a bug of the caller (std::logic_error), never a
// second sentence for the user.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/gpu_facts.hpp"

namespace flashlab::cuda::fa3_ws {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda-fa3-ws: ") + what + " failed: " + cudaGetErrorString(e));
}

// A launcher's precondition.
inline void expect(bool holds, const std::string& what) {
  if (!holds) throw std::logic_error("cuda-fa3-ws: " + what + " (the registry, or the launcher's caller, should have seen to it)");
}

// The current GPU runs the sm_90a kernels (compute capability 9.0). (What the launchers ask of the GPU, and ask
// once: cuda/gpu_facts.hpp.)
inline bool on_hopper() { return current_gpu().compute_capability == 90; }

}  // namespace flashlab::cuda::fa3_ws
