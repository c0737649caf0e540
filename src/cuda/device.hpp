#pragma once
// Is there a CUDA device here, and which? A machine without a GPU or a driver answers "no" (never an
// exception), so CPU-only machines skip GPU work cleanly. The registry's availability column and the
// GPU test suites ask through registry/variants.hpp.
#include <cstddef>
#include <memory>
#include <string>

namespace flashlab::cuda {

bool device_present();
std::string device_name();  // e.g. "NVIDIA H100 80GB HBM3"; "" without a device
// The current device's compute capability as major * 10 + minor (90 on an H100, 80 on an A100); 0
// without a device.
int device_compute_capability();
// The current device's streaming multiprocessors (132 on an H100 SXM or H200); 0 without a device.
int device_sm_count();
// How many CUDA devices this machine has; 0 without a device or a driver.
int device_count();

// Makes device `ordinal` current on this thread while it lives, then restores the one that was. Throws
// InputError when this machine has no such device.
class CurrentDevice {
 public:
  explicit CurrentDevice(int ordinal);
  ~CurrentDevice();
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int restore_ = -1;  // the device to make current again; -1: nothing changed
};

// `bytes` of memory on device `ordinal`, every byte 0xff (NaN in fp32, fp16 and bf16, so an element that
// no kernel writes fails a check), freed when the last owner lets go. Running out of memory is an
// InputError, as for DeviceBuffer.
std::shared_ptr<void> allocate_poisoned(std::size_t bytes, int ordinal);

}  // namespace flashlab::cuda
