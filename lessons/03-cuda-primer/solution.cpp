// Lesson 03, reference solution: the GPU's rules for launches, warps, sectors and banks, on the CPU.
// Read exercise.cpp first; this file is what the build links while FLASHLAB_LESSON_SOLUTIONS is ON.
#include <algorithm>
#include <array>
#include <cstddef>
#include <set>

#include "lesson.hpp"

namespace flashlab::lesson03 {

// ---------------------------------------------------------------------------------------------
// Part 1: threads, blocks and grids.

int blocks_for(int n, int threads_per_block) {
  return (n + threads_per_block - 1) / threads_per_block;  // rounded up: the last block may be partly idle
}

Idx3 global_index(Idx3 blockIdx, Dim3 blockDim, Idx3 threadIdx) {
  return {.x = blockIdx.x * blockDim.x + threadIdx.x,
          .y = blockIdx.y * blockDim.y + threadIdx.y,
          .z = blockIdx.z * blockDim.z + threadIdx.z};
}

WarpLane warp_and_lane(Idx3 threadIdx, Dim3 blockDim) {
  const int t = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  return {.warp = t / kWarpSize, .lane = t % kWarpSize};
}

void launch(Dim3 grid, Dim3 block, int shared_floats, std::span<const Phase> phases) {
  for (int bz = 0; bz < grid.z; ++bz)
    for (int by = 0; by < grid.y; ++by)
      for (int bx = 0; bx < grid.x; ++bx) {
        std::vector<float> shared(static_cast<std::size_t>(shared_floats), kUndefinedShared);  // per block
        for (const Phase& phase : phases)  // a __syncthreads() between two phases: all threads finish one
          for (int tz = 0; tz < block.z; ++tz)
            for (int ty = 0; ty < block.y; ++ty)
              for (int tx = 0; tx < block.x; ++tx)
                phase(ThreadCtx{.blockIdx = {bx, by, bz},
                                .blockDim = block,
                                .threadIdx = {tx, ty, tz},
                                .gridDim = grid,
                                .shared = shared});
      }
}

void vector_add_kernel(const ThreadCtx& t, const float* a, const float* b, float* c, int n) {
  const int i = global_index(t.blockIdx, t.blockDim, t.threadIdx).x;
  if (i < n) c[i] = a[i] + b[i];  // the last block's threads past n do nothing
}

std::vector<float> vector_add(std::span<const float> a, std::span<const float> b, int threads_per_block) {
  const int n = static_cast<int>(a.size());
  std::vector<float> c(a.size());
  const Phase phases[] = {[&](const ThreadCtx& t) { vector_add_kernel(t, a.data(), b.data(), c.data(), n); }};
  launch(Dim3{blocks_for(n, threads_per_block)}, Dim3{threads_per_block}, 0, phases);
  return c;
}

void row_sum_partial(const ThreadCtx& t, const float* M, int cols) {
  const int row = t.blockIdx.x, tid = t.threadIdx.x;
  float partial = 0.0f;
  for (int c = tid; c < cols; c += t.blockDim.x)  // neighbouring threads read neighbouring addresses
    partial += M[static_cast<std::size_t>(row) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
  t.shared[static_cast<std::size_t>(tid)] = partial;  // even a thread with no element stores its 0
}

void row_sum_finish(const ThreadCtx& t, float* out) {
  if (t.threadIdx.x != 0) return;
  float sum = 0.0f;
  for (int k = 0; k < t.blockDim.x; ++k) sum += t.shared[static_cast<std::size_t>(k)];
  out[t.blockIdx.x] = sum;
}

std::vector<float> row_sums(std::span<const float> M, int rows, int cols, int threads_per_block) {
  std::vector<float> out(static_cast<std::size_t>(rows));
  const Phase phases[] = {[&](const ThreadCtx& t) { row_sum_partial(t, M.data(), cols); },
                          [&](const ThreadCtx& t) { row_sum_finish(t, out.data()); }};
  launch(Dim3{rows}, Dim3{threads_per_block}, threads_per_block, phases);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Part 2: coalescing.

std::vector<std::int64_t> warp_addresses(std::int64_t base, int cols, int elem_bytes, int row, int col, Walk walk) {
  std::vector<std::int64_t> addresses(kWarpSize);
  for (int i = 0; i < kWarpSize; ++i) {
    const std::int64_t r = row + (walk == Walk::DownColumn ? i : 0);
    const std::int64_t c = col + (walk == Walk::AlongRow ? i : 0);
    addresses[static_cast<std::size_t>(i)] = base + (r * cols + c) * elem_bytes;
  }
  return addresses;
}

WarpLoad warp_load(std::span<const std::int64_t> addresses, int bytes_per_access) {
  const std::set<std::int64_t> distinct(addresses.begin(), addresses.end());  // same address: read once
  std::set<std::int64_t> sectors;
  for (std::int64_t a : distinct)
    for (std::int64_t s = a / kSectorBytes; s <= (a + bytes_per_access - 1) / kSectorBytes; ++s) sectors.insert(s);
  WarpLoad load;
  load.sectors = static_cast<int>(sectors.size());
  if (load.sectors > 0)
    load.efficiency = static_cast<double>(distinct.size()) * bytes_per_access / (kSectorBytes * load.sectors);
  return load;
}

// ---------------------------------------------------------------------------------------------
// Part 3: shared-memory banks.

int bank_conflict_degree(std::span<const std::int64_t> words) {
  std::array<std::set<std::int64_t>, kBanks> in_bank;  // the distinct words each bank must deliver
  for (std::int64_t w : words) in_bank[static_cast<std::size_t>(w % kBanks)].insert(w);
  std::size_t degree = 0;
  for (const auto& bank : in_bank) degree = std::max(degree, bank.size());
  return static_cast<int>(degree);
}

int conflict_free_stride(int cols) {
  // Lane i reads word i * stride + c, in bank (i * stride + c) % 32: 32 different banks exactly when
  // stride shares no factor with 32, that is when it is odd. So pad an even width by one word.
  return cols % 2 == 1 ? cols : cols + 1;
}

}  // namespace flashlab::lesson03
