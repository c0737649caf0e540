#pragma once
// CPU emulation (lessons/cpu_emulation): CUDA's __nv_bfloat16 as 16 bits the host converts (core/half.hpp),
// with the two conversions src/cuda/common.cuh makes: from and to __nv_bfloat16_raw. No arithmetic.
#include <cstdint>

#include "flashlab_cpu/emulation.hpp"

struct __nv_bfloat16_raw {
  std::uint16_t x = 0;
};
struct __nv_bfloat16 {
  __nv_bfloat16() = default;
  __nv_bfloat16(__nv_bfloat16_raw raw) : bits(raw.x) {}
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{bits}; }
  std::uint16_t bits = 0;
};
