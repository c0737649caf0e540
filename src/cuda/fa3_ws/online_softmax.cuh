#pragma once
// cuda-fa3-ws forward, its online softmax: the running row max m_i and sum l_i of one consumer thread's two
// rows, P_ij from S_ij, the rescale of O_i when a max moves, and L_i at the end.
#include <cmath>
#include <utility>

#include "core/exp2_poly.hpp"
#include "cuda/fa3_ws/forward_config.cuh"
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {


// The online softmax of one consumer thread's two rows (r = 16 warp + lane / 4 and r + 8 of its
// warpgroup's 64). A wgmma accumulator of 64 x N holds, per thread, d[4i + {0,1}] at row r, columns
// 8i + 2 (lane % 4) + {0,1}, and d[4i + {2,3}] at row r + 8: the four lanes of a quad share a row.
// kE4m3P: P_ij is rounded to e4m3 (the FP8 forward), which needs P_ij <= 1 for its fixed scale: the max never lags
// (kMaxLag 0), and P_ij comes out already times kE4m3PScale, folded into the exponent. l_i sums the scaled P_ij, so
// the scale cancels in O_i = (sum 448 P V) / (sum 448 P); only L_i takes log2(448) back out.
// kPolyEvery: FlashAttention-4's split of the exponentials between two units. The MUFU computes 16 exp2 a clock per SM,
// and FP8's GEMMs are fast enough for that to set the pace at d = 128; so in every kPolyEvery-th group of 8 columns
// (accumulator n-tile i with i % kPolyEvery == kPolyEvery - 1) exp2 runs on the FMA and integer pipes instead
// (core/exp2_poly.hpp). Its degree follows what P is rounded to: 2 for e4m3 (relative error 2.0e-3 beside e4m3's
// 2^-4), 3 for 16-bit P. 0: every exponential on the MUFU.
// kLazyRescale: FlashAttention-4's conditional rescaling, for 16-bit P: the max a row exponentiates against may lag
// its running max by up to kMaxLag, so O_i is rescaled only when the max rises by more. Off: whenever it rises.
// kTreeReductions: the row max and the row sum as balanced trees instead of one chain each. One warp per scheduler
// runs a consumer's softmax while the other consumer's GEMMs run, so the softmax is paced by its longest dependent
// chain more than by its instruction count: a chain of kN / 4 maxima or adds costs about 4 cycles a link, a tree
// log2 of that. Where it pays depends on the head dim and the type (forward_config.cuh says where it is on).
template <int kCols, bool kE4m3P = false, int kPolyEvery = 0, bool kLazyRescale = true, bool kTreeReductions = false>
struct OnlineSoftmax {
  static constexpr int kN = kCols / 2;  // accumulator floats per thread
  float m[2];  // m_i: running max of scale * S_ij, in log2 units
  float l[2];  // l_i: this thread's part of the running row sum (quad-summed in finalize)

  __device__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.f;
  }

  // The max a row exponentiates against may lag its true running max by up to this much (log2 units: P
  // entries up to 2^8 = 256, far inside fp32 sums and fp16 / bf16 P): O_i and l_i need rescaling only when
  // some row's max rises by more, which on most rows happens only in the first block or two.
  static constexpr float kMaxLag = kE4m3P || !kLazyRescale ? 0.f : 8.f;
  // The FP8 forward's P scale, 448 = e4m3's largest finite value, and its log2.
  static constexpr float kE4m3PScale = 448.f;
  static constexpr float kLog2E4m3PScale = 8.807354922057604f;
  static constexpr int kPolyDegree = kE4m3P ? 2 : 3;
  // exp2 of column group i (n-tile i): on the MUFU, or by the polynomial for every kPolyEvery-th group.
  template <int i>
  __device__ static float exp2_of_group(float x) {
    constexpr bool kPoly = kPolyEvery > 0 && i % (kPolyEvery > 0 ? kPolyEvery : 1) == kPolyEvery - 1;
    if constexpr (kPoly) return exp2_poly<kPolyDegree>(x);
    else return fast_exp2(x);
  }

  // S_ij (raw, masked entries = mask_val) -> unnormalized P_ij = exp2(scale_log2 S - m_i) in place; m_i,
  // l_i updated; corr = exp2(m_old - m_new), the factor O_i must be rescaled by (1 for a row whose m_i did
  // not move). m_i moves only when the block's scaled max exceeds it by more than kMaxLag (or it was -inf).
  // Returns whether O_i needs the rescale: some row of this warp has corr != 1 (the same answer in every
  // lane, so the branch on it does not diverge). The scale is folded into one FFMA per element. For a
  // negative scale the row's largest scaled score is its smallest raw one (mask_val is +inf then).
  __device__ bool online_softmax(float (&s)[kN], float scale_log2, float (&corr)[2]) {
    if constexpr (kTreeReductions) return online_softmax_trees(s, scale_log2, corr);
    const bool positive = scale_log2 >= 0.f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float raw = s[2 * hf];
      if (positive) {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) raw = fmaxf(raw, fmaxf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raw = fmaxf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      } else {
#pragma unroll
        for (int i = 0; i < kN / 4; ++i) raw = fminf(raw, fminf(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]));
        raw = fminf(raw, __shfl_xor_sync(0xffffffffu, raw, 1));
        raw = fminf(raw, __shfl_xor_sync(0xffffffffu, raw, 2));
      }
      float sum = 0.f;
      const float offset = move_max(hf, raw, positive, scale_log2, corr);
      [&]<int... i>(std::integer_sequence<int, i...>) {
        ((s[4 * i + 2 * hf] = exp2_of_group<i>(fmaf(s[4 * i + 2 * hf], scale_log2, offset)),
          s[4 * i + 2 * hf + 1] = exp2_of_group<i>(fmaf(s[4 * i + 2 * hf + 1], scale_log2, offset)),
          sum += s[4 * i + 2 * hf] + s[4 * i + 2 * hf + 1]),
         ...);
      }(std::make_integer_sequence<int, kN / 4>{});
      l[hf] = l[hf] * corr[hf] + sum;
    }
    return __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f);
  }

  // The same with kTreeReductions: the row max and the row sum as balanced trees (log2(kN / 2) deep, not kN / 4),
  // the thread's two rows side by side, every exponential before the sums.
  __device__ bool online_softmax_trees(float (&s)[kN], float scale_log2, float (&corr)[2]) {
    const bool positive = scale_log2 >= 0.f;
    float raw[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) raw[hf] = positive ? row_reduce<Max>(s, hf) : row_reduce<Min>(s, hf);
#pragma unroll
    for (int lanes = 1; lanes <= 2; lanes *= 2)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float other = __shfl_xor_sync(0xffffffffu, raw[hf], lanes);
        raw[hf] = positive ? fmaxf(raw[hf], other) : fminf(raw[hf], other);
      }
    float offset[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) offset[hf] = move_max(hf, raw[hf], positive, scale_log2, corr);
    [&]<int... i>(std::integer_sequence<int, i...>) {
      ((s[4 * i] = exp2_of_group<i>(fmaf(s[4 * i], scale_log2, offset[0])),
        s[4 * i + 1] = exp2_of_group<i>(fmaf(s[4 * i + 1], scale_log2, offset[0])),
        s[4 * i + 2] = exp2_of_group<i>(fmaf(s[4 * i + 2], scale_log2, offset[1])),
        s[4 * i + 3] = exp2_of_group<i>(fmaf(s[4 * i + 3], scale_log2, offset[1]))),
       ...);
    }(std::make_integer_sequence<int, kN / 4>{});
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) l[hf] = l[hf] * corr[hf] + row_reduce<Sum>(s, hf);
    return __any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f);
  }

  // Row hf's block max (raw: its extreme raw score, quad-reduced) against m_i: m_i and corr[hf] updated; returns the
  // offset of its exponentials, exp2(scale_log2 S + offset) = P (times the P scale for e4m3).
  __device__ float move_max(int hf, float raw, bool positive, float scale_log2, float (&corr)[2]) {
    const bool all_masked = positive ? raw == -INFINITY : raw == INFINITY;
    const float block_max = all_masked ? -INFINITY : raw * scale_log2;
    const bool moves = block_max > m[hf] + kMaxLag;  // -inf + kMaxLag = -inf: the first visible key moves it
    const float m_new = moves ? block_max : m[hf];
    // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so exp2 gives 0, not NaN.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    corr[hf] = moves ? fast_exp2(m[hf] - m_use) : 1.f;
    m[hf] = m_new;
    return kE4m3P ? kLog2E4m3PScale - m_use : -m_use;  // exp2(x - m) times the P scale
  }

  // Row hf's kN / 2 values of this thread (s[4 i + 2 hf] and s[4 i + 2 hf + 1]) reduced by Op as a balanced tree.
  struct Max {
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
  };
  struct Min {
    __device__ static float apply(float a, float b) { return fminf(a, b); }
  };
  struct Sum {
    __device__ static float apply(float a, float b) { return a + b; }
  };
  template <class Op>
  __device__ static float row_reduce(const float (&s)[kN], int hf) {
    float v[kN / 4];
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) v[i] = Op::apply(s[4 * i + 2 * hf], s[4 * i + 2 * hf + 1]);
    return tree<Op, kN / 4>(v);
  }
  // v[0] op ... op v[kLen - 1]: pairs (i, i + ceil(kLen / 2)) first, then the same on the first half.
  template <class Op, int kLen>
  __device__ static float tree(float* v) {
    if constexpr (kLen == 1) {
      return v[0];
    } else {
      constexpr int kHalf = (kLen + 1) / 2;
#pragma unroll
      for (int i = 0; i < kLen / 2; ++i) v[i] = Op::apply(v[i], v[i + kHalf]);
      return tree<Op, kHalf>(v);
    }
  }

  // O_i = diag(corr) O_i (D/2 FMULs per thread), when online_softmax says some row of the warp needs it.
  // Done unconditionally it was the largest non-GEMM cost per K/V block at d = 256 (128 FMULs against 32
  // exponentials), and the branch sits after the P V wait, not between the softmax and a GEMM issue.
  template <int kOut>
  __device__ static void rescale(float (&o)[kOut], const float (&corr)[2]) {
#pragma unroll
    for (int i = 0; i < kOut / 4; ++i) {
      o[4 * i] *= corr[0];
      o[4 * i + 1] *= corr[0];
      o[4 * i + 2] *= corr[1];
      o[4 * i + 3] *= corr[1];
    }
  }

  // 1 / l_i (0 for a row that saw no key: O = 0) and L_i = (m_i + log2 l_i) ln 2 (-inf for such a row).
  __device__ void finalize(float (&inv_l)[2], float (&lse)[2]) const {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv_l[hf] = sum > 0.f ? 1.f / sum : 0.f;
      if constexpr (kE4m3P) lse[hf] = sum > 0.f ? (m[hf] + (log2f(sum) - kLog2E4m3PScale)) * kLn2 : -INFINITY;
      else lse[hf] = sum > 0.f ? (m[hf] + log2f(sum)) * kLn2 : -INFINITY;
    }
  }
};

}  // namespace flashlab::cuda::fa3_ws
