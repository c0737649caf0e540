// cuda/device.hpp: is there a CUDA device here, and which.
#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/device.hpp"
#include "cuda/gpu_facts.hpp"

namespace flashlab::cuda {

int device_count() {
  // Asked once: the answer cannot change while the process runs.
  static const int count = [] {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // no driver / no device: clear the error and say "none"
      return 0;
    }
    return n;
  }();
  return count;
}

bool device_present() { return device_count() > 0; }

std::string device_name() {
  if (!device_present()) return "";
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

// Asked once per device (cuda/gpu_facts.hpp): the registry's checks ask on every call. 0 without a device.
int device_compute_capability() {
  if (!device_present()) return 0;
  const std::optional<GpuFacts> gpu = current_gpu_if_any();
  return gpu ? gpu->compute_capability : 0;
}

int device_sm_count() {
  if (!device_present()) return 0;
  const std::optional<GpuFacts> gpu = current_gpu_if_any();
  return gpu ? gpu->sms : 0;
}

CurrentDevice::CurrentDevice(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count)
    throw InputError("the tensors are on CUDA device " + std::to_string(ordinal) + " but this machine has " +
                     (count == 0 ? std::string("no CUDA device") : std::to_string(count) + " (0 to " +
                                                                     std::to_string(count - 1) + ")"));
  int current = 0;
  CUDA_CHECK(cudaGetDevice(&current));
  if (current == ordinal) return;
  CUDA_CHECK(cudaSetDevice(ordinal));
  restore_ = current;
}

CurrentDevice::~CurrentDevice() {
  if (restore_ >= 0 && cudaSetDevice(restore_) != cudaSuccess) (void)cudaGetLastError();  // never throws
}

std::shared_ptr<void> allocate_poisoned(std::size_t bytes, int ordinal) {
  const CurrentDevice on(ordinal);
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // an allocation failure is not sticky
    throw InputError("the GPU is out of memory: allocating " + mebibytes(bytes) + " failed with " +
                     mebibytes(device_memory_info().first) + " free; use a smaller problem");
  }
  CUDA_CHECK(err);
  std::shared_ptr<void> owned(ptr, [ordinal](void* p) {
    // A deleter never throws: a failed free (the runtime already torn down at exit) is left alone.
    int current = -1;
    const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != ordinal;
    if (switch_device) (void)cudaSetDevice(ordinal);
    if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    if (switch_device) (void)cudaSetDevice(current);
  });
  CUDA_CHECK(cudaMemset(ptr, 0xff, bytes));
  return owned;
}

}  // namespace flashlab::cuda
