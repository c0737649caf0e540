#pragma once
// Lesson 03: a CUDA primer on the CPU. The rules a GPU runs a kernel by, as plain C++: how a launch
// numbers its threads, how a block's threads take turns around __syncthreads(), how many 32-byte
// sectors a warp's load moves, and when a warp's shared-memory access is split by bank conflicts.
// You write these functions in exercise.cpp; solution.cpp is ours; test.cpp checks yours on cases
// whose answers it works out on its own.
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

namespace flashlab::lesson03 {

constexpr int kWarpSize = 32;      // threads in a warp, on every NVIDIA GPU so far
constexpr int kSectorBytes = 32;   // global memory (HBM) is moved in aligned 32-byte sectors
constexpr int kBanks = 32;         // shared memory is 32 banks ...
constexpr int kBankWordBytes = 4;  // ... of 4-byte words: word w (byte address / 4) is in bank w % 32

// ---------------------------------------------------------------------------------------------
// Part 1: threads, blocks and grids.

// A size, as CUDA's dim3: blockDim and gridDim. Unused dimensions are 1, so Dim3{256} is (256, 1, 1).
struct Dim3 {
  int x = 1, y = 1, z = 1;
};
// An index, as CUDA's blockIdx and threadIdx: (0, 0, 0) is the first.
struct Idx3 {
  int x = 0, y = 0, z = 0;
};

// The blocks of threads_per_block threads needed to cover n items: ceil(n / threads_per_block).
// n >= 0, threads_per_block >= 1.
int blocks_for(int n, int threads_per_block);

// A thread's position in the whole grid, dimension by dimension: blockIdx * blockDim + threadIdx.
Idx3 global_index(Idx3 blockIdx, Dim3 blockDim, Idx3 threadIdx);

// Which warp of its block a thread is in, and its lane (0..31) in that warp. A block's threads are
// numbered x fastest, then y, then z:  t = x + y * blockDim.x + z * blockDim.x * blockDim.y,
// and warp w is the threads t = 32 w ... 32 w + 31.
struct WarpLane {
  int warp = 0, lane = 0;
};
WarpLane warp_and_lane(Idx3 threadIdx, Dim3 blockDim);

// What one running thread sees: CUDA's built-in variables, and its block's shared memory.
struct ThreadCtx {
  Idx3 blockIdx;
  Dim3 blockDim;
  Idx3 threadIdx;
  Dim3 gridDim;
  std::span<float> shared;  // the block's __shared__ array: one per block, seen by all its threads
};

// One stretch of a kernel's body, from its start or a __syncthreads() to the next one (or the end).
using Phase = std::function<void(const ThreadCtx&)>;

// Runs a kernel on the CPU as kernel<<<grid, block>>> would run it on a GPU. For every block of the
// grid: a fresh shared array of shared_floats floats, filled with kUndefinedShared (on a GPU its
// contents are undefined until written); then phase 0 for every thread of the block, then phase 1 for
// every thread, and so on: between two phases is a __syncthreads(). Blocks run one after another here;
// on a GPU they run in any order, many at once.
constexpr float kUndefinedShared = std::numeric_limits<float>::quiet_NaN();
void launch(Dim3 grid, Dim3 block, int shared_floats, std::span<const Phase> phases);

// A kernel, one thread's work: c[i] = a[i] + b[i] for the thread's global x index i, if i < n.
void vector_add_kernel(const ThreadCtx& t, const float* a, const float* b, float* c, int n);
// The host side: launches vector_add_kernel over a.size() items with blocks of threads_per_block
// threads (as vector_add_kernel<<<blocks, threads_per_block>>>) and returns c.
std::vector<float> vector_add(std::span<const float> a, std::span<const float> b, int threads_per_block);

// A kernel with a barrier: the sums of the rows of M, a row-major (rows, cols) matrix, one block per
// row (row = blockIdx.x) and blockDim.x threads per block, in two phases:
//   phase 0: thread t adds the row's elements t, t + blockDim.x, t + 2 blockDim.x, ... and stores
//            its partial sum in shared[t]
//   __syncthreads()
//   phase 1: thread 0 adds the blockDim.x partial sums and writes out[row]
void row_sum_partial(const ThreadCtx& t, const float* M, int cols);
void row_sum_finish(const ThreadCtx& t, float* out);
// The host side: launches the two phases with one block per row and returns the row sums.
std::vector<float> row_sums(std::span<const float> M, int rows, int cols, int threads_per_block);

// ---------------------------------------------------------------------------------------------
// Part 2: coalescing. Global memory moves whole 32-byte sectors, however few of their bytes a lane
// wants.

// The byte addresses the 32 lanes of a warp read in a row-major (rows, cols) matrix of elem_bytes-byte
// elements that starts at byte `base`: element (r, c) is at base + (r * cols + c) * elem_bytes.
// AlongRow: lane i reads (row, col + i). DownColumn: lane i reads (row + i, col).
enum class Walk { AlongRow, DownColumn };
std::vector<std::int64_t> warp_addresses(std::int64_t base, int cols, int elem_bytes, int row, int col, Walk walk);

// What one load instruction of a warp costs. Lane i reads bytes_per_access bytes starting at byte
// addresses[i] (a multiple of bytes_per_access, as CUDA requires; bytes_per_access is 1, 2, 4, 8 or 16).
//   sectors:    the distinct 32-byte sectors (byte address / 32) those bytes fall in: what is moved
//   efficiency: the distinct bytes the lanes asked for, divided by the bytes moved (32 * sectors)
struct WarpLoad {
  int sectors = 0;
  double efficiency = 0.0;
};
WarpLoad warp_load(std::span<const std::int64_t> addresses, int bytes_per_access);

// ---------------------------------------------------------------------------------------------
// Part 3: shared-memory banks.

// How many passes one shared-memory access of a warp takes, given the 4-byte word each lane reads
// (word = byte address / 4; a warp with inactive lanes passes fewer than 32): the largest number of
// DISTINCT words that fall in one bank (bank = word % 32). Lanes that read the same word are served by
// one read (a broadcast), so they do not conflict. 1: conflict-free; 32: fully serialized.
int bank_conflict_degree(std::span<const std::int64_t> words);

// The row stride, in words, for a shared (32, cols) tile of 4-byte elements: the smallest stride >= cols
// at which a warp that reads one column (lane i reads row i) touches 32 different banks.
int conflict_free_stride(int cols);

}  // namespace flashlab::lesson03
