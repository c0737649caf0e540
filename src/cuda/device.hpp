#pragma once
// Is there a CUDA device here, and which? A machine without a GPU or a driver answers "no" (never an
// exception), so CPU-only machines skip GPU work cleanly. The registry's availability column and the
// GPU test suites ask through registry/variants.hpp.
#include <string>

namespace flashlab::cuda {

bool device_present();
std::string device_name();  // e.g. "NVIDIA H100 80GB HBM3"; "" without a device

}  // namespace flashlab::cuda
