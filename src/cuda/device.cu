// cuda/device.hpp: is there a CUDA device here, and which.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/device.hpp"

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

namespace {
// The current device's compute capability and SM count, asked of the runtime once per device (they cannot change
// while the process runs; the registry's checks ask for them on every call). {0, 0} without a device.
struct Attributes {
  int compute_capability = 0;
  int sms = 0;
};
Attributes current_attributes() {
  if (!device_present()) return {};
  static std::mutex mutex;
  static std::map<int, Attributes> asked;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto known = asked.find(device); known != asked.end()) return known->second;
  int major = 0, minor = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return asked[device] = Attributes{major * 10 + minor, sms};
}
}  // namespace

int device_compute_capability() { return current_attributes().compute_capability; }

int device_sm_count() { return current_attributes().sms; }

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
