#pragma once
// What cuda-fa3-ws's launchers (fa3_ws/forward_kernel.cuh, fa3_ws/backward.cu) check on the host: a CUDA runtime
// call's result, and their preconditions; and what they ask of the GPU, asked of the runtime once per device. The problem itself (dtype, head dim, options, the GPU's generation) is
// checked once, by the registry, against cuda/constraints.hpp, before any entry point calls in; a launcher only
// asserts what the registry promised, so a failure here is a bug of the caller (std::logic_error), never a
// second sentence for the user.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

namespace flashlab::cuda::fa3_ws {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("cuda-fa3-ws: ") + what + " failed: " + cudaGetErrorString(e));
}

// A launcher's precondition.
inline void expect(bool holds, const std::string& what) {
  if (!holds) throw std::logic_error("cuda-fa3-ws: " + what + " (the registry, or the launcher's caller, should have seen to it)");
}

// What a launch asks of the current GPU. The answers cannot change while the process runs, so they are asked of the
// runtime once per device and kept: a launch then costs the host no attribute queries.
struct Gpu {
  int device = 0;
  bool hopper = false;  // runs the sm_90a kernels (compute capability 9.0)
  int sms = 0;
  int l2_bytes = 0;
};

inline Gpu current_gpu() {
  static std::mutex mutex;
  static std::map<int, Gpu> asked;
  Gpu gpu;
  check_cuda(cudaGetDevice(&gpu.device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto known = asked.find(gpu.device); known != asked.end()) return known->second;
  int major = 0, minor = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu.device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, gpu.device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&gpu.sms, cudaDevAttrMultiProcessorCount, gpu.device),
             "cudaDeviceGetAttribute(SM count)");
  check_cuda(cudaDeviceGetAttribute(&gpu.l2_bytes, cudaDevAttrL2CacheSize, gpu.device), "cudaDeviceGetAttribute(L2 size)");
  gpu.hopper = major == 9 && minor == 0;
  asked.emplace(gpu.device, gpu);
  return gpu;
}

// The current GPU runs the sm_90a kernels (compute capability 9.0).
inline bool on_hopper() { return current_gpu().hopper; }

// Lets `kernel` take `bytes` of dynamic shared memory on the current device (cudaFuncSetAttribute), once per kernel,
// device and size: the attribute stays set for the rest of the process.
inline void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, bool> allowed;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  bool& done = allowed[{kernel, dev, bytes}];
  if (done) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  done = true;
}

// How many blocks of `threads` threads (and no dynamic shared memory) of `kernel` one SM of the current device
// holds, asked once per kernel and device.
inline int blocks_per_sm(const void* kernel, int threads) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int> asked;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  int& blocks = asked[{kernel, dev, threads}];
  if (blocks == 0)
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

}  // namespace flashlab::cuda::fa3_ws
