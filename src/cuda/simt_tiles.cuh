#pragma once
// What cuda-fa1 and cuda-fa2-simt share, so that the only difference between them is the loop order
// (lesson 05): the problem as kernels see it (AttnParams), moving tiles between HBM and shared memory,
// and the fp32 tile matmuls on CUDA cores, each thread computing a small register tile.
//
// Forward tiles (Br = Bc = 64, 128 threads as a 16 x 8 grid (ty, tx)):
//   S_ij = Q_i K_j^T: thread owns rows ty + 16a (a < 4) and columns tx + 8b (b < 8) of the (Br, Bc)
//   tile: 32 accumulators, every Q/K shared-memory read a 16-byte float4 reused 4-8 times.
//   O_i += P_ij V_j: thread owns rows ty + 16a and columns 32q + 4tx + e (q < D/32, e < 4).
//   The 8 threads sharing a row are 8 consecutive lanes of one warp, so row max / row sum are three
//   warp shuffles (no shared memory, no barrier).
// Backward tiles (Br = Bc = 64, 256 threads as a 16 x 16 grid): every (64, 64) or (64, D) product is
// split as rows ty + 16a, columns tx + 16c; scalar reads from rows padded to an odd stride.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/host_passes.cuh"
#include "cuda/tilings.hpp"  // padded_head_dim

namespace flashlab::cuda {

constexpr float kLog2e = 1.4426950408889634f;  // exp(x) = exp2(x * log2 e): exp2 is one MUFU op
constexpr float kLn2 = 0.6931471805599453f;

// The problem as the kernels see it. Tensors are (B, S, H, D) row-major, LSE (B, H_q, S_q).
struct AttnParams {
  int batch, heads_q, heads_kv, seq_q, seq_k, head_dim;
  int group;  // heads_q / heads_kv: query head h reads key/value head h / group
  CausalAlign causal;
  float scale;          // softmax scale
  float scale_log2;     // scale * log2(e): scores in base-2 units
  bool dropout;         // dropout_p > 0
  float keep_scale;     // 1 / (1 - p): kept elements of P are scaled by it
  std::uint32_t drop_threshold;
  std::uint64_t seed;

