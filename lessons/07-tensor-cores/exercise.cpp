// Lesson 07, exercise: the fragment layouts of mma.sync.m16n8k16 and P kept in registers.
//
// Fill in the five TODOs (README.md draws the layouts), then build and test YOUR file:
//   cmake -S . -B build -DFLASHLAB_LESSON_SOLUTIONS=OFF
//   cmake --build build --target lesson07_tensor_cores
//   ctest --test-dir build -L lesson -R 07 --output-on-failure
// lane = 4 g + t: g = lane / 4 picks the row (and g + 8), t = lane % 4 picks a pair of columns.
// Delete each `(void)x;` line once your code uses x (it only silences "unused" warnings).
#include "lesson.hpp"

namespace flashlab::lesson07 {

RowCol c_element(int lane, int i) {
  // TODO 1 (about 2 lines): c[0], c[1] sit in row g, columns 2t and 2t + 1; c[2], c[3] in row g + 8,
  // the same columns.
  (void)lane;
  (void)i;
  return {};
}

RowCol a_element(int lane, int i) {
  // TODO 2 (about 3 lines): register r = i / 2 holds two neighbouring columns (i % 2 picks which).
  //   r = 0: row g,     columns 2t, 2t + 1        r = 1: row g + 8, the same columns
  //   r = 2: row g,     columns 2t + 8, 2t + 9    r = 3: row g + 8, the same columns
  (void)lane;
  (void)i;
  return {};
}

RowCol b_element(int lane, int i) {
  // TODO 3 (about 2 lines): B is indexed (k, n); every value of a lane is in column n = g.
  //   register 0 holds k = 2t, 2t + 1; register 1 holds k = 2t + 8, 2t + 9.
  (void)lane;
  (void)i;
  return {};
}

void pack_a_from_c(const std::array<float, 4>& c_lo, const std::array<float, 4>& c_hi, std::array<float, 8>& a) {
  // TODO 4 (about 1 line): compare where c_element puts c_lo[i] (columns 0..7) and c_hi[i] (columns
  // 8..15 of the 16 x 16 block) with where a_element wants a[i]. Which lane holds what?
  (void)c_lo;
  (void)c_hi;
  (void)a;
}

void warp_mma(const WarpA& a, const WarpB& b, WarpC& c) {
  // TODO 5 (about 10 lines): gather the three operands into plain matrices A (16 x 16), B (16 x 8)
  // and D (16 x 8, starting as C) with a_element, b_element and c_element; D += A B; scatter D back
  // into c with c_element.
  (void)a;
  (void)b;
  (void)c;
}

}  // namespace flashlab::lesson07
