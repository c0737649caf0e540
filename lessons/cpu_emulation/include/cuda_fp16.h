#pragma once
// CPU emulation (lessons/cpu_emulation): CUDA's __half as 16 bits the host converts (core/half.hpp), with
// the two conversions src/cuda/common.cuh makes: from and to __half_raw. No arithmetic.
#include <cstdint>

#include "flashlab_cpu/emulation.hpp"

struct __half_raw {
  std::uint16_t x = 0;
};
struct __half {
  __half() = default;
  __half(__half_raw raw) : bits(raw.x) {}
  operator __half_raw() const { return __half_raw{bits}; }
  std::uint16_t bits = 0;
};
