#pragma once
// Is there a CUDA device here, and which? A machine without a GPU or a driver answers "no" (never an
// exception), so CPU-only machines skip GPU work cleanly. The registry's availability column and the
// GPU test suites ask through registry/variants.hpp.
#include <string>

namespace flashlab::cuda {

bool device_present();
std::string device_name();  // e.g. "NVIDIA H100 80GB HBM3"; "" without a device
// The current device's compute capability as major * 10 + minor (90 on an H100, 80 on an A100); 0
// without a device.
int device_compute_capability();

}  // namespace flashlab::cuda
