#pragma once
// The element types of cuda-fa3-ws: fp16 (__half) and bf16 (__nv_bfloat16), both passes, and float8 e4m3 for the
// FP8 forward's parts (below). Everything that depends on the type is read from ElementTraits<T>: its width (and so
// the tiles' bytes and the columns of a 128-byte panel), the depth of one wgmma (32 bytes of a row: wgmma_ops.cuh
// has each type's forms), the tensor-map data type and the rounding pack. with_element turns a runtime DType into
// T. A new type is one more specialization here, its forms in tools/fa3_harness/gen_wgmma.py, and the layouts its
// wgmma demands.
#include <cuda.h>  // CUtensorMapDataType
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>

#include "core/problem.hpp"

namespace flashlab::cuda::fa3_ws {

// One wgmma instruction reads 32 bytes of each row of A and of B: its K is 32 / (bytes per element).
inline constexpr int kWgmmaRowBytes = 32;

template <class T>
struct ElementTraits;

template <>
struct ElementTraits<__half> {
  static constexpr DType kDType = DType::F16;
  static constexpr int kBytes = sizeof(__half);
  static constexpr int kWgmmaK = kWgmmaRowBytes / kBytes;  // 16
  static constexpr CUtensorMapDataType kTensorMapType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  using Output = __half;  // the type O is written in
  // Two fp32 values rounded to one packed pair (the low half is `lo`).
  __device__ static __forceinline__ std::uint32_t pack2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

template <>
struct ElementTraits<__nv_bfloat16> {
  static constexpr DType kDType = DType::BF16;
  static constexpr int kBytes = sizeof(__nv_bfloat16);
  static constexpr int kWgmmaK = kWgmmaRowBytes / kBytes;  // 16
  static constexpr CUtensorMapDataType kTensorMapType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  using Output = __nv_bfloat16;
  __device__ static __forceinline__ std::uint32_t pack2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

// float8 e4m3: half the bytes, so twice the elements per panel row and a wgmma twice as deep (k32), with both
// operands K-major. Its forms are in wgmma_ops.cuh, and tools/fa3_harness's probes check them and this layout on
// the GPU. O is written in bf16. Only the FP8 forward (forward_e4m3.cu) takes it; with_element, which the 16-bit
// launchers dispatch through, does not reach it.
template <>
struct ElementTraits<__nv_fp8_e4m3> {
  static constexpr int kBytes = sizeof(__nv_fp8_e4m3);
  static constexpr int kWgmmaK = kWgmmaRowBytes / kBytes;  // 32
  static constexpr CUtensorMapDataType kTensorMapType = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  using Output = __nv_bfloat16;
  // Four fp32 values rounded (to nearest even, saturating at +-448) into one word, the first in the low byte: two
  // cvt.e4m3x2 (each puts its second source in the low byte) and one move of the two halves into the word. (The
  // toolkit's __nv_cvt_float2_to_fp8x2 with a shift and an OR cost the FP8 forward 8 bytes of spills at d = 256.)
  __device__ static __forceinline__ std::uint32_t pack4(float x0, float x1, float x2, float x3) {
    std::uint32_t word;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(word)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return word;
  }
};

// Two fp32 values rounded to one packed pair of T (the low half is `lo`).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  return ElementTraits<T>::pack2(lo, hi);
}

// Calls f.template operator()<T>() with T the element type of `dtype`. The entry points refuse any other dtype
// before they get here (with a message for the user), so one reaching this point is a bug.
template <class F>
void with_element(DType dtype, F&& f) {
  if (dtype == ElementTraits<__nv_bfloat16>::kDType) f.template operator()<__nv_bfloat16>();
  else if (dtype == ElementTraits<__half>::kDType) f.template operator()<__half>();
  else throw std::logic_error("cuda-fa3-ws: no kernel for this dtype (the entry points take f16 or bf16 only)");
}

// The TMA data type of `dtype` (f16 or bf16).
inline CUtensorMapDataType tensor_map_type(DType dtype) {
  CUtensorMapDataType type{};
  with_element(dtype, [&]<class T>() { type = ElementTraits<T>::kTensorMapType; });
  return type;
}

}  // namespace flashlab::cuda::fa3_ws
