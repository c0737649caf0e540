// cuda/device.hpp: is there a CUDA device here, and which.
#include <cuda_runtime.h>

#include <string>

#include "cuda/device.hpp"

namespace flashlab::cuda {

bool device_present() {
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

}  // namespace flashlab::cuda