  // Strides of (B, S, H, D) tensors, in elements.
  __host__ __device__ long long q_row() const { return (long long)heads_q * head_dim; }
  __host__ __device__ long long kv_row() const { return (long long)heads_kv * head_dim; }
  __host__ __device__ long long q_offset(int b, int s, int h) const {
    return ((long long)b * seq_q + s) * q_row() + (long long)h * head_dim;
  }
  __host__ __device__ long long kv_offset(int b, int s, int h) const {
    return ((long long)b * seq_k + s) * kv_row() + (long long)h * head_dim;
  }
  __host__ __device__ long long lse_offset(int b, int h, int s) const {
    return ((long long)b * heads_q + h) * seq_q + s;
  }
  __host__ __device__ std::size_t q_numel() const { return (std::size_t)batch * seq_q * q_row(); }
  __host__ __device__ std::size_t kv_numel() const { return (std::size_t)batch * seq_k * kv_row(); }
  __host__ __device__ std::size_t lse_numel() const { return (std::size_t)batch * heads_q * seq_q; }
};

inline AttnParams make_params(const Problem& p) {
  AttnParams a{};
  set_extents(a, p.shape);
  a.group = p.shape.group();
  a.causal = p.options.causal;
  a.scale = static_cast<float>(p.softmax_scale());
  a.scale_log2 = a.scale * kLog2e;
  a.dropout = p.options.dropout_p > 0;
  a.keep_scale = static_cast<float>(1.0 / (1.0 - p.options.dropout_p));
  a.drop_threshold = dropout_threshold(p.options.dropout_p);
  a.seed = p.options.seed;
  return a;
}

// The factor an element of P is multiplied by in P V: 1/(1-p) when kept, 0 when dropped, 1 without
// dropout (core/philox.hpp decides, so every variant drops the same elements).
__device__ __forceinline__ float dropout_factor(const AttnParams& p, int b, int h, int row, int col) {
  if (!p.dropout) return 1.0f;
  return dropout_keep(p.seed, p.drop_threshold, b, h, row, col) ? p.keep_scale : 0.0f;
}

// Does the (row0.., col0..col0+cols) tile need the element mask (causal edge or past seq_k)?
__device__ __forceinline__ bool tile_needs_any_mask(const AttnParams& p, int row0, int col0, int cols) {
  return col0 + cols > p.seq_k || (p.causal != CausalAlign::None &&
                                   tile_needs_mask(p.causal, row0, col0 + cols, p.seq_q, p.seq_k));
}
__device__ __forceinline__ bool element_masked(const AttnParams& p, int row, int col) {
  return col >= p.seq_k || is_masked(p.causal, row, col, p.seq_q, p.seq_k);
}

// Copy `rows` rows of a (B, S, H, d) tensor (first row `row0`, row stride `ld` elements, starting at
// `src`) into a shared (Rows, D) tile with row stride LD, multiplied by `mul`. Rows past `valid_rows`
// and columns past d are zero, so padded rows and columns add nothing to any product.
template <int Rows, int D, int LD, int Threads>
__device__ __forceinline__ void load_tile(float* tile, const float* __restrict__ src, long long ld, int valid_rows,
                                          int d, float mul = 1.0f) {
  const int tid = threadIdx.x;
  if (d % 4 == 0 && LD % 4 == 0) {
    // 16-byte loads: rows start 16-byte aligned because d % 4 == 0.
    constexpr int kVecPerRow = D / 4;
    for (int idx = tid; idx < Rows * kVecPerRow; idx += Threads) {
      const int r = idx / kVecPerRow, c = (idx % kVecPerRow) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < valid_rows && c < d) v = __ldg(reinterpret_cast<const float4*>(src + r * ld + c));
      v.x *= mul, v.y *= mul, v.z *= mul, v.w *= mul;
      *reinterpret_cast<float4*>(tile + r * LD + c) = v;
    }
  } else {
    for (int idx = tid; idx < Rows * D; idx += Threads) {
      const int r = idx / D, c = idx % D;
      tile[r * LD + c] = (r < valid_rows && c < d) ? __ldg(src + r * ld + c) * mul : 0.0f;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward tiles.

constexpr int kFwdBr = 64, kFwdBc = 64, kFwdThreads = 128;
constexpr int kFwdRows = 4;  // rows per thread: ty + 16a
constexpr int kFwdCols = 8;  // S columns per thread: tx + 8b

template <int D>
struct FwdLayout {
  static_assert(D % 32 == 0 && D <= 128, "forward tiles need D a multiple of 32, at most 128");
  static constexpr int kLd = D + 4;         // Q, K, V row stride: float4-aligned, rows spread over banks
  static constexpr int kLdP = kFwdBc + 8;   // P row stride: a warp's P stores hit 32 distinct banks
  static constexpr int kOCols = D / 8;      // O columns per thread
  static constexpr std::size_t kFloats = 3 * kFwdBr * kLd + kFwdBr * kLdP;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
};

// s = Q_i K_j^T for this thread's 4 x 8 elements. q: (Br, D), k: (Bc, D), both row stride kLd.
template <int D>
__device__ __forceinline__ void score_tile(const float* q, const float* k, int ty, int tx,
                                           float (&s)[kFwdRows][kFwdCols]) {
  constexpr int kLd = FwdLayout<D>::kLd;
#pragma unroll
  for (int a = 0; a < kFwdRows; ++a)
#pragma unroll
    for (int b = 0; b < kFwdCols; ++b) s[a][b] = 0.0f;
#pragma unroll 2
  for (int kk = 0; kk < D; kk += 4) {
    float4 qv[kFwdRows], kv[kFwdCols];
#pragma unroll
    for (int a = 0; a < kFwdRows; ++a) qv[a] = *reinterpret_cast<const float4*>(q + (ty + 16 * a) * kLd + kk);
#pragma unroll
    for (int b = 0; b < kFwdCols; ++b) kv[b] = *reinterpret_cast<const float4*>(k + (tx + 8 * b) * kLd + kk);
#pragma unroll
    for (int a = 0; a < kFwdRows; ++a)
#pragma unroll
      for (int b = 0; b < kFwdCols; ++b) {
        s[a][b] = fmaf(qv[a].x, kv[b].x, s[a][b]);
        s[a][b] = fmaf(qv[a].y, kv[b].y, s[a][b]);
        s[a][b] = fmaf(qv[a].z, kv[b].z, s[a][b]);
        s[a][b] = fmaf(qv[a].w, kv[b].w, s[a][b]);
      }
  }
}

// o += P_ij V_j for this thread's 4 rows x D/8 columns. p: (Br, Bc) stride kLdP; v: (Bc, D) stride kLd.
template <int D>
__device__ __forceinline__ void pv_accumulate(const float* p, const float* v, int ty, int tx,
                                              float (&o)[kFwdRows][FwdLayout<D>::kOCols]) {
  constexpr int kLd = FwdLayout<D>::kLd, kLdP = FwdLayout<D>::kLdP;
#pragma unroll 2
  for (int c = 0; c < kFwdBc; c += 4) {
    float4 pv[kFwdRows];
#pragma unroll
    for (int a = 0; a < kFwdRows; ++a) pv[a] = *reinterpret_cast<const float4*>(p + (ty + 16 * a) * kLdP + c);
#pragma unroll
    for (int cc = 0; cc < 4; ++cc) {
#pragma unroll
      for (int q4 = 0; q4 < D / 32; ++q4) {
        const float4 vv = *reinterpret_cast<const float4*>(v + (c + cc) * kLd + 32 * q4 + 4 * tx);
#pragma unroll
        for (int a = 0; a < kFwdRows; ++a) {
          const float pa = cc == 0 ? pv[a].x : cc == 1 ? pv[a].y : cc == 2 ? pv[a].z : pv[a].w;
          o[a][4 * q4 + 0] = fmaf(pa, vv.x, o[a][4 * q4 + 0]);
          o[a][4 * q4 + 1] = fmaf(pa, vv.y, o[a][4 * q4 + 1]);
          o[a][4 * q4 + 2] = fmaf(pa, vv.z, o[a][4 * q4 + 2]);
          o[a][4 * q4 + 3] = fmaf(pa, vv.w, o[a][4 * q4 + 3]);
        }
      }
    }
  }
}

// Max / sum over the 8 lanes (tx = lane % 8) that share a row.
__device__ __forceinline__ float row_max8(float x) {
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float row_sum8(float x) {
#pragma unroll
  for (int off = 1; off < 8; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Scores of masked elements (causal, or past seq_k) become -inf. Scores are already in base-2 units.
__device__ __forceinline__ void mask_scores(const AttnParams& p, int row0, int col0, int ty, int tx,
                                            float (&s)[kFwdRows][kFwdCols]) {
#pragma unroll
  for (int a = 0; a < kFwdRows; ++a)
#pragma unroll
    for (int b = 0; b < kFwdCols; ++b)
      if (element_masked(p, row0 + ty + 16 * a, col0 + tx + 8 * b)) s[a][b] = -INFINITY;
}

// A running max that is -inf (the row has seen no key yet) is used as 0, so exp2(-inf - 0) = 0 instead
// of exp2(-inf + inf) = NaN.
__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.0f : m; }

// ---------------------------------------------------------------------------------------------
// Backward tiles.

constexpr int kBwdBr = 64, kBwdBc = 64, kBwdThreads = 256;
constexpr int kBwdRows = 4;  // rows per thread: ty + 16a
constexpr int kBwdCols = 4;  // columns per thread of a (64, 64) tile: tx + 16c

template <int D>
struct BwdLayout {
  static_assert(D % 16 == 0 && D <= 128, "backward tiles need D a multiple of 16, at most 128");
  static constexpr int kLd = D + 1;         // odd stride: 16 lanes reading 16 rows hit 16 banks
  static constexpr int kLdP = kBwdBc + 1;
  static constexpr int kDCols = D / 16;     // columns per thread of a (64, D) tile
  // Q_i, dO_i, K_j, V_j tiles; P_ij (dropped) and dS_ij; L_i and D_i.
  static constexpr std::size_t kFloats = 2 * kBwdBr * kLd + 2 * kBwdBc * kLd + 2 * kBwdBr * kLdP + 2 * kBwdBr;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
};

// out[a][c] = sum_k A[ty+16a][k] * B[tx+16c][k]: A B^T of two (64, D) tiles (S = Q K^T, dP = dO V^T).
template <int D>
__device__ __forceinline__ void tile_abt(const float* A, const float* B, int ty, int tx,
                                         float (&out)[kBwdRows][kBwdCols]) {
  constexpr int kLd = BwdLayout<D>::kLd;
#pragma unroll
  for (int a = 0; a < kBwdRows; ++a)
#pragma unroll
    for (int c = 0; c < kBwdCols; ++c) out[a][c] = 0.0f;
#pragma unroll 4
  for (int k = 0; k < D; ++k) {
    float av[kBwdRows], bv[kBwdCols];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a) av[a] = A[(ty + 16 * a) * kLd + k];
#pragma unroll
    for (int c = 0; c < kBwdCols; ++c) bv[c] = B[(tx + 16 * c) * kLd + k];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a)
#pragma unroll
      for (int c = 0; c < kBwdCols; ++c) out[a][c] = fmaf(av[a], bv[c], out[a][c]);
  }
}

// acc[a][c] += sum_r P[r][ty+16a] * X[r][tx+16c]: P^T X with P (64, 64) and X (64, D)
// (dV += P^T dO, dK += dS^T Q).
template <int D>
__device__ __forceinline__ void tile_atb_acc(const float* P, const float* X, int ty, int tx,
                                             float (&acc)[kBwdRows][BwdLayout<D>::kDCols]) {
  constexpr int kLd = BwdLayout<D>::kLd, kLdP = BwdLayout<D>::kLdP;
#pragma unroll 4
  for (int r = 0; r < kBwdBr; ++r) {
    float pv[kBwdRows], xv[BwdLayout<D>::kDCols];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a) pv[a] = P[r * kLdP + ty + 16 * a];
#pragma unroll
    for (int c = 0; c < BwdLayout<D>::kDCols; ++c) xv[c] = X[r * kLd + tx + 16 * c];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a)
#pragma unroll
      for (int c = 0; c < BwdLayout<D>::kDCols; ++c) acc[a][c] = fmaf(pv[a], xv[c], acc[a][c]);
  }
}

// acc[a][c] = sum_k dS[ty+16a][k] * K[k][tx+16c]: dS K with dS (64, 64) and K (64, D) (dQ_i's share).
template <int D>
__device__ __forceinline__ void tile_ab(const float* dS, const float* K, int ty, int tx,
                                        float (&acc)[kBwdRows][BwdLayout<D>::kDCols]) {
  constexpr int kLd = BwdLayout<D>::kLd, kLdP = BwdLayout<D>::kLdP;
#pragma unroll
  for (int a = 0; a < kBwdRows; ++a)
#pragma unroll
    for (int c = 0; c < BwdLayout<D>::kDCols; ++c) acc[a][c] = 0.0f;
#pragma unroll 4
  for (int k = 0; k < kBwdBc; ++k) {
    float sv[kBwdRows], kv[BwdLayout<D>::kDCols];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a) sv[a] = dS[(ty + 16 * a) * kLdP + k];
#pragma unroll
    for (int c = 0; c < BwdLayout<D>::kDCols; ++c) kv[c] = K[k * kLd + tx + 16 * c];
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a)
#pragma unroll
      for (int c = 0; c < BwdLayout<D>::kDCols; ++c) acc[a][c] = fmaf(sv[a], kv[c], acc[a][c]);
  }
}

