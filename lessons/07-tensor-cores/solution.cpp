// Lesson 07, reference solution (see exercise.cpp for the guided version).
#include "lesson.hpp"

namespace flashlab::lesson07 {

RowCol c_element(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (i / 2), 2 * t + i % 2};  // c0, c1: row g; c2, c3: row g + 8
}

RowCol a_element(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  const int reg = i / 2;  // a0: (g, 2t..), a1: (g + 8, 2t..), a2: (g, 2t + 8..), a3: (g + 8, 2t + 8..)
  return {g + 8 * (reg % 2), 2 * t + 8 * (reg / 2) + i % 2};
}

RowCol b_element(int lane, int i) {
  const int g = lane / 4, t = lane % 4;
  const int reg = i / 2;  // b0: k = 2t, 2t + 1; b1: k = 2t + 8, 2t + 9; always column n = g
  return {2 * t + 8 * reg + i % 2, g};
}

void pack_a_from_c(const std::array<float, 4>& c_lo, const std::array<float, 4>& c_hi, std::array<float, 8>& a) {
  a = {c_lo[0], c_lo[1], c_lo[2], c_lo[3], c_hi[0], c_hi[1], c_hi[2], c_hi[3]};
}

void warp_mma(const WarpA& a, const WarpB& b, WarpC& c) {
  float A[16][16], B[16][8], D[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 8; ++i) A[a_element(lane, i).row][a_element(lane, i).col] = a[lane][i];
    for (int i = 0; i < 4; ++i) B[b_element(lane, i).row][b_element(lane, i).col] = b[lane][i];
    for (int i = 0; i < 4; ++i) D[c_element(lane, i).row][c_element(lane, i).col] = c[lane][i];
  }
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) D[m][n] += A[m][k] * B[k][n];
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) c[lane][i] = D[c_element(lane, i).row][c_element(lane, i).col];
}

}  // namespace flashlab::lesson07
