#pragma once
// Lesson 07: the register layouts of one tensor-core instruction, mma.sync.m16n8k16, and the trick
// that keeps P in registers between the two matmuls of attention. Everything here runs on the CPU:
// a "warp" is 32 lanes, each holding a few numbers, exactly as the registers of src/cuda/fa2_*.cu
// hold them on the GPU. You write these functions in exercise.cpp; solution.cpp is ours; test.cpp
// checks yours against the layout the cuda-fa2 kernel uses (verified on an H100 by gpu_fa2_tests).
//
// Notation: lane = 4 g + t, so g = lane / 4 (the "group", 0..7) and t = lane % 4 (0..3).
// The instruction computes D (16 x 8, fp32) = A (16 x 16, fp16/bf16) * B (16 x 8) + C (16 x 8).
#include <array>

namespace flashlab::lesson07 {

struct RowCol {
  int row = -1, col = -1;
  bool operator==(const RowCol&) const = default;
};

// The C (and D) fragment: each lane holds 4 fp32 values c[0..3] of the 16 x 8 tile.
// Returns the (row, col) of c[i], i in [0, 4).
RowCol c_element(int lane, int i);

// The A fragment: each lane holds 8 16-bit values a[0..7] (4 registers of 2 halves; a[2r] is the low
// half of register r) of the 16 x 16 tile. Returns the (row, col) of a[i], i in [0, 8).
RowCol a_element(int lane, int i);

// The B fragment: each lane holds 4 16-bit values b[0..3] (2 registers) of the 16 x 8 tile, indexed
// (k, n): returns {row = k, col = n} of b[i], i in [0, 4).
RowCol b_element(int lane, int i);

// P kept in registers. After S = Q K^T, a warp holds a 16 x 16 block of S as the C fragments of two
// neighbouring 8-column n-tiles (c_lo: columns 0..7, c_hi: columns 8..15). O += P V needs that block
// as an A fragment. Fill `a` (this lane's 8 values) from this lane's own c_lo and c_hi: no value
// moves between lanes, which is why P never goes through shared memory.
void pack_a_from_c(const std::array<float, 4>& c_lo, const std::array<float, 4>& c_hi, std::array<float, 8>& a);

// A whole warp's operands: value [lane][i] is element i of that lane's fragment.
using WarpA = std::array<std::array<float, 8>, 32>;
using WarpB = std::array<std::array<float, 4>, 32>;
using WarpC = std::array<std::array<float, 4>, 32>;

// The instruction itself, emulated: D = A B + C on fragments distributed over the 32 lanes by the
// three maps above; the result replaces c. (On the GPU one instruction does this; here it shows that
// the maps together describe a matrix product.)
void warp_mma(const WarpA& a, const WarpB& b, WarpC& c);

}  // namespace flashlab::lesson07
