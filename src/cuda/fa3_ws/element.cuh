#pragma once
// The element types of cuda-fa3-ws, both passes: fp16 (__half) and bf16 (__nv_bfloat16). What differs between
// the two (the tensor-map data type, the rounding pack, wgmma's type suffix) is read from ElementTraits<T>; what
// does not (16 bits wide, so one tile layout for both) is kElemBytes. with_element turns a runtime DType into T.
#include <cuda.h>  // CUtensorMapDataType
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>

#include "core/problem.hpp"

namespace flashlab::cuda::fa3_ws {

template <class T>
struct ElementTraits;

template <>
struct ElementTraits<__half> {
  static constexpr DType kDType = DType::F16;
  static constexpr bool kIsBf16 = false;
  static constexpr int kBytes = sizeof(__half);
  static constexpr CUtensorMapDataType kTensorMapType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // Two fp32 values rounded to one packed pair (the low half is `lo`).
  __device__ static __forceinline__ std::uint32_t pack2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

template <>
struct ElementTraits<__nv_bfloat16> {
  static constexpr DType kDType = DType::BF16;
  static constexpr bool kIsBf16 = true;
  static constexpr int kBytes = sizeof(__nv_bfloat16);
  static constexpr CUtensorMapDataType kTensorMapType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  __device__ static __forceinline__ std::uint32_t pack2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
};

// Bytes per element of every tile, either type: the 128-byte swizzle rows of hopper.cuh hold 64 of them.
inline constexpr int kElemBytes = ElementTraits<__half>::kBytes;
static_assert(ElementTraits<__nv_bfloat16>::kBytes == kElemBytes, "fp16 and bf16 tiles share one layout");

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
