#pragma once
// Shared-memory tiles of cuda-fa2 and the cp.async loader that fills them.
//
// Layout: a tile of `rows` x D elements is stored row-major with each row padded by 8 elements
// (16 bytes). ldmatrix reads 8 rows of one 16-byte column chunk at a time; with a row pitch of
// D + 8 elements, row r's chunk starts (D/8 + 1) * r chunks in, and since D/8 + 1 is odd for every
// supported D (5, 9, 13, 17, 33) the 8 rows land in 8 different 16-byte bank groups: no bank
// conflicts, for ldmatrix and for the 16-byte cp.async stores alike, without an XOR swizzle.
#include <cstdint>

#include "core/philox.hpp"
#include "cuda/fa2_launch.cuh"
#include "cuda/fa2_mma.cuh"

namespace flashlab::cuda::fa2 {

inline constexpr int kPad = 8;  // elements of padding per shared row (16 bytes)

template <int D>
inline constexpr int kPitch = D + kPad;  // shared row pitch in elements

static_assert(((32 / 8 + 1) & 1) && ((64 / 8 + 1) & 1) && ((96 / 8 + 1) & 1) && ((128 / 8 + 1) & 1) &&
                  ((256 / 8 + 1) & 1),
              "padding must leave an odd number of 16-byte chunks per row");

// Copy rows [0, kRows) of a (rows, D) global tile (row stride `stride` elements) into shared memory;
// rows >= rows_valid are zero-filled (a sequence that is no multiple of the block). All kThreads
// threads of the block take part; the copies are asynchronous (commit and wait by the caller).
//
// kUnroll says how the copies are issued, because it decides registers and speed (ptxas -v; measured:
// bench/results/h100-fa2-notes.md):
//  * >= 1: thread x copies the 16-byte chunk x % (D/8) of rows x / (D/8) + n kRowStep, walking one
//    pointer that is hidden from the optimizer, kUnroll copies back to back. Fully unrolled with plain
//    indexing, the compiler precomputed every chunk's 64-bit address once and kept them live across
//    the K/V loop (~30 registers: the forward's Bc = 64 spilled at d = 128).
//  * 0: a rolled loop over chunk indices c = n kThreads + x, which keeps the fewest registers live
//    but recomputes a 64-bit address per copy (~24 instructions instead of ~5). Only the backward's
//    dropout kernels need it: with the Philox state they have no register to spare.
template <class T, int D, int kRows, int kThreads, int kUnroll>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, std::int64_t stride, int rows_valid) {
  constexpr int kChunksPerRow = D / 8;  // 8 elements = 16 bytes
  const int x = static_cast<int>(threadIdx.x);
  if constexpr (kUnroll == 0) {
    constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll 1
    for (int n = 0; n < (kChunks + kThreads - 1) / kThreads; ++n) {
      const int c = n * kThreads + x;
      if (kChunks % kThreads == 0 || c < kChunks) {
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        const bool valid = r < rows_valid;
        cp_async_16(smem_addr(smem + r * kPitch<D> + col), valid ? gmem + r * stride + col : gmem, valid);
      }
    }
  } else {
    constexpr int kRowStep = kThreads / kChunksPerRow;  // rows per pass of the block (d = 96: a few threads idle)
    constexpr int kSteps = (kRows + kRowStep - 1) / kRowStep;
    const int r0 = x / kChunksPerRow, col = x % kChunksPerRow * 8;
    if (r0 >= kRowStep) return;
    const std::uint32_t dst = smem_addr(smem + r0 * kPitch<D> + col);
    const T* src = gmem + r0 * stride + col;
#pragma unroll kUnroll
    for (int n = 0; n < kSteps; ++n) {
      if (kRows % kRowStep != 0 && r0 + n * kRowStep >= kRows) break;
      const bool valid = n * kRowStep < rows_valid - r0;
      cp_async_16(dst + static_cast<std::uint32_t>(n * kRowStep * kPitch<D> * sizeof(T)), valid ? src : gmem, valid);
      src += kRowStep * stride;
      asm volatile("" : "+l"(src));  // opaque: one add per copy instead of one live address per copy
    }
  }
}

// Shared address of element (row, col) of a padded tile.
template <int D, class T>
__device__ __forceinline__ std::uint32_t tile_addr(const T* tile, int row, int col) {
  return smem_addr(tile + row * kPitch<D> + col);
}

// ex2.approx: one MUFU instruction; exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Dropout keep bits of one row for the columns a thread holds in a C fragment: col_base + 8 nt + e
// (col_base = first column of the tile + 2t, e = 0, 1) for nt < kNT, as bit 2 nt + e. One Philox
// call covers 4 neighbouring columns (core/philox.hpp); this thread's pair is x[2 (t % 2)], x[.. + 1].
// The loop stays rolled: ten Philox rounds per n-tile, unrolled, would crowd out the accumulators.
template <int kNT>
__device__ __forceinline__ std::uint32_t dropout_keep_bits(const Params& p, int b, int h, int row, int col_base,
                                                           int t) {
  static_assert(2 * kNT <= 32, "one bit per column must fit in 32 bits");
  std::uint32_t bits = 0;
#pragma unroll 1
  for (int nt = 0; nt < kNT; ++nt) {
    const Philox4 r = dropout_draws4(p.seed, b, h, row, (col_base + nt * 8) >> 2);
    const std::uint32_t draw0 = (t & 1) ? r.x[2] : r.x[0], draw1 = (t & 1) ? r.x[3] : r.x[1];
    bits |= (std::uint32_t(draw0 >= p.drop_threshold) | (std::uint32_t(draw1 >= p.drop_threshold) << 1)) << (2 * nt);
  }
  return bits;
}

}  // namespace flashlab::cuda::fa2
