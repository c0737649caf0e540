#pragma once
// The tensor-core vocabulary of cuda-fa2, as small device helpers over inline PTX (sm_80+):
//  * cp_async_16: a 16-byte global -> shared copy that skips the registers (cp.async.cg), with
//    zero-fill for rows past the end of a sequence, grouped by commit / wait.
//  * ldmatrix_x4 (and .trans): four 8x8 tiles of 16-bit elements from shared memory straight into
//    the register fragments mma.sync wants.
//  * mma_16x8x16: D (16x8, fp32) += A (16x16, row) * B (16x8, col) in fp16 or bf16.
// Fragment layout of m16n8k16 (lane = 4 * g + t, g = lane / 4, t = lane % 4):
//   A regs a0..a3 hold (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B regs b0, b1 hold (k 2t..2t+1, col g), (k 2t+8.., col g)
//   C c0..c3      hold (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1)
// so the C fragments of two neighbouring n-tiles of S are exactly the A fragment of P for the next
// product (pack_a_from_c): P never leaves the registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace flashlab::cuda::fa2 {

// ---- element types ---------------------------------------------------------------------------

template <class T>
struct MmaType;
template <>
struct MmaType<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(std::uint32_t u) {
    return __half22float2(*reinterpret_cast<const __half2*>(&u));
  }
};
template <>
struct MmaType<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static __device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(std::uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
  }
};

// ---- mma.sync ----------------------------------------------------------------------------------

// c (16x8 fp32) += a (16x16) * b (16x8).
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- ldmatrix ------------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 tiles; lane L supplies the row address of tile L / 8, row L % 8.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, each tile transposed on the way (B operands stored k-major, such as V in O = P V).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// ---- cp.async ------------------------------------------------------------------------------------

// 16 bytes global -> shared (`smem` is a shared-window address, smem_addr); when !valid the 16 shared
// bytes are zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(std::uint32_t smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Wait until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// ---- fragments -------------------------------------------------------------------------------

// The A fragment (16x16, k = columns 16kk..16kk+15) of P, packed from the fp32 C fragments of the
// two n-tiles 2kk and 2kk+1 of S (same rows, same lanes).
template <class T>
__device__ __forceinline__ void pack_a_from_c(std::uint32_t (&a)[4], const float (&c_lo)[4], const float (&c_hi)[4]) {
  a[0] = MmaType<T>::pack(c_lo[0], c_lo[1]);
  a[1] = MmaType<T>::pack(c_lo[2], c_lo[3]);
  a[2] = MmaType<T>::pack(c_hi[0], c_hi[1]);
  a[3] = MmaType<T>::pack(c_hi[2], c_hi[3]);
}

// Reductions over the 4 lanes (a quad) that share a row of a C fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashlab::cuda::fa2
