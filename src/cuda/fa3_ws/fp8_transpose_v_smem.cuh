#pragma once
// FP8 forward, V_j^T made in shared memory by the producer warpgroup: the other way (Schedule::kFp8TransposeInKernel)
// to give O += P V the K-major V^T it needs (fp8_transpose_v.cu is the pre-pass way, which costs a read and a write of
// all of V and a scratch buffer per call). Here TMA lands V_j (Bc, d) as it is stored, with the plain (B, S, H, d)
// tensor map, in a staging buffer; producer warps 1-3 (warp 0's elected thread issues the copies) rewrite it as the
// V_j^T panel the consumers read: d rows of 128 keys, 128-byte swizzle, keys in fp8_v_key's order. Keys past S_k
// arrive as zeros (TMA fills a box past the tensor's end with zeros), so V^T holds zeros there as the pre-pass's
// does: P is 0 at those keys, but 0 times a NaN byte pattern would not be.
//
// Why ldmatrix .trans, byte permutes and stmatrix. Hopper's ldmatrix and stmatrix move 8 x 8 matrices of 16-bit
// elements only; with .trans, thread (c = lane / 4, t = lane % 4) of an ldmatrix over 8 keys x 16 bytes of dims gets
// keys 2t and 2t + 1 of dims 2c and 2c + 1 in one word. fp8_v_key puts keys 2t, 2t + 1, 8 + 2t, 9 + 2t (of each 16)
// in one word of V^T, so the ldmatrix of keys 0-7 and that of keys 8-15 together hold, in each thread, two whole
// V^T words (dims 2c and 2c + 1), one byte permute each, and stmatrix writes them as V^T rows. Per 512 bytes a warp
// issues 2 shared-memory instructions (ldmatrix.x4, stmatrix.x4), 4 permutes and 4 selects; 32-bit loads and stores
// with permutes would take 8 shared-memory instructions and 8 permutes. Neither way has bank conflicts here:
// ldmatrix's eight 16-byte rows of one matrix are 8 consecutive keys, at 8 different chunks under either swizzle;
// stmatrix's eight V^T rows of one matrix are the dims 2c + s (s = 1 for c >= 4, else 0), which cover every
// row % 8 and so every chunk: a thread with c >= 4 swaps its even and odd words (selects on one predicate; a
// selector chosen per thread would hold two more registers than the producer's 24 leave, and spilled).
#include <cstdint>

#include "cuda/fa3_ws/fp8_layout.cuh"
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {

// One warp's share of V_j -> V_j^T for one K/V block: the tile is (Bc / 16) key groups x (D / 32) dim blocks of
// 16 keys x 32 dims, and warp `warp` of `warps` takes every warps-th of them.
//   staging  V_j (Bc, D) e4m3 as TMA lands it: panels kStagingRowBytes wide (128, or 64 at d = 64), each (Bc rows,
//            kStagingRowBytes), swizzled at that width
//   vt       V_j^T (D, Bc): Bc / 128 panels of D rows x 128 bytes, 128-byte swizzle; column k of row n holds key
//            fp8_v_key(k) of dim n (the permutation keeps each 16 keys in place, so each group is its own)
template <int D, int kBc, int kStagingRowBytes>
__device__ __forceinline__ void transpose_v_block_e4m3(std::uint32_t staging, std::uint32_t vt, unsigned warp,
                                                       unsigned warps, unsigned lane) {
  static_assert(kBc % kPanelCols<__nv_fp8_e4m3> == 0, "V_j^T is whole panels of 128 keys");
  static_assert(D % 32 == 0 && kStagingRowBytes % 32 == 0, "a dim block of 32 lies in one staging panel");
  constexpr unsigned kKeyGroups = kBc / 16, kBlocks = kKeyGroups * (D / 32);
  constexpr unsigned kBlocksPerPanel = kStagingRowBytes / 32;  // dim blocks of 32 in one staging panel row
  constexpr unsigned kGroupsPerVtPanel = kPanelCols<__nv_fp8_e4m3> / 16;  // key groups in one V_j^T panel: 8
  const unsigned matrix = lane / 8, row = lane % 8;  // the ldmatrix / stmatrix row this lane addresses
  // ldmatrix: matrix m is keys 8 (m % 2) + row of the group, bytes (dims) 16 (m / 2) .. + 15 of the block. Its address
  // is this lane's row of the staging tile, plus 16 keys a group, plus the block's 32 bytes, which the swizzle moves
  // only by an XOR of the same chunk bits (the groups and panels are whole swizzle atoms).
  const std::uint32_t load_lane =
      swizzled_offset<kStagingRowBytes>((8 * (matrix % 2) + row) * kStagingRowBytes + 16 * (matrix / 2));
  // stmatrix: matrix m row `row` is V^T row (dim) 16 (m / 2) + 2 row + ((m % 2) ^ (row / 4)) of the block; the group's
  // 16 keys are one chunk of it, XORed with that row's swizzle (blocks of 32 dims are whole atoms).
  const unsigned store_dim = 16 * (matrix / 2) + 2 * row + ((matrix % 2) ^ (row / 4));
  const std::uint32_t store_lane = swizzled_offset<kPanelRowBytes>(store_dim * kPanelRowBytes);
  // This thread's words (c = lane / 4) go out even dim first, swapped when c >= 4, as the stmatrix rows above expect.
  const bool swap = lane >= 16;
#pragma unroll 1
  for (unsigned blk = warp; blk < kBlocks; blk += warps) {
    const unsigned group = blk % kKeyGroups, dblk = blk / kKeyGroups;
    const std::uint32_t src = staging + (dblk / kBlocksPerPanel) * (kBc * kStagingRowBytes) +
                              16 * group * kStagingRowBytes + (load_lane ^ (32 * (dblk % kBlocksPerPanel)));
    std::uint32_t w[4];  // word m: keys 2t, 2t + 1 (+ 8 for odd m) of dims 2c, 2c + 1 (+ 16 for m >= 2)
    ldmatrix_x4_trans(src, w);
    // Logical keys 4t .. 4t + 3 of the group are keys 2t, 2t + 1, 8 + 2t, 9 + 2t (fp8_v_key): bytes 0 and 2 of
    // w[0] and w[1] for the even dim, bytes 1 and 3 for the odd one.
    const std::uint32_t even0 = __byte_perm(w[0], w[1], 0x6420), odd0 = __byte_perm(w[0], w[1], 0x7531);
    const std::uint32_t even1 = __byte_perm(w[2], w[3], 0x6420), odd1 = __byte_perm(w[2], w[3], 0x7531);
    const std::uint32_t vt_panel = vt + (group / kGroupsPerVtPanel) * (D * kPanelRowBytes);
    stmatrix_x4(vt_panel + 32 * dblk * kPanelRowBytes + (store_lane ^ (16 * (group % kGroupsPerVtPanel))), swap ? odd0 : even0,
                swap ? even0 : odd0, swap ? odd1 : even1, swap ? even1 : odd1);
  }
}

}  // namespace flashlab::cuda::fa3_ws
