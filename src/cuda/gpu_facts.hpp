#pragma once
// What the launchers and the registry's checks ask of the current GPU: facts that cannot change while the process
// runs, so each is asked of the runtime once per device (or once per kernel and device) and kept. A call then costs
// the host no attribute query, which matters where PyTorch's operators call in thousands of times a second.
//
// Header-only: the caches are static locals of inline functions, one per program, so the standalone harnesses in
// tools/ that compile the launchers link nothing more for them.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

namespace flashlab::cuda {

struct GpuFacts {
  int device = 0;                   // the CUDA device ordinal
  int compute_capability = 0;       // major * 10 + minor: 90 on an H100 or H200
  int sms = 0;                      // streaming multiprocessors: 132 on an H100 SXM or H200
  int l2_bytes = 0;                 // 50 MiB on an H100 SXM
  int shared_memory_per_block = 0;  // the most one block may opt in to: 227 KiB on sm_90, 163 KiB on sm_80
};

namespace gpu_facts_detail {

inline void throw_unless(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(error));
}

inline int current_device() {
  int device = 0;
  throw_unless(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

inline GpuFacts ask(int device) {
  GpuFacts facts;
  facts.device = device;
  int major = 0, minor = 0;
  for (auto [answer, attribute] : {std::pair{&major, cudaDevAttrComputeCapabilityMajor},
                                   {&minor, cudaDevAttrComputeCapabilityMinor},
                                   {&facts.sms, cudaDevAttrMultiProcessorCount},
                                   {&facts.l2_bytes, cudaDevAttrL2CacheSize},
                                   {&facts.shared_memory_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin}})
    throw_unless(cudaDeviceGetAttribute(answer, attribute, device), "cudaDeviceGetAttribute");
  facts.compute_capability = major * 10 + minor;
  return facts;
}

}  // namespace gpu_facts_detail

// The current device's facts. Throws std::runtime_error when the runtime cannot answer (no driver, no device).
inline GpuFacts current_gpu() {
  static std::mutex mutex;
  static std::map<int, GpuFacts> known;
  const int device = gpu_facts_detail::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = known.find(device); found != known.end()) return found->second;
  return known[device] = gpu_facts_detail::ask(device);
}

// The same, or std::nullopt (the runtime's error cleared) where a caller must not throw: a machine without a GPU.
inline std::optional<GpuFacts> current_gpu_if_any() {
  try {
    return current_gpu();
  } catch (const std::runtime_error&) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
}

namespace gpu_facts_detail {

// What is asked of one kernel on one device, with one argument, once.
enum class KernelQuestion { AllowDynamicSharedMemory, BlocksPerSm };

template <class Ask>
int kernel_fact(KernelQuestion question, const void* kernel, int argument, Ask ask) {
  static std::mutex mutex;
  static std::map<std::tuple<KernelQuestion, const void*, int, int>, int> known;
  const int device = current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(question, kernel, device, argument);
  if (const auto found = known.find(key); found != known.end()) return found->second;
  const int answer = ask();  // throws before anything is kept
  known.emplace(key, answer);
  return answer;
}

}  // namespace gpu_facts_detail

// Lets `kernel` take `bytes` of dynamic shared memory on the current device (cudaFuncSetAttribute), once per kernel,
// device and size: the attribute stays set for the rest of the process.
inline void allow_dynamic_shared_memory(const void* kernel, int bytes) {
  using namespace gpu_facts_detail;
  kernel_fact(KernelQuestion::AllowDynamicSharedMemory, kernel, bytes, [&] {
    throw_unless(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                 "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    return 1;
  });
}

// How many blocks of `threads` threads (and no dynamic shared memory) of `kernel` one SM of the current device
// holds.
inline int blocks_per_sm(const void* kernel, int threads) {
  using namespace gpu_facts_detail;
  return kernel_fact(KernelQuestion::BlocksPerSm, kernel, threads, [&] {
    int blocks = 0;
    throw_unless(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return blocks;
  });
}

}  // namespace flashlab::cuda
