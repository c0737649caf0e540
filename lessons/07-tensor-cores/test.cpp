// Lesson 07's test: your fragment maps, pack_a_from_c and warp_mma (lesson.hpp) against the layouts
// of mma.sync.m16n8k16 that the cuda-fa2 kernel uses (src/cuda/fa2_mma.cuh; the kernel passes
// gpu_fa2_tests on an H100, so these layouts are the hardware's). A failure names the lane and the
// element that is wrong.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "lesson.hpp"

using namespace flashlab::lesson07;

namespace {

// The reference layouts, as written in src/cuda/fa2_mma.cuh (lane = 4 g + t):
//   A regs a0..a3 hold (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B regs b0, b1 hold (k 2t..2t+1, col g), (k 2t+8.., col g)
//   C c0..c3      hold (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1)
RowCol ref_a(int lane, int i) {
  const int g = lane / 4, t = lane % 4, reg = i / 2, half = i % 2;
  static constexpr int kRowOffset[4] = {0, 8, 0, 8}, kColOffset[4] = {0, 0, 8, 8};
  return {g + kRowOffset[reg], 2 * t + kColOffset[reg] + half};
}
RowCol ref_b(int lane, int i) {
  const int g = lane / 4, t = lane % 4, reg = i / 2, half = i % 2;
  return {2 * t + (reg ? 8 : 0) + half, g};
}
RowCol ref_c(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {i < 2 ? g : g + 8, 2 * t + (i & 1)};
}

template <class Yours, class Ref>
void check_map(const char* name, int per_lane, int rows, int cols, Yours yours, Ref ref) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < per_lane; ++i) {
      const RowCol got = yours(lane, i), want = ref(lane, i);
      INFO(name << ": lane " << lane << " (g = " << lane / 4 << ", t = " << lane % 4 << "), element " << i
                << ": you said (row " << got.row << ", col " << got.col << "), the tensor core uses (row "
                << want.row << ", col " << want.col << ")");
      CHECK(got == want);
      if (got.row >= 0 && got.row < rows && got.col >= 0 && got.col < cols) seen.insert({got.row, got.col});
    }
  INFO(name << ": the 32 lanes together must hold every element of the " << rows << " x " << cols
            << " tile exactly once; yours cover " << seen.size());
  CHECK(static_cast<int>(seen.size()) == rows * cols);
}

std::mt19937 rng(std::random_device{}());
float random_value() { return std::uniform_real_distribution<float>(-1.f, 1.f)(rng); }

}  // namespace

TEST_CASE("lesson 07: the C fragment layout (16 x 8 fp32 accumulator)") {
  check_map("c_element", 4, 16, 8, c_element, ref_c);
}

TEST_CASE("lesson 07: the A fragment layout (16 x 16, row major)") {
  check_map("a_element", 8, 16, 16, a_element, ref_a);
}

TEST_CASE("lesson 07: the B fragment layout (16 x 8, indexed (k, n))") {
  check_map("b_element", 4, 16, 8, b_element, ref_b);
}

TEST_CASE("lesson 07: the C fragments of S are the A fragment of P, lane by lane") {
  // A random 16 x 16 block of P, held as the C fragments of its two 8-column n-tiles.
  float P[16][16];
  for (auto& row : P)
    for (float& x : row) x = random_value();
  for (int lane = 0; lane < 32; ++lane) {
    std::array<float, 4> c_lo{}, c_hi{};
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = ref_c(lane, i);
      c_lo[i] = P[rc.row][rc.col];
      c_hi[i] = P[rc.row][rc.col + 8];
    }
    std::array<float, 8> a;
    a.fill(NAN);
    pack_a_from_c(c_lo, c_hi, a);
    for (int i = 0; i < 8; ++i) {
      const RowCol rc = ref_a(lane, i);
      INFO("lane " << lane << ": a[" << i << "] must be P[" << rc.row << "][" << rc.col << "] = " << P[rc.row][rc.col]
                   << ", you packed " << a[i]);
      CHECK(a[i] == P[rc.row][rc.col]);
    }
  }
}

TEST_CASE("lesson 07: warp_mma computes D = A B + C on distributed fragments") {
  float A[16][16], B[16][8], C[16][8];
  WarpA a{};
  WarpB b{};
  WarpC c{};
  for (auto& row : A)
    for (float& x : row) x = random_value();
  for (auto& row : B)
    for (float& x : row) x = random_value();
  for (auto& row : C)
    for (float& x : row) x = random_value();
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) a[lane][i] = A[ref_a(lane, i).row][ref_a(lane, i).col];
    for (int i = 0; i < 4; ++i) b[lane][i] = B[ref_b(lane, i).row][ref_b(lane, i).col];
    for (int i = 0; i < 4; ++i) c[lane][i] = C[ref_c(lane, i).row][ref_c(lane, i).col];
  }
  warp_mma(a, b, c);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const RowCol rc = ref_c(lane, i);
      double want = C[rc.row][rc.col];
      for (int k = 0; k < 16; ++k) want += double(A[rc.row][k]) * B[k][rc.col];
      INFO("lane " << lane << ", c[" << i << "] = D[" << rc.row << "][" << rc.col << "]: want " << want << ", got "
                   << c[lane][i]);
      CHECK(std::abs(c[lane][i] - want) <= 1e-5 * (1.0 + std::abs(want)));
    }
}
