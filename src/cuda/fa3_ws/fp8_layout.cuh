#pragma once
// FP8 forward, the layout of O += P V (tools/fa3_harness's probe (vi) checks it on the GPU). An 8-bit wgmma takes A and B K-major, k32 deep, so P is the A operand from registers
// and V must be stored transposed, V^T (d, keys). P comes from S's fp32 accumulator, which a thread holds at other
// columns than the A fragment wants:
//   S accumulator, n-tile i (columns 8i .. 8i + 7), per thread (g = lane / 4, t = lane % 4):
//     acc[4i + 0], acc[4i + 1]  row g,     columns 8i + 2t, 8i + 2t + 1
//     acc[4i + 2], acc[4i + 3]  row g + 8, the same columns
//   e4m3 A fragment of one k32 step (probe (v)): word 0 row g, k = 4t .. 4t + 3 (lowest byte first); word 1 the
//     same at row g + 8; words 2 and 3 the same at k = 16 + 4t .. 16 + 4t + 3.
// Moving values between the four threads of a quad would cost shuffles every K/V block. Instead each thread packs
// the values it holds, and V^T stores its keys in the order that packing implies: a sum over keys does not care
// about their order, as long as P and V agree on it. Within each 32 keys, logical k = 16 h + 4 t + j holds key
//   16 h + 8 (j / 2) + 2 t + j % 2,
// so word 0 of step ks packs acc[16 ks + 0, 1, 4, 5] (keys 2t, 2t + 1, 8 + 2t, 9 + 2t), word 1 acc[16 ks + 2, 3, 6, 7],
// word 2 acc[16 ks + 8, 9, 12, 13] and word 3 acc[16 ks + 10, 11, 14, 15].
#include <cstdint>

#include "cuda/fa3_ws/element.cuh"

namespace flashlab::cuda::fa3_ws {

// The key that V^T's logical column `k` holds, within the same 32 (and so for any column: blocks of 32 stay put).
__host__ __device__ constexpr int fp8_v_key(int k) {
  const int base = k & ~31, h = (k >> 4) & 1, t = (k >> 2) & 3, j = k & 3;
  return base + 16 * h + 8 * (j >> 1) + 2 * t + (j & 1);
}

// The A fragment of k-step ks from an S accumulator (acc: Bc / 2 floats per thread, P's values), each value times
// `scale` and rounded to e4m3 (saturating).
template <int kAcc>
__device__ __forceinline__ void pack_p_e4m3(const float (&acc)[kAcc], int ks, float scale, std::uint32_t (&a)[4]) {
  using E = ElementTraits<__nv_fp8_e4m3>;
  const float* x = acc + 16 * ks;
  a[0] = E::pack4(x[0] * scale, x[1] * scale, x[4] * scale, x[5] * scale);
  a[1] = E::pack4(x[2] * scale, x[3] * scale, x[6] * scale, x[7] * scale);
  a[2] = E::pack4(x[8] * scale, x[9] * scale, x[12] * scale, x[13] * scale);
  a[3] = E::pack4(x[10] * scale, x[11] * scale, x[14] * scale, x[15] * scale);
}

}  // namespace flashlab::cuda::fa3_ws
