#pragma once
// Shared-memory tiles of cuda-fa2 and the cp.async loader that fills them.
//
// Layout: a tile of `rows` x D elements is stored row-major with each row padded by 8 elements
// (16 bytes). ldmatrix reads 8 rows of one 16-byte column chunk at a time; with a row pitch of
// D + 8 elements, row r's chunk starts (D/8 + 1) * r chunks in, and since D/8 + 1 is odd for every
// supported D (5, 9, 13, 17, 33) the 8 rows land in 8 different 16-byte bank groups: no bank
// conflicts, for ldmatrix and for the 16-byte cp.async stores alike, without an XOR swizzle.
#include <cstdint>

#include "fa2_mma.cuh"

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
template <class T, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, std::int64_t stride, int rows_valid) {
  constexpr int kChunksPerRow = D / 8;  // 8 elements = 16 bytes
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int n = 0; n < (kChunks + kThreads - 1) / kThreads; ++n) {
    const int c = n * kThreads + static_cast<int>(threadIdx.x);
    if (kChunks % kThreads == 0 || c < kChunks) {
      const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
      const bool valid = r < rows_valid;
      cp_async_16(smem + r * kPitch<D> + col, valid ? gmem + r * stride + col : gmem, valid);
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

}  // namespace flashlab::cuda::fa2
