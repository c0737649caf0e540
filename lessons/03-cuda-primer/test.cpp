// Lesson 03's test: your launch rules, kernels, sector count and bank-conflict count (lesson.hpp) on
// cases whose answers the test works out on its own (by hand in the case list, or by brute force over
// every byte or every lane), never by calling the solution. The kernels you write are run twice: under
// the test's own launcher, so that a mistake in them is told apart from one in your launch(), and
// under yours. A failure says in plain words what is wrong and where to look.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "lesson.hpp"

namespace lesson = flashlab::lesson03;
using lesson::Dim3;
using lesson::Idx3;
using lesson::Phase;
using lesson::ThreadCtx;

namespace {

std::string str(Idx3 i) {
  std::ostringstream s;
  s << "(" << i.x << ", " << i.y << ", " << i.z << ")";
  return s.str();
}
std::string str(Dim3 d) {
  std::ostringstream s;
  s << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return s.str();
}

// Every diagnose_* function returns "" when your result is right, else plain words saying what is
// wrong and where to look; the test cases CHECK that it is empty. A function still as exercise.cpp has
// it is told so once ("not written yet"), and the rest of its cases are skipped.
bool not_written(const std::string& mistake) { return mistake.find("not written yet") != std::string::npos; }

// ---------------------------------------------------------------------------------------------
// The test's own launcher, for running YOUR kernels on a launcher known to be right: every block in
// turn, a fresh NaN-filled shared array, and each phase for all of the block's threads before the next.
void reference_launch(Dim3 grid, Dim3 block, int shared_floats, std::span<const Phase> phases) {
  for (int bz = 0; bz < grid.z; ++bz)
    for (int by = 0; by < grid.y; ++by)
      for (int bx = 0; bx < grid.x; ++bx) {
        std::vector<float> shared(static_cast<std::size_t>(shared_floats), lesson::kUndefinedShared);
        for (const Phase& phase : phases)
          for (int tz = 0; tz < block.z; ++tz)
            for (int ty = 0; ty < block.y; ++ty)
              for (int tx = 0; tx < block.x; ++tx) {
                ThreadCtx t;
                t.blockIdx = Idx3{bx, by, bz};
                t.blockDim = block;
                t.threadIdx = Idx3{tx, ty, tz};
                t.gridDim = grid;
                t.shared = shared;
                phase(t);
              }
      }
}

// The smallest number of blocks whose threads cover n items, by counting up.
int blocks_by_counting(int n, int threads_per_block) {
  int blocks = 0;
  while (blocks * threads_per_block < n) ++blocks;
  return blocks;
}

// ---------------------------------------------------------------------------------------------
// Part 1: blocks_for, global_index, warp_and_lane.

std::string diagnose_blocks_for(int n, int t) {
  const int yours = lesson::blocks_for(n, t), want = blocks_by_counting(n, t);
  if (yours == want) return "";
  std::ostringstream why;
  why << "your blocks_for(" << n << ", " << t << ") is " << yours << ", expected " << want << ": ";
  if (yours == 0 && n >= t)
    why << "no block, so no thread at all: not written yet (TODO 1)?";
  else if (yours == 0)
    why << "no block, so no thread at all: even " << (n == 1 ? "one item needs" : std::to_string(n) + " items need")
        << " a block, partly idle. Round up: (n + t - 1) / t";
  else if (yours == n / t && n % t != 0)
    why << "it rounds DOWN: " << yours << " x " << t << " threads = " << yours * t << " threads, so "
        << (n - 1 == yours * t ? "item " + std::to_string(n - 1) + " gets"
                               : "items " + std::to_string(yours * t) + " .. " + std::to_string(n - 1) + " get")
        << " none. Round up: ceil(" << n << " / " << t << ") = " << want
        << ", the last block partly idle; in integers (n + t - 1) / t";
  else if (yours == want + 1 && n % t == 0)
    why << n << " items fill exactly " << want << " blocks of " << t
        << "; round up only when there is a remainder: (n + t - 1) / t, not n / t + 1";
  else
    why << "the smallest number of blocks whose blocks * " << t << " threads cover " << n << " items";
  return why.str();
}

std::string diagnose_global_index(Idx3 b, Dim3 d, Idx3 t, Idx3 want) {
  const Idx3 yours = lesson::global_index(b, d, t);
  if (yours.x == want.x && yours.y == want.y && yours.z == want.z) return "";
  std::ostringstream why;
  why << "your global_index(blockIdx " << str(b) << ", blockDim " << str(d) << ", threadIdx " << str(t) << ") is "
      << str(yours) << ", expected " << str(want) << ":";
  if (yours.x == 0 && yours.y == 0 && yours.z == 0 && (t.x != 0 || t.y != 0 || t.z != 0))
    why << " (0, 0, 0) for a thread that is not the first: not written yet (TODO 2)?";
  const auto dim = [&](const char* name, int bi, int bd, int ti, int y, int w) {
    if (y == w) return;
    why << "\n  " << name << " = blockIdx." << name << " * blockDim." << name << " + threadIdx." << name << " = " << bi
        << " * " << bd << " + " << ti << " = " << w << ", yours " << y;
    if (y == ti)
      why << " (threadIdx alone: every block would then work on the same first items)";
    else if (y == bi * bd)
      why << " (threadIdx is missing)";
  };
  dim("x", b.x, d.x, t.x, yours.x, want.x);
  dim("y", b.y, d.y, t.y, yours.y, want.y);
  dim("z", b.z, d.z, t.z, yours.z, want.z);
  return why.str();
}

std::string diagnose_warp_and_lane(Idx3 t, Dim3 d, int flat) {
  const lesson::WarpLane yours = lesson::warp_and_lane(t, d);
  const int warp = flat / 32, lane = flat % 32;
  if (yours.warp == warp && yours.lane == lane) return "";
  std::ostringstream why;
  why << "thread " << str(t) << " of a " << str(d) << " block: yours is warp " << yours.warp << ", lane " << yours.lane
      << ", expected warp " << warp << ", lane " << lane << ": ";
  if (yours.warp == 0 && yours.lane == 0)
    why << "warp 0, lane 0 for a thread that is not the first: not written yet (TODO 3)? ";
  const int y_fastest = t.y + t.x * d.y + t.z * d.x * d.y;
  if (d.y > 1 && y_fastest != flat && yours.warp == y_fastest / 32 && yours.lane == y_fastest % 32)
    why << "you numbered the threads y fastest; CUDA numbers them x fastest, then y, then z, ";
  why << "t = x + y * blockDim.x + z * blockDim.x * blockDim.y = " << t.x << " + " << t.y << " * " << d.x << " + "
      << t.z << " * " << d.x << " * " << d.y << " = " << flat << ", so warp t / 32 and lane t % 32";
  return why.str();
}

}  // namespace

