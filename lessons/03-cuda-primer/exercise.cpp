// Lesson 03, exercise: the rules a GPU runs a kernel by, as plain C++ on the CPU.
//
// Fill in the ten TODOs below (README.md explains each rule), then build and test YOUR file:
//   cmake -S . -B build -DFLASHLAB_LESSON_SOLUTIONS=OFF
//   cmake --build build --target lesson03_cuda_primer
//   ctest --test-dir build -L lesson -R 03 --output-on-failure
// Every matrix is row-major: element (r, c) of an (R, C) matrix is at [r * C + c].
// Delete each `(void)x;` line once your code uses x (it only silences "unused" warnings).
#include <algorithm>
#include <array>
#include <cstddef>
#include <set>

#include "lesson.hpp"

namespace flashlab::lesson03 {

// ---------------------------------------------------------------------------------------------
// Part 1: threads, blocks and grids.

int blocks_for(int n, int threads_per_block) {
  // TODO 1 (1 line): enough blocks to give every one of the n items a thread: n / threads_per_block,
  // rounded UP (1000 items in blocks of 256 need 4 blocks; the last one has 24 threads with nothing
  // to do). In integers: (n + threads_per_block - 1) / threads_per_block.
  (void)n;
  (void)threads_per_block;
  return 0;
}

Idx3 global_index(Idx3 blockIdx, Dim3 blockDim, Idx3 threadIdx) {
  // TODO 2 (3 lines): in each dimension, the blocks before this one hold blockIdx * blockDim threads,
  // and this thread is threadIdx further on. Return {.x = ..., .y = ..., .z = ...}.
  (void)blockIdx;
  (void)blockDim;
  (void)threadIdx;
  return {};
}

WarpLane warp_and_lane(Idx3 threadIdx, Dim3 blockDim) {
  // TODO 3 (3 lines): number the thread within its block, x fastest, then y, then z:
  //   t = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y
  // then warp = t / kWarpSize and lane = t % kWarpSize.
  (void)threadIdx;
  (void)blockDim;
  return {};
}

void launch(Dim3 grid, Dim3 block, int shared_floats, std::span<const Phase> phases) {
  // TODO 4 (about 10 lines): run the kernel, as kernel<<<grid, block>>> would.
  //   For every block (bx, by, bz) of the grid (three nested loops):
  //     its own shared memory:  std::vector<float> shared(shared_floats, kUndefinedShared);
  //     and for every thread (tx, ty, tz) of the block and every phase, one call
  //       phase(ThreadCtx{.blockIdx = {bx, by, bz}, .blockDim = block, .threadIdx = {tx, ty, tz},
  //                       .gridDim = grid, .shared = shared});
  //   Which loop goes outside, the phases or the threads? Between two phases is a __syncthreads():
  //   no thread of the block may start phase p + 1 before EVERY thread of the block has finished
  //   phase p (phase p + 1 may read what other threads wrote to `shared` in phase p).
  (void)grid;
  (void)block;
  (void)shared_floats;
  (void)phases;
}

void vector_add_kernel(const ThreadCtx& t, const float* a, const float* b, float* c, int n) {
  // TODO 5a (2 lines): i = this thread's global x index (your global_index); if i < n, c[i] = a[i] + b[i].
  // Without the `if`, the last block's spare threads would write past the end of c.
  (void)t;
  (void)a;
  (void)b;
  (void)c;
  (void)n;
}

std::vector<float> vector_add(std::span<const float> a, std::span<const float> b, int threads_per_block) {
  const int n = static_cast<int>(a.size());
  std::vector<float> c(a.size());
  // The kernel has one phase (no __syncthreads()): every thread runs vector_add_kernel.
  const Phase phases[] = {[&](const ThreadCtx& t) { vector_add_kernel(t, a.data(), b.data(), c.data(), n); }};
  // TODO 5b (1 line): launch it with your launch() as CUDA's
  //   vector_add_kernel<<<blocks_for(n, threads_per_block), threads_per_block>>>(a, b, c, n);
  // would: a 1D grid, a 1D block, no shared memory (0 floats).
  (void)phases;
  (void)threads_per_block;
  return c;
}

void row_sum_partial(const ThreadCtx& t, const float* M, int cols) {
  // TODO 6a (about 5 lines): phase 0 of the row sum. row = t.blockIdx.x, and this thread adds the
  // row's elements t.threadIdx.x, t.threadIdx.x + t.blockDim.x, t.threadIdx.x + 2 * t.blockDim.x, ...
  // (below cols) of M[row * cols + c], then stores the partial sum in t.shared[t.threadIdx.x].
  // A thread that gets no element (blockDim.x > cols) still stores its 0: shared memory starts undefined.
  (void)t;
  (void)M;
  (void)cols;
}

void row_sum_finish(const ThreadCtx& t, float* out) {
  // TODO 6b (about 4 lines): phase 1, after the __syncthreads(). Thread 0 alone adds the blockDim.x
  // partial sums in t.shared and writes the total to out[t.blockIdx.x]; the other threads do nothing.
  (void)t;
  (void)out;
}

std::vector<float> row_sums(std::span<const float> M, int rows, int cols, int threads_per_block) {
  std::vector<float> out(static_cast<std::size_t>(rows));
  // The kernel's two phases, with a __syncthreads() between them.
  const Phase phases[] = {[&](const ThreadCtx& t) { row_sum_partial(t, M.data(), cols); },
                          [&](const ThreadCtx& t) { row_sum_finish(t, out.data()); }};
  // TODO 6c (1 line): launch them: one block per row, threads_per_block threads per block, and a shared
  // array of one float per thread.
  (void)phases;
  (void)threads_per_block;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Part 2: coalescing.

std::vector<std::int64_t> warp_addresses(std::int64_t base, int cols, int elem_bytes, int row, int col, Walk walk) {
  // TODO 7 (about 4 lines): the 32 lanes' byte addresses. Lane i reads element (row, col + i) when
  // walk == Walk::AlongRow, and (row + i, col) when walk == Walk::DownColumn; element (r, c) is at
  // byte base + (r * cols + c) * elem_bytes. Compute in std::int64_t: large matrices overflow an int.
  std::vector<std::int64_t> addresses;
  (void)base;
  (void)cols;
  (void)elem_bytes;
  (void)row;
  (void)col;
  (void)walk;
  return addresses;
}

WarpLoad warp_load(std::span<const std::int64_t> addresses, int bytes_per_access) {
  // TODO 8 (about 8 lines): what one warp-wide load moves.
  //   The distinct addresses (a std::set): lanes that read the same address are served once.
  //   sectors: the distinct sector numbers byte / kSectorBytes of the bytes read, from the first byte
  //     a / 32 to the last (a + bytes_per_access - 1) / 32 of each access (an aligned access of at most
  //     16 bytes lies in one sector, so these two are the same; the loop costs nothing).
  //   efficiency: (distinct addresses * bytes_per_access) / (kSectorBytes * sectors), 0 if no sector.
  WarpLoad load;
  (void)addresses;
  (void)bytes_per_access;
  return load;
}

// ---------------------------------------------------------------------------------------------
// Part 3: shared-memory banks.

int bank_conflict_degree(std::span<const std::int64_t> words) {
  // TODO 9 (about 6 lines): for each of the kBanks banks, the set of DISTINCT words the warp reads in it
  // (bank = word % kBanks; std::array<std::set<std::int64_t>, kBanks>). The answer is the size of the
  // largest set: each bank delivers one word per pass, and a word read by several lanes is delivered
  // once (a broadcast).
  (void)words;
  return 0;
}

int conflict_free_stride(int cols) {
  // TODO 10 (1 line): lane i reads word i * stride + c, in bank (i * stride + c) % 32. Work out for
  // which strides the 32 lanes land in 32 different banks (try stride 32, 33, 2 and 3 on paper), then
  // return the smallest such stride that is >= cols. README.md, "Padding", shows why.
  (void)cols;
  return 0;
}

}  // namespace flashlab::lesson03
