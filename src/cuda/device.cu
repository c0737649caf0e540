// Is there a CUDA device here? The GPU test suites and Variant::available() ask; a machine without a
// GPU or a driver answers false (never an exception), so CPU-only machines skip GPU work cleanly.
#include <cuda_runtime.h>

#include <string>

#include "../core/variants.hpp"

namespace flashlab {

bool cuda_device_present() {
  // Asked once: the answer cannot change while the process runs.
  static const bool present = [] {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // no driver / no device: clear the error and say "no"
      return false;
    }
    return count > 0;
  }();
  return present;
}

std::string cuda_device_name() {
  if (!cuda_device_present()) return "";
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return prop.name;
}

}  // namespace flashlab