TEST_CASE("lesson 03: blocks_for rounds up, so that every item gets a thread") {
  struct Case {
    int n, t;
  };
  const Case cases[] = {{1000, 256}, {1024, 256}, {1025, 256}, {1, 256}, {0, 128}, {33, 32}, {5, 1}, {4096, 128}};
  for (const Case& c : cases) {
    const std::string mistake = diagnose_blocks_for(c.n, c.t);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: global_index is blockIdx * blockDim + threadIdx in every dimension") {
  struct Case {
    Idx3 b;
    Dim3 d;
    Idx3 t, want;
    std::string what;
  };
  const Case cases[] = {
      {{2, 0, 0}, {256, 1, 1}, {5, 0, 0}, {517, 0, 0}, "1D: thread 5 of block 2, blocks of 256"},
      {{0, 0, 0}, {128, 1, 1}, {127, 0, 0}, {127, 0, 0}, "1D: the last thread of the first block"},
      {{7, 0, 0}, {32, 1, 1}, {0, 0, 0}, {224, 0, 0}, "1D: the first thread of block 7"},
      {{1, 3, 0}, {16, 8, 1}, {4, 2, 0}, {20, 26, 0}, "2D: x is a column, y a row"},
      {{2, 1, 3}, {4, 2, 2}, {1, 1, 1}, {9, 3, 7}, "3D"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string mistake = diagnose_global_index(c.b, c.d, c.t, c.want);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: warp_and_lane numbers a block's threads x fastest, 32 to a warp") {
  struct Case {
    Idx3 t;
    Dim3 d;
    int flat;  // the thread's number in its block, worked out by hand
  };
  const Case cases[] = {
      {{0, 0, 0}, {256, 1, 1}, 0},     {{31, 0, 0}, {256, 1, 1}, 31},
      {{32, 0, 0}, {256, 1, 1}, 32},   {{37, 0, 0}, {256, 1, 1}, 37},
      {{255, 0, 0}, {256, 1, 1}, 255}, {{4, 2, 0}, {16, 8, 1}, 36},  // 4 + 2 * 16: two rows of 16 threads come first
      {{15, 1, 0}, {16, 8, 1}, 31},                                  // the last lane of warp 0
      {{5, 3, 0}, {32, 4, 1}, 101},                                  // blocks 32 wide: each row of threads is one warp
      {{3, 2, 1}, {8, 4, 2}, 51},                                    // 3 + 2 * 8 + 1 * 8 * 4
  };
  for (const Case& c : cases) {
    const std::string mistake = diagnose_warp_and_lane(c.t, c.d, c.flat);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: launch runs every thread of every block, and each phase for the whole block first") {
  SUBCASE("every (block, thread) once, with the launch's blockDim and gridDim") {
    const Dim3 grid{3, 2, 2}, block{4, 2, 2};
    const int expected_calls = 3 * 2 * 2 * (4 * 2 * 2);
    std::map<std::tuple<int, int, int, int, int, int>, int> calls;
    int total = 0, wrong_dims = 0;
    Dim3 seen_block, seen_grid;
    const Phase phases[] = {[&](const ThreadCtx& t) {
      ++total;
      ++calls[{t.blockIdx.x, t.blockIdx.y, t.blockIdx.z, t.threadIdx.x, t.threadIdx.y, t.threadIdx.z}];
      const bool dims_ok = t.blockDim.x == block.x && t.blockDim.y == block.y && t.blockDim.z == block.z &&
                           t.gridDim.x == grid.x && t.gridDim.y == grid.y && t.gridDim.z == grid.z;
      if (!dims_ok && wrong_dims++ == 0) {
        seen_block = t.blockDim;
        seen_grid = t.gridDim;
      }
    }};
    lesson::launch(grid, block, 0, phases);
    REQUIRE_MESSAGE(total > 0, "your launch ran no thread at all: not written yet (TODO 4)?");
    CHECK_MESSAGE(total == expected_calls,
                  "your launch called the kernel "
                      << total << " times; a grid of " << str(grid) << " blocks of " << str(block)
                      << " threads is 12 blocks x 16 threads = " << expected_calls
                      << " threads, each run once for a kernel of one phase: loop over all three dimensions of "
                         "both the grid and the block");
    int wrong_count = 0;  // (block, thread) pairs not run exactly once; the first one named
    std::string first_wrong;
    for (int bz = 0; bz < grid.z; ++bz)
      for (int by = 0; by < grid.y; ++by)
        for (int bx = 0; bx < grid.x; ++bx)
          for (int tz = 0; tz < block.z; ++tz)
            for (int ty = 0; ty < block.y; ++ty)
              for (int tx = 0; tx < block.x; ++tx) {
                const auto it = calls.find({bx, by, bz, tx, ty, tz});
                const int n = it == calls.end() ? 0 : it->second;
                if (it != calls.end()) calls.erase(it);
                if (n == 1 || wrong_count++ > 0) continue;
                std::ostringstream why;
                why << "thread " << str(Idx3{tx, ty, tz}) << " of block " << str(Idx3{bx, by, bz}) << " ran " << n
                    << " times";
                first_wrong = why.str();
              }
    CHECK_MESSAGE(wrong_count == 0, wrong_count << " threads of the grid did not run exactly once, such as "
                                                << first_wrong << ": run each (block, thread) once per phase");
    CHECK_MESSAGE(calls.empty(), "your launch ran " << calls.size()
                                                    << " (block, thread) pairs that are not in the grid, such as "
                                                       "blockIdx or threadIdx past the launch's sizes");
    CHECK_MESSAGE(wrong_dims == 0, "the kernel saw blockDim = " << str(seen_block) << " and gridDim = "
                                                                << str(seen_grid) << " in " << wrong_dims
                                                                << " calls; they must be the "
                                                                   "launch's block "
                                                                << str(block) << " and grid " << str(grid));
  }
  SUBCASE("__syncthreads(): phase 1 reads what the block's other threads wrote in phase 0") {
    // Phase 0: thread t writes shared[t] = 100 b + t. Phase 1: thread t reads its neighbour's slot,
    // shared[(t + 1) % 64]. Right only if every thread of the block finished phase 0 first.
    constexpr int kThreads = 64, kBlocks = 2;
    std::vector<float> out(kThreads * kBlocks, -1.0f);
    const Phase phases[] = {[&](const ThreadCtx& t) {
                              if (t.shared.size() >= kThreads)
                                t.shared[static_cast<std::size_t>(t.threadIdx.x)] =
                                    static_cast<float>(100 * t.blockIdx.x + t.threadIdx.x);
                            },
                            [&](const ThreadCtx& t) {
                              const auto i = static_cast<std::size_t>(t.blockIdx.x * kThreads + t.threadIdx.x);
                              if (t.shared.size() >= kThreads && i < out.size())
                                out[i] = t.shared[static_cast<std::size_t>((t.threadIdx.x + 1) % kThreads)];
                            }};
    lesson::launch(Dim3{kBlocks}, Dim3{kThreads}, kThreads, phases);
    std::string mistake;
    for (int b = 0; b < kBlocks && mistake.empty(); ++b)
      for (int t = 0; t < kThreads && mistake.empty(); ++t) {
        const float got = out[static_cast<std::size_t>(b * kThreads + t)];
        const float want = static_cast<float>(100 * b + (t + 1) % kThreads);
        if (got == want) continue;
        std::ostringstream why;
        why << "thread " << t << " of block " << b << " read " << got << " from shared[" << (t + 1) % kThreads
            << "] in phase 1, expected " << want << " (written there by thread " << (t + 1) % kThreads
            << " in phase 0): ";
        if (got == -1.0f)
          why << "phase 1 never ran for it (or shared had fewer than " << kThreads
              << " floats): run every phase, for every thread";
        else if (std::isnan(got))
          why << "it read the slot before its writer got there. Your launch runs a thread through all its phases "
                 "before the next thread starts; a __syncthreads() between phases means the opposite: EVERY "
                 "thread of the block finishes phase 0 before ANY starts phase 1 (the phase loop goes outside "
                 "the thread loops)";
        else
          why << "it read another block's value: each block has its own shared array";
        mistake = why.str();
      }
    CHECK_MESSAGE(mistake.empty(), mistake);
  }
  SUBCASE("each block gets its own fresh shared array, of the size asked for") {
    // Each thread looks only at its own slot, before writing it: a slot that is not kUndefinedShared
    // was written by an earlier block.
    constexpr int kThreads = 8, kFloats = 8;
    int wrong_size = 0, seen_size = 0, reused = 0, first_reused_block = -1;
    const Phase phases[] = {[&](const ThreadCtx& t) {
      if (static_cast<int>(t.shared.size()) != kFloats) {
        ++wrong_size;
        seen_size = static_cast<int>(t.shared.size());
        return;
      }
      float& mine = t.shared[static_cast<std::size_t>(t.threadIdx.x)];
      if (!std::isnan(mine) && reused++ == 0) first_reused_block = t.blockIdx.x;
      mine = 1.0f;
    }};
    lesson::launch(Dim3{3}, Dim3{kThreads}, kFloats, phases);
    REQUIRE_MESSAGE(wrong_size == 0, "the kernel's shared array had " << seen_size << " floats; the launch asked for "
                                                                      << kFloats << " (shared_floats)");
    CHECK_MESSAGE(reused == 0, "block " << first_reused_block
                                        << " found values in its shared memory before writing any: make a fresh "
                                           "array for each block, filled with kUndefinedShared. Shared memory "
                                           "belongs to one block and lives only as long as the block");
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Part 1's kernels.

constexpr float kMarker = -7.0f;  // in the output before the kernel runs: still there = never written

// a[i] = i, b[i] = 2 i + 0.5: every sum 3 i + 0.5 is exact in float for these sizes.
std::vector<float> input_a(int n) {
  std::vector<float> a(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = static_cast<float>(i);
  return a;
}
std::vector<float> input_b(int n) {
  std::vector<float> b(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) b[static_cast<std::size_t>(i)] = 2.0f * static_cast<float>(i) + 0.5f;
  return b;
}
float sum_ab(int i) { return 3.0f * static_cast<float>(i) + 0.5f; }

// Your vector_add_kernel under the test's launcher, on a c with room for every launched thread.
std::string diagnose_vector_add_kernel(int n, int threads_per_block) {
  const int blocks = blocks_by_counting(n, threads_per_block), launched = blocks * threads_per_block;
  const std::vector<float> a = input_a(n), b = input_b(n);
  std::vector<float> c(static_cast<std::size_t>(launched), kMarker);
  const Phase phases[] = {[&](const ThreadCtx& t) { lesson::vector_add_kernel(t, a.data(), b.data(), c.data(), n); }};
  reference_launch(Dim3{blocks}, Dim3{threads_per_block}, 0, phases);
  std::ostringstream why;
  why << "n = " << n << ", " << blocks << " blocks of " << threads_per_block << " threads: ";
  if (std::all_of(c.begin(), c.end(), [](float v) { return v == kMarker; }))
    return why.str() + "your vector_add_kernel wrote nothing to c: not written yet (TODO 5a)?";
  for (int i = n; i < launched; ++i)
    if (c[static_cast<std::size_t>(i)] != kMarker) {
      why << "your kernel wrote c[" << i << "], past the n = " << n << " items: the last block's " << launched - n
          << " spare threads must do nothing (if (i < n))";
      return why.str();
    }
  for (int i = 0; i < n; ++i) {
    const float got = c[static_cast<std::size_t>(i)];
    if (got == sum_ab(i)) continue;
    why << "c[" << i << "] is " << got << ", expected a[" << i << "] + b[" << i << "] = " << sum_ab(i) << ": ";
    if (got == kMarker && i >= threads_per_block)
      why << "only the first block's items were written. Is i the GLOBAL index, blockIdx.x * blockDim.x + "
             "threadIdx.x? With threadIdx.x alone every block works on c[0 .. blockDim.x - 1]";
    else
      why << "each thread adds a[i] + b[i] at its own global index i";
    return why.str();
  }
  return "";
}

// Your vector_add (your launch, your blocks_for, your kernel).
std::string diagnose_vector_add(int n, int threads_per_block) {
  const std::vector<float> a = input_a(n), b = input_b(n);
  const std::vector<float> c = lesson::vector_add(a, b, threads_per_block);
  std::ostringstream why;
  why << "vector_add with n = " << n << " in blocks of " << threads_per_block << ": ";
  if (c.size() != a.size()) {
    why << "returned " << c.size() << " numbers, expected " << n;
    return why.str();
  }
  int first_wrong = -1, wrong = 0;
  for (int i = 0; i < n; ++i)
    if (c[static_cast<std::size_t>(i)] != sum_ab(i) && wrong++ == 0) first_wrong = i;
  if (wrong == 0) return "";
  const bool kernel_ok = diagnose_vector_add_kernel(n, threads_per_block).empty();
  why << wrong << " of the " << n << " sums are wrong, the first c[" << first_wrong
      << "] = " << c[static_cast<std::size_t>(first_wrong)] << " (expected " << sum_ab(first_wrong) << "): ";
  if (!kernel_ok)
    why << "your vector_add_kernel is wrong under the test's own launcher too: fix it first (the test case above "
           "says what is wrong with it), then TODO 5b";
  else if (wrong == n)
    why << "your kernel is right under the test's launcher, so the launch is the problem: TODO 5b launches it "
           "on blocks_for(n, threads_per_block) blocks of threads_per_block threads with your launch() (TODO 4)";
  else
    why << "the items from c[" << first_wrong << "] on got no thread: launch blocks_for(n, threads_per_block) "
        << "blocks (" << blocks_by_counting(n, threads_per_block)
        << " here), and check blocks_for and launch's loops over the grid";
  return why.str();
}

// M[r][c] = ((7 r + 3 c) % 11) - 5: small integers, so every row sum is exact in float.
std::vector<float> row_sum_input(int rows, int cols) {
  std::vector<float> M(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      M[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)] =
          static_cast<float>((7 * r + 3 * c) % 11 - 5);
  return M;
}
float row_total(const std::vector<float>& M, int cols, int r, int first = 0, int step = 1) {
  float s = 0.0f;
  for (int c = first; c < cols; c += step)
    s += M[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(c)];
  return s;
}

// Names the first wrong row sum; `under` says whose launcher ran the kernel.
std::string diagnose_row_sums(const std::vector<float>& M, int rows, int cols, int threads,
                              const std::vector<float>& out, const std::string& under) {
  std::ostringstream why;
  why << rows << " rows of " << cols << " columns, blocks of " << threads << " threads, " << under << ": ";
  if (out.size() != static_cast<std::size_t>(rows)) {
    why << "returned " << out.size() << " sums, expected " << rows;
    return why.str();
  }
  for (int r = 0; r < rows; ++r) {
    const float got = out[static_cast<std::size_t>(r)], want = row_total(M, cols, r);
    if (got == want) continue;
    why << "the sum of row " << r << " is " << got << ", expected " << want << ": ";
    if (got == kMarker || (got == 0.0f && std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; })))
      why << "nothing was written to out: thread 0 writes out[blockIdx.x] in phase 1; not written yet (TODO 6)?";
    else if (std::isnan(got))
      why << "a partial sum was never stored: shared memory starts undefined (NaN here), so EVERY thread stores "
             "its partial sum in shared[threadIdx.x] in phase 0, 0 when it got no element"
          << (threads > cols ? " (here blocks have more threads than the row has columns)" : "");
    else if (got == row_total(M, cols, r, 0, threads))
      why << "that is thread 0's partial sum alone: in phase 1 thread 0 adds ALL blockDim.x partial sums";
    else if (got == row_total(M, cols, r, 0, 1) * static_cast<float>(threads))
      why << "every thread added the whole row: thread t adds only columns t, t + blockDim.x, ...";
    else
      why << "in phase 0, thread t adds the row's columns t, t + blockDim.x, t + 2 blockDim.x, ... (below cols) of "
             "row blockIdx.x, M[row * cols + c]; in phase 1 thread 0 adds the blockDim.x partial sums";
    return why.str();
  }
  return "";
}

// Your two phases under the test's launcher.
std::string diagnose_row_sum_kernel(int rows, int cols, int threads) {
  const std::vector<float> M = row_sum_input(rows, cols);
  std::vector<float> out(static_cast<std::size_t>(rows), kMarker);
  const Phase phases[] = {[&](const ThreadCtx& t) { lesson::row_sum_partial(t, M.data(), cols); },
                          [&](const ThreadCtx& t) { lesson::row_sum_finish(t, out.data()); }};
  reference_launch(Dim3{rows}, Dim3{threads}, threads, phases);
  return diagnose_row_sums(M, rows, cols, threads, out, "under the test's launcher");
}

}  // namespace

TEST_CASE("lesson 03: vector_add_kernel adds at its global index, and its spare threads write nothing") {
  struct Case {
    int n, threads;
  };
  // n not a multiple of the block: the last block has spare threads.
  const Case cases[] = {{1000, 256}, {33, 32}, {1, 64}, {4096, 128}};
  for (const Case& c : cases) {
    const std::string mistake = diagnose_vector_add_kernel(c.n, c.threads);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: vector_add launches enough blocks with your launch()") {
  struct Case {
    int n, threads;
  };
  const Case cases[] = {{1000, 256}, {33, 32}, {1, 64}, {4096, 128}};
  for (const Case& c : cases) {
    const std::string mistake = diagnose_vector_add(c.n, c.threads);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (!mistake.empty() && !diagnose_vector_add_kernel(c.n, c.threads).empty()) break;  // the kernel first
  }
}

TEST_CASE("lesson 03: the row-sum kernel: strided partial sums, a barrier, then thread 0 adds them") {
  struct Case {
    int rows, cols, threads;
    std::string what;
  };
  const Case cases[] = {
      {5, 1000, 128, "1000 columns are not a multiple of 128 threads"},
      {3, 256, 256, "one column per thread"},
      {4, 10, 32, "more threads than columns: 22 threads get no element"},
      {2, 1, 64, "a single column"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string mistake = diagnose_row_sum_kernel(c.rows, c.cols, c.threads);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: row_sums launches one block per row with your launch()") {
  const int rows = 7, cols = 300, threads = 64;
  const std::vector<float> M = row_sum_input(rows, cols);
  const std::vector<float> out = lesson::row_sums(M, rows, cols, threads);
  std::string mistake = diagnose_row_sums(M, rows, cols, threads, out, "under your launch()");
  if (!mistake.empty() && diagnose_row_sum_kernel(rows, cols, threads).empty())
    mistake +=
        "\n  (your two phases are right under the test's launcher: look at TODO 6c, grid = rows, block = "
        "threads_per_block, threads_per_block floats of shared memory, and at your launch())";
  CHECK_MESSAGE(mistake.empty(), mistake);
}

namespace {

// ---------------------------------------------------------------------------------------------
// Part 2: coalescing.

// What a warp's load moves, by brute force: every byte of every access, its sector, and the distinct
// bytes asked for.
struct Moved {
  int sectors = 0;
  double efficiency = 0.0;
};
Moved moved_by_bytes(const std::vector<std::int64_t>& addresses, int bytes) {
  std::set<std::int64_t> byte_set, sector_set;
  for (std::int64_t a : addresses)
    for (std::int64_t k = 0; k < bytes; ++k) {
      byte_set.insert(a + k);
      sector_set.insert((a + k) / 32);
    }
  Moved m;
  m.sectors = static_cast<int>(sector_set.size());
  if (m.sectors > 0) m.efficiency = static_cast<double>(byte_set.size()) / (32.0 * m.sectors);
  return m;
}

// Lanes 0..lanes-1 at base + i * stride.
std::vector<std::int64_t> strided(std::int64_t base, std::int64_t stride, int lanes = 32) {
  std::vector<std::int64_t> a(static_cast<std::size_t>(lanes));
  for (int i = 0; i < lanes; ++i) a[static_cast<std::size_t>(i)] = base + i * stride;
  return a;
}

bool same(double a, double b) { return std::abs(a - b) <= 1e-12; }

std::string diagnose_warp_load(const std::vector<std::int64_t>& addresses, int bytes, int want_sectors,
                               double want_efficiency, const std::string& why_so) {
  const lesson::WarpLoad yours = lesson::warp_load(addresses, bytes);
  if (yours.sectors == want_sectors && same(yours.efficiency, want_efficiency)) return "";
  std::ostringstream why;
  const std::set<std::int64_t> distinct(addresses.begin(), addresses.end());
  if (yours.sectors != want_sectors) {
    why << "your warp_load counts " << yours.sectors << " sectors, expected " << want_sectors << " (" << why_so
        << "): ";
    if (yours.sectors == 0)
      why << "none at all: not written yet (TODO 8)?";
    else if (yours.sectors == static_cast<int>(addresses.size()) && want_sectors < yours.sectors)
      why << "one per lane? Lanes whose bytes fall in the same 32-byte sector share it: count the distinct "
             "byte / 32 of the bytes read";
    else
      why << "count the distinct byte / 32 over every byte read, from a / 32 to (a + bytes - 1) / 32 for each lane";
    return why.str();
  }
  why << "your efficiency is " << yours.efficiency << ", expected " << want_efficiency << " (" << why_so
      << "): the distinct bytes asked for, " << distinct.size() << " distinct addresses x " << bytes
      << " bytes, divided by the bytes moved, 32 x " << want_sectors << " sectors";
  if (distinct.size() < addresses.size()) why << "; lanes that read the same address count once";
  return why.str();
}

std::string diagnose_warp_addresses(std::int64_t base, int cols, int elem, int row, int col, lesson::Walk walk) {
  const std::vector<std::int64_t> yours = lesson::warp_addresses(base, cols, elem, row, col, walk);
  const bool along = walk == lesson::Walk::AlongRow;
  std::ostringstream why;
  why << "warp_addresses(base " << base << ", cols " << cols << ", " << elem << "-byte elements, row " << row
      << ", col " << col << ", " << (along ? "AlongRow" : "DownColumn") << "): ";
  if (yours.size() != 32) {
    why << "returned " << yours.size() << " addresses; a warp has 32 lanes"
        << (yours.empty() ? ": not written yet (TODO 7)?" : "");
    return why.str();
  }
  for (int i = 0; i < 32; ++i) {
    const std::int64_t r = row + (along ? 0 : i), c = col + (along ? i : 0);
    const std::int64_t want = base + (r * cols + c) * elem;
    const std::int64_t got = yours[static_cast<std::size_t>(i)];
    if (got == want) continue;
    const std::int64_t r_other = row + (along ? i : 0), c_other = col + (along ? 0 : i);
    why << "lane " << i << " reads byte " << got << ", expected " << want << ", element (" << r << ", " << c
        << ") at base + (" << r << " * " << cols << " + " << c << ") * " << elem << ": ";
    if (got == base + (r_other * cols + c_other) * elem)
      why << "your walks are swapped: AlongRow moves lane i to column col + i, DownColumn to row row + i";
    else if (want > INT32_MAX && (got < 0 || (got & 0xffffffff) == (want & 0xffffffff)))
      why << "the address passes 2^31: compute in std::int64_t, not int";
    else
      why << "element (r, c) of a row-major matrix is at base + (r * cols + c) * elem_bytes";
    return why.str();
  }
  return "";
}

}  // namespace

TEST_CASE("lesson 03: warp_addresses walks along a row or down a column of a row-major matrix") {
  using lesson::Walk;
  struct Case {
    std::int64_t base;
    int cols, elem, row, col;
    Walk walk;
  };
  const Case cases[] = {
      {4096, 64, 4, 3, 8, Walk::AlongRow},    // floats: lanes 4 bytes apart
      {4096, 64, 4, 3, 8, Walk::DownColumn},  // lanes one row, 256 bytes, apart
      {0, 128, 2, 0, 0, Walk::AlongRow},      // bf16
      {0, 128, 2, 5, 64, Walk::DownColumn},       {256, 16, 16, 1, 0, Walk::AlongRow},  // 16-byte elements (float4)
      {0, 100000, 4, 30000, 7, Walk::DownColumn},                                       // addresses past 2^31 bytes
  };
  for (const Case& c : cases) {
    const std::string mistake = diagnose_warp_addresses(c.base, c.cols, c.elem, c.row, c.col, c.walk);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: warp_load counts the 32-byte sectors a warp's load moves") {
  SUBCASE("cases worked out by hand") {
    std::vector<std::int64_t> shuffled = strided(0, 4);
    std::reverse(shuffled.begin() + 8, shuffled.end());
    std::swap(shuffled[0], shuffled[20]);
    std::vector<std::int64_t> two_words(32);
    for (int i = 0; i < 32; ++i) two_words[static_cast<std::size_t>(i)] = i < 16 ? 0 : 4;
    struct Case {
      std::vector<std::int64_t> addresses;
      int bytes, sectors;
      double efficiency;
      std::string what;
    };
    const Case cases[] = {
        {strided(0, 4), 4, 4, 1.0, "32 consecutive floats from byte 0: 128 bytes, 4 whole sectors"},
        {strided(4, 4), 4, 5, 0.8,
         "32 consecutive floats from byte 4, a misaligned start: bytes 4..131 reach into a 5th sector"},
        {strided(64, 4), 4, 4, 1.0, "32 consecutive floats from byte 64: a start at a multiple of 32 is aligned"},
        {strided(0, 2), 2, 2, 1.0, "32 consecutive bf16: 64 bytes, 2 sectors"},
        {strided(0, 8), 8, 8, 1.0, "32 consecutive 8-byte doubles: 256 bytes, 8 sectors"},
        {strided(0, 16), 16, 16, 1.0, "32 consecutive 16-byte float4: 512 bytes, 16 sectors"},
        {strided(16, 16), 16, 17, 512.0 / 544.0, "32 float4 from byte 16: half a sector wasted at each end"},
        {strided(16, 1), 1, 2, 0.5, "32 consecutive bytes from byte 16: they straddle two sectors"},
        {strided(100, 0), 4, 1, 4.0 / 32.0, "every lane reads the same float: one sector, 4 of its 32 bytes used"},
        {two_words, 4, 1, 8.0 / 32.0, "two floats, each read by 16 lanes"},
        {strided(0, 8), 4, 8, 0.5, "every other float (stride 8 bytes): half of each sector is wasted"},
        {strided(0, 256), 4, 32, 0.125, "a column of a row-major matrix of 64 floats a row: one sector per lane"},
        {strided(0, 4, 16), 4, 2, 1.0, "16 active lanes reading 16 consecutive floats"},
        {shuffled, 4, 4, 1.0, "32 consecutive floats in shuffled lane order: the order within a warp does not matter"},
    };
    for (const Case& c : cases) {
      const Moved check = moved_by_bytes(c.addresses, c.bytes);  // the hand-worked numbers, by brute force
      REQUIRE(check.sectors == c.sectors);
      REQUIRE(same(check.efficiency, c.efficiency));
      const std::string mistake = diagnose_warp_load(c.addresses, c.bytes, c.sectors, c.efficiency, c.what);
      CHECK_MESSAGE(mistake.empty(), mistake);
      if (not_written(mistake)) break;
    }
  }
  SUBCASE("random warps, against a count of every byte") {
    std::mt19937 rng(2024);
    const int widths[] = {1, 2, 4, 8, 16};
    for (int trial = 0; trial < 200; ++trial) {
      const int bytes = widths[trial % 5];
      std::uniform_int_distribution<int> slot(0, 1024 / bytes - 1);
      std::vector<std::int64_t> addresses(32);
      for (auto& a : addresses) a = static_cast<std::int64_t>(slot(rng)) * bytes;  // aligned, as CUDA requires
      const Moved want = moved_by_bytes(addresses, bytes);
      const std::string mistake =
          diagnose_warp_load(addresses, bytes, want.sectors, want.efficiency, "random aligned lanes in 1 KiB");
      CHECK_MESSAGE(mistake.empty(), mistake);
      if (!mistake.empty()) break;  // one example is enough
    }
  }
}

TEST_CASE("lesson 03: a warp reading along a row is coalesced; down a column it is not") {
  // Lesson 04's Q is (seq, d) floats with d = 64: a row is 256 bytes. The same tile in bf16 too.
  using lesson::Walk;
  struct Case {
    int elem;
    Walk walk;
    int sectors;
    double efficiency;
    std::string what;
  };
  const Case cases[] = {
      {4, Walk::AlongRow, 4, 1.0, "floats along a row: coalesced, 128 bytes in 4 sectors"},
      {4, Walk::DownColumn, 32, 0.125, "floats down a column: rows 256 bytes apart, 32 sectors for 128 bytes"},
      {2, Walk::AlongRow, 2, 1.0, "bf16 along a row: 64 bytes in 2 sectors"},
      {2, Walk::DownColumn, 32, 2.0 / 32.0, "bf16 down a column: 32 sectors for 64 bytes"},
  };
  for (const Case& c : cases) {
    const std::vector<std::int64_t> addresses = lesson::warp_addresses(0, 64, c.elem, 0, 0, c.walk);
    const lesson::WarpLoad yours = lesson::warp_load(addresses, c.elem);
    CHECK_MESSAGE((yours.sectors == c.sectors && same(yours.efficiency, c.efficiency)),
                  "a (seq, 64) matrix, " << c.what << ": your warp_addresses and warp_load give sectors = "
                                         << yours.sectors << ", efficiency = " << yours.efficiency
                                         << "; expected sectors = " << c.sectors << ", efficiency = " << c.efficiency
                                         << " (the two test cases above say which of the two to fix)");
    if (yours.sectors == 0) break;
  }
}

namespace {

// ---------------------------------------------------------------------------------------------
// Part 3: banks.

// The conflict degree by brute force over the lanes: for each lane, how many distinct words the lanes
// in its bank ask for.
int degree_by_lanes(const std::vector<std::int64_t>& words) {
  int worst = 0;
  for (std::int64_t w : words) {
    std::set<std::int64_t> same_bank;
    for (std::int64_t v : words)
      if (v % 32 == w % 32) same_bank.insert(v);
    worst = std::max(worst, static_cast<int>(same_bank.size()));
  }
  return worst;
}

// The wrong count that forgets broadcasts: the most lanes (not words) in one bank.
int lanes_in_busiest_bank(const std::vector<std::int64_t>& words) {
  std::map<std::int64_t, int> lanes;
  for (std::int64_t w : words) ++lanes[w % 32];
  int worst = 0;
  for (const auto& [bank, n] : lanes) worst = std::max(worst, n);
  return worst;
}

std::string diagnose_degree(const std::vector<std::int64_t>& words, int want, const std::string& why_so) {
  const int yours = lesson::bank_conflict_degree(words);
  if (yours == want) return "";
  std::ostringstream why;
  why << "your bank_conflict_degree is " << yours << ", expected " << want << " (" << why_so << "): ";
  if (yours == 0)
    why << "0 passes cannot deliver anything; a warp that reads at all needs at least 1: not written yet (TODO 9)?";
  else if (yours == lanes_in_busiest_bank(words) && yours != want)
    why << "you counted lanes, not distinct words: lanes that read the SAME word are served by one read (a "
           "broadcast) and do not conflict";
  else
    why << "for each bank (word % 32), the number of DISTINCT words the warp reads in it; the largest is the answer";
  return why.str();
}

// The smallest stride >= cols at which a column read (lane i, row i) hits 32 banks, by trying strides.
int stride_by_search(int cols) {
  for (int s = cols;; ++s) {
    std::set<int> banks;
    for (int i = 0; i < 32; ++i) banks.insert((i * s) % 32);
    if (banks.size() == 32) return s;
  }
}

}  // namespace

TEST_CASE("lesson 03: bank_conflict_degree counts the distinct words in the busiest bank") {
  std::vector<std::int64_t> half_0_half_32(32), three_words(32), repeated_16(32), random_words(32);
  for (int i = 0; i < 32; ++i) {
    half_0_half_32[static_cast<std::size_t>(i)] = i < 16 ? 0 : 32;
    three_words[static_cast<std::size_t>(i)] = 32 * (i % 3);
    repeated_16[static_cast<std::size_t>(i)] = i % 16;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> word(0, 255);
  for (auto& w : random_words) w = word(rng);
  struct Case {
    std::vector<std::int64_t> words;
    int degree;
    std::string what;
  };
  const Case cases[] = {
      {strided(0, 1), 1, "32 consecutive words: one per bank"},
      {strided(96, 1), 1, "32 consecutive words from word 96: still one per bank"},
      {strided(7, 0), 1, "every lane reads word 7: one read, broadcast to all"},
      {repeated_16, 1, "lanes i and i + 16 read the same word: broadcast pairs"},
      {strided(0, 2), 2, "stride 2 words: lanes i and i + 16 hit the same bank at different words"},
      {strided(0, 4), 4, "stride 4 words (the first float of each float4): 8 banks, 4 words each"},
      {half_0_half_32, 2, "16 lanes read word 0 and 16 read word 32: both in bank 0"},
      {three_words, 3, "words 0, 32 and 64, each read by several lanes: 3 distinct words in bank 0"},
      {strided(0, 32), 32, "a column of a 32-word-wide tile: every lane in bank 0"},
      {strided(5, 32), 32, "a column starting at word 5: every lane in bank 5"},
      {strided(0, 64), 32, "a column of a 64-word-wide tile"},
      {strided(0, 33), 1, "a column of a 32-wide tile padded to 33: banks 0, 1, 2, ..."},
      {strided(0, 65), 1, "a column of a 64-wide tile padded to 65"},
      {strided(0, 32, 8), 8, "8 active lanes down a 32-wide column"},
      {random_words, degree_by_lanes(random_words), "32 random words below 256, counted lane by lane"},
  };
  for (const Case& c : cases) {
    REQUIRE(degree_by_lanes(c.words) == c.degree);  // the hand-worked numbers, by brute force
    const std::string mistake = diagnose_degree(c.words, c.degree, c.what);
    CHECK_MESSAGE(mistake.empty(), mistake);
    if (not_written(mistake)) break;
  }
}

TEST_CASE("lesson 03: conflict_free_stride pads a tile so that a warp can read a column in one pass") {
  const int cols_cases[] = {32, 64, 128, 16, 48, 33, 31, 1, 100};
  for (int cols : cols_cases) {
    const int yours = lesson::conflict_free_stride(cols), want = stride_by_search(cols);
    if (yours == want) continue;
    std::ostringstream why;
    why << "your conflict_free_stride(" << cols << ") is " << yours << ", expected " << want << ": ";
    if (yours == 0) {
      why << "no stride at all: not written yet (TODO 10)?";
    } else if (yours < cols) {
      why << "a row needs at least " << cols << " words, or rows overlap";
    } else {
      const int degree = degree_by_lanes(strided(0, yours));
      if (degree > 1)
        why << "at stride " << yours << " a column read is " << degree << "-way conflicted: lane i is in bank (i * "
            << yours << ") % 32, and an even stride sends lanes i and i + 16 to the same bank. Only a stride that "
            << "shares no factor with 32, an odd one, spreads the 32 lanes over all 32 banks";
      else
        why << "stride " << yours << " is conflict-free, but so is " << want
            << ", and every word of padding costs shared memory in every row: pad as little as possible";
    }
    CHECK_MESSAGE(false, why.str());
    if (yours == 0) break;
  }
}

TEST_CASE("lesson 03: a column of a 32 x 32 float tile: 32-way at stride 32, one pass at your padded stride") {
  const int padded = lesson::conflict_free_stride(32);
  const int unpadded_degree = lesson::bank_conflict_degree(strided(3, 32));
  const int padded_degree = lesson::bank_conflict_degree(strided(3, padded));
  CHECK_MESSAGE(unpadded_degree == 32,
                "column 3 of a (32, 32) tile stored at stride 32: your bank_conflict_degree says "
                    << unpadded_degree << ", expected 32 (words 3, 35, 67, ... all in bank 3)");
  CHECK_MESSAGE(padded_degree == 1, "column 3 of a (32, 32) tile stored at your stride "
                                        << padded << ": your bank_conflict_degree says " << padded_degree
                                        << ", expected 1 (with stride 33, row i's word is in bank (i + 3) % 32)");
}