// The part of one backward step both loop orders share. With Q_i, dO_i, L_i (base 2; +inf for padded
// rows), D_i, K_j, V_j in shared memory, compute for this thread's elements
//   P_ij = exp2(S_ij - L_i)            (recomputed: S and P were never stored)
//   dP_ij = (dO_i V_j^T) * Z / (1 - p)  (Z the dropout mask)
//   dS_ij = P_ij * (dP_ij - D_i)
// and store P_ij * Z / (1 - p) (what multiplied V in the forward) and dS_ij to shared memory.
template <int D>
__device__ __forceinline__ void backward_probs(const AttnParams& p, int b, int h, int row0, int col0,
                                               const float* q, const float* dO, const float* k, const float* v,
                                               const float* lse2, const float* D_i, float* pd, float* ds,
                                               int ty, int tx) {
  constexpr int kLdP = BwdLayout<D>::kLdP;
  float s[kBwdRows][kBwdCols], dp[kBwdRows][kBwdCols];
  tile_abt<D>(q, k, ty, tx, s);  // q was loaded pre-multiplied by scale * log2 e
  tile_abt<D>(dO, v, ty, tx, dp);
  const bool needs_mask = tile_needs_any_mask(p, row0, col0, kBwdBc);
#pragma unroll
  for (int a = 0; a < kBwdRows; ++a) {
    const int r = ty + 16 * a;
#pragma unroll
    for (int c = 0; c < kBwdCols; ++c) {
      const int col = tx + 16 * c;
      const bool masked = needs_mask && element_masked(p, row0 + r, col0 + col);
      const float prob = masked ? 0.0f : exp2f(s[a][c] - lse2[r]);
      const float z = dropout_factor(p, b, h, row0 + r, col0 + col);
      pd[r * kLdP + col] = prob * z;
      ds[r * kLdP + col] = prob * (dp[a][c] * z - D_i[r]);
    }
  }
}

// Rows of Q_i / dO_i past seq_q, and fully masked rows (L = -inf), get L = +inf in base 2 so that
// exp2(S - L) = 0 for them.
__device__ __forceinline__ float lse_base2(float lse_natural, bool valid_row) {
  if (!valid_row || lse_natural == -INFINITY) return INFINITY;
  return lse_natural * kLog2e;
}

// Raise a kernel's dynamic shared memory limit above the default 48 KB (asked of the runtime once per kernel, device
// and size).
template <class Kernel>
void allow_shared_bytes(Kernel kernel, std::size_t bytes) {
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), static_cast<int>(bytes));
}

}  // namespace flashlab::cuda
