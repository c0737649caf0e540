#pragma once
// Host-side checks shared by cuda-fa3-ws's forward and backward launchers (fa3_ws/forward_kernel.cuh,
// fa3_ws_backward.cu): a CUDA runtime call's result, and the GPU the sm_90a kernels need.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace flashlab::cuda::fa3_ws {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda-fa3-ws: ") + what + " failed: " + cudaGetErrorString(e));
}

inline void require_hopper() {
  int dev = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0) {
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    throw std::invalid_argument(std::string("cuda-fa3-ws needs a Hopper GPU (compute capability 9.0); this GPU is ") +
                                prop.name + " (sm_" + std::to_string(major) + std::to_string(minor) + ")");
  }
}

}  // namespace flashlab::cuda::fa3_ws
