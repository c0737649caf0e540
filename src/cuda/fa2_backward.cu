// cuda-fa2 backward: FlashAttention-2 (Dao, 2023, Algorithm 2) on tensor cores.
//
// Three kernels:
//  1. dsum_kernel: D_i = rowsum(dO_i o O_i), one warp per row (the term that replaces rowsum(P o dP)).
//  2. backward_kernel: one thread block per K/V block j (and batch, K/V head); K_j, V_j stay in shared
//     memory while the block walks every Q block i that sees them, recomputing S_ij and P_ij from the
//     saved L_i instead of storing the N x N matrices:
//        S = scale Q_i K_j^T, P = exp(S - L_i), dV_j += P^T dO_i, dP = dO_i V_j^T,
//        dS = P o (dP - D_i), dK_j += scale dS^T Q_i, dQ_i += scale dS K_j.
//     dK_j and dV_j live in fp32 registers for the whole walk and are written once. Under GQA the
//     block also walks the query heads of its group, so dK/dV sum over the group without atomics.
//  3. convert_dq_kernel: dQ = scale * dQ_accum, in the input dtype.
// dQ_i gets a contribution from every K/V block, i.e. from different thread blocks. We add them
// with fp32 atomics into dQ_accum (FA2's choice): the alternative, a second kernel with the Q block
// outer, recomputes S and P once more (7 matmuls instead of 5); the atomics go to L2, cost far less
// than those two matmuls, and the only price is a summation order that varies from run to run in
// the last bits. On sm_90 one vector atomic adds a thread's two neighbouring columns (half the L2
// requests of scalar atomics; fwd+bwd measured ~25% faster on the H100, see the notes in
// bench/results/h100-fa2-notes.md).
//
// Q_i and dO_i (with L_i, D_i) are double-buffered: the next work item is copied with cp.async while
// the current one computes, so a step needs two barriers and never waits for global memory.
//
// What changed from the forward, on the tensor-core side: P and dS are needed transposed (dV = P^T
// dO, dK = dS^T Q), so they make one trip through shared memory, where ldmatrix.trans reads them
// back as A operands. Warp w owns query rows 16 (w % 4) in the S/dP phase (no row reductions are
// needed: L_i and D_i are known) and key rows 16 (w % 4), half (w / 4) of the head dim in the
// dK/dV phase.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "../core/mask.hpp"
#include "../core/philox.hpp"
#include "common.cuh"
#include "fa2_launch.cuh"
#include "fa2_mma.cuh"
#include "fa2_tile.cuh"

namespace flashlab::cuda::fa2 {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct BwdConfig {
  static constexpr int kBr = 64, kBc = 64;
  static constexpr int kWarps = 8;  // 4 row groups of 16 x 2 column halves
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kPitchS = kBc + kPad;  // P and dS tiles (Br, Bc), padded like the others
  template <int D>
  static constexpr int smem_bytes() {
    return (2 * kBc + 2 * 2 * kBr) * kPitch<D> * 2  // K_j, V_j; two stages of Q_i, dO_i
           + 2 * kBr * kPitchS * 2                  // P_ij, dS_ij
           + 2 * 2 * kBr * 4;                       // two stages of L_i (log2 units), D_i
  }
};

// D_i = sum_d dO[i, d] O[i, d] in fp32; one warp per (batch, row, head).
template <class T>
__global__ void dsum_kernel(const Params p) {
  const std::int64_t warp = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const std::int64_t rows = std::int64_t(p.batch) * p.seq_q * p.heads_q;
  if (warp >= rows) return;
  const int h = static_cast<int>(warp % p.heads_q);
  const std::int64_t bs = warp / p.heads_q;
  const int s = static_cast<int>(bs % p.seq_q), b = static_cast<int>(bs / p.seq_q);
  const T* o = static_cast<const T*>(p.o) + warp * p.head_dim;
  const T* d_o = static_cast<const T*>(p.d_o) + warp * p.head_dim;
  float sum = 0.f;
  for (int d = lane; d < p.head_dim; d += 32) sum += static_cast<float>(o[d]) * static_cast<float>(d_o[d]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) p.d_sum[(std::int64_t(b) * p.heads_q + h) * p.seq_q + s] = sum;
}

template <class T>
__global__ void convert_dq_kernel(const Params p, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) static_cast<T*>(p.dq)[i] = static_cast<T>(p.dq_accum[i] * p.scale);
}

// dst[0] += x, dst[1] += y in global memory, atomically per element (dst 8-byte aligned). sm_90 has
// a vector reduction (red.global.add.v2.f32): one L2 transaction instead of two for the dQ atomics.
__device__ __forceinline__ void add_pair_to_global(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

template <class T, int D, bool kDropout>
__global__ void __launch_bounds__(BwdConfig::kThreads) backward_kernel(const Params p) {
  using Cfg = BwdConfig;
  constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kThreads = Cfg::kThreads, kPS = Cfg::kPitchS;
  constexpr int kHalfD = D / 2;           // head-dim columns per warp in the dK/dV/dQ phases
  constexpr int kHalfDT = kHalfD / 8;     // their n-tiles
  constexpr int kSNT = kBc / 2 / 8;       // n-tiles of S per warp (half of Bc)
  static_assert(kHalfD % 16 == 0, "the head dim must split into two multiples of 16");
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Ks = reinterpret_cast<T*>(smem_bytes);  // (Bc, D)
  T* Vs = Ks + kBc * kPitch<D>;              // (Bc, D)
  T* Qs0 = Vs + kBc * kPitch<D>;             // (2, Br, D): stage s at Qs0 + s * Br * pitch
  T* dOs0 = Qs0 + 2 * kBr * kPitch<D>;       // (2, Br, D)
  T* Ps = dOs0 + 2 * kBr * kPitch<D>;        // (Br, Bc): P_ij after dropout
  T* dSs = Ps + kBr * kPS;                   // (Br, Bc)
  float* Ls0 = reinterpret_cast<float*>(dSs + kBr * kPS);  // (2, Br): L_i * log2(e), +inf for empty rows
  float* Ds0 = Ls0 + 2 * kBr;                              // (2, Br)

  const int n_block = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y) / p.heads_kv, h_kv = static_cast<int>(blockIdx.y) % p.heads_kv;
  const int group = p.heads_q / p.heads_kv;
  const int col0 = n_block * kBc;
  const std::int64_t q_stride = std::int64_t(p.heads_q) * D, kv_stride = std::int64_t(p.heads_kv) * D;
  const std::int64_t kv_offset = (std::int64_t(b) * p.seq_k * p.heads_kv + h_kv) * D;

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;
  const int wr = warp % 4, wc = warp / 4;  // row group, column half

  load_tile_async<T, D, kBc, kThreads>(Ks, static_cast<const T*>(p.k) + kv_offset + col0 * kv_stride, kv_stride,
                                       p.seq_k - col0);
  load_tile_async<T, D, kBc, kThreads>(Vs, static_cast<const T*>(p.v) + kv_offset + col0 * kv_stride, kv_stride,
                                       p.seq_k - col0);
  cp_async_commit();

  // The first Q block that sees any key of this block (the mask is monotone in the row).
  const int Tr = (p.seq_q + kBr - 1) / kBr;
  int i_begin = 0;
  while (i_begin < Tr && tile_fully_masked(p.align, i_begin * kBr, min(i_begin * kBr + kBr, p.seq_q), col0,
                                           p.seq_q, p.seq_k))
    ++i_begin;

  float acc_dk[kHalfDT][4], acc_dv[kHalfDT][4];  // (16 keys, D/2) per warp
#pragma unroll
  for (int nt = 0; nt < kHalfDT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;

  // The block's work items: every (query head h of the group, Q block i >= i_begin), heads outer. The
  // next item's Q_i, dO_i are copied (cp.async) into the other stage while this one computes, and its
  // L_i, D_i are read into registers and parked in shared memory at the end of the step.
  const int n_i = Tr - i_begin;
  const int n_items = n_i > 0 ? group * n_i : 0;
  const auto item_head = [&](int item) { return h_kv * group + item / n_i; };
  const auto item_row0 = [&](int item) { return (i_begin + item % n_i) * kBr; };
  const auto prefetch_tiles = [&](int item, int stage) {
    const int row0 = item_row0(item);
    const std::int64_t offset = (std::int64_t(b) * p.seq_q * p.heads_q + item_head(item)) * D + row0 * q_stride;
    load_tile_async<T, D, kBr, kThreads>(Qs0 + stage * kBr * kPitch<D>, static_cast<const T*>(p.q) + offset,
                                         q_stride, p.seq_q - row0);
    load_tile_async<T, D, kBr, kThreads>(dOs0 + stage * kBr * kPitch<D>, static_cast<const T*>(p.d_o) + offset,
                                         q_stride, p.seq_q - row0);
    cp_async_commit();
  };
  // Row threadIdx.x (< Br) of an item: L in log2 units, and D. exp2(S - (+inf)) = 0, so rows past the
  // end and rows that saw no key (L = -inf) contribute nothing.
  const auto read_row_stats = [&](int item, float& L2, float& Dr) {
    const int row = item_row0(item) + static_cast<int>(threadIdx.x);
    const std::int64_t at = (std::int64_t(b) * p.heads_q + item_head(item)) * p.seq_q + row;
    const float L = row < p.seq_q ? p.lse[at] : -INFINITY;
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
    Dr = row < p.seq_q ? p.d_sum[at] : 0.f;
  };
  if (n_items > 0) {
    prefetch_tiles(0, 0);
    if (threadIdx.x < kBr) read_row_stats(0, Ls0[threadIdx.x], Ds0[threadIdx.x]);
  }

  for (int item = 0; item < n_items; ++item) {
    {
      const int stage = item & 1;
      const int h = item_head(item), row0 = item_row0(item);
      const std::int64_t q_offset = (std::int64_t(b) * p.seq_q * p.heads_q + h) * D;
      const T* Qs = Qs0 + stage * kBr * kPitch<D>;    // (Br, D)
      const T* dOs = dOs0 + stage * kBr * kPitch<D>;  // (Br, D)
      const float* Ls = Ls0 + stage * kBr;
      const float* Ds = Ds0 + stage * kBr;
      // Item `item` has landed, and every warp is done with the other stage and with P, dS.
      cp_async_wait<0>();
      __syncthreads();
      float next_L2 = 0.f, next_D = 0.f;
      if (item + 1 < n_items) {
        prefetch_tiles(item + 1, stage ^ 1);
        if (threadIdx.x < kBr) read_row_stats(item + 1, next_L2, next_D);
      }

      // S_ij = Q_i K_j^T and dP_ij = dO_i V_j^T: rows 16 wr.., key columns (Bc/2) wc.. per warp.
      float s[kSNT][4], dp[kSNT][4];
#pragma unroll
      for (int nt = 0; nt < kSNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        std::uint32_t aq[4], ado[4];
        ldmatrix_x4(aq, tile_addr<D>(Qs, wr * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
        ldmatrix_x4(ado, tile_addr<D>(dOs, wr * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int np = 0; np < kSNT / 2; ++np) {
          const int key = wc * (kBc / 2) + np * 16 + (lane & 7) + (lane >> 4) * 8;
          const int dcol = kk * 16 + ((lane >> 3) & 1) * 8;
          std::uint32_t bk[4], bv[4];
          ldmatrix_x4(bk, tile_addr<D>(Ks, key, dcol));
          ldmatrix_x4(bv, tile_addr<D>(Vs, key, dcol));
          mma_16x8x16<T>(s[2 * np], aq, bk[0], bk[1]);
          mma_16x8x16<T>(s[2 * np + 1], aq, bk[2], bk[3]);
          mma_16x8x16<T>(dp[2 * np], ado, bv[0], bv[1]);
          mma_16x8x16<T>(dp[2 * np + 1], ado, bv[2], bv[3]);
        }
      }

      // P = exp2(scale log2e S - L log2e), masked; dropout; dS = P o (dP - D). Then to shared memory.
      const bool needs_mask = tile_needs_mask(p.align, row0, col0 + kBc, p.seq_q, p.seq_k);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wr * 16 + g + 8 * hf;  // row within the block
        const int row = row0 + r;
        const float L = Ls[r], Dr = Ds[r];
        const int last = needs_mask ? last_visible_key(p.align, row, p.seq_q, p.seq_k) : p.seq_k;
        std::uint32_t keep = 0;
        if constexpr (kDropout) keep = dropout_keep_bits<kSNT>(p, b, h, row, col0 + wc * (kBc / 2) + 2 * t, t);
#pragma unroll
        for (int nt = 0; nt < kSNT; ++nt) {
          const int c = wc * (kBc / 2) + nt * 8 + 2 * t;  // column within the block (even)
          float pr[2], ds[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float prob = col0 + c + e > last ? 0.f : fast_exp2(s[nt][2 * hf + e] * p.scale_log2 - L);
            float dprob = dp[nt][2 * hf + e];
            float kept = prob;
            if constexpr (kDropout) {
              const float z = (keep >> (2 * nt + e)) & 1u ? p.drop_rescale : 0.f;
              kept *= z;   // P after dropout, what O used
              dprob *= z;  // dP w.r.t. the undropped P
            }
            pr[e] = kept;
            ds[e] = prob * (dprob - Dr);
          }
          *reinterpret_cast<std::uint32_t*>(Ps + r * kPS + c) = MmaType<T>::pack(pr[0], pr[1]);
          *reinterpret_cast<std::uint32_t*>(dSs + r * kPS + c) = MmaType<T>::pack(ds[0], ds[1]);
        }
      }
      __syncthreads();

      // dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i: key rows 16 wr.., head-dim half wc per warp.
#pragma unroll
      for (int kq = 0; kq < kBr / 16; ++kq) {
        std::uint32_t ap[4], ads[4];
        const int prow = kq * 16 + (lane & 7) + (lane >> 4) * 8, pcol = wr * 16 + ((lane >> 3) & 1) * 8;
        ldmatrix_x4_trans(ap, smem_addr(Ps + prow * kPS + pcol));
        ldmatrix_x4_trans(ads, smem_addr(dSs + prow * kPS + pcol));
#pragma unroll
        for (int dn = 0; dn < kHalfDT / 2; ++dn) {
          const int qrow = kq * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          const int dcol = wc * kHalfD + dn * 16 + (lane >> 4) * 8;
          std::uint32_t bdo[4], bq[4];
          ldmatrix_x4_trans(bdo, tile_addr<D>(dOs, qrow, dcol));
          ldmatrix_x4_trans(bq, tile_addr<D>(Qs, qrow, dcol));
          mma_16x8x16<T>(acc_dv[2 * dn], ap, bdo[0], bdo[1]);
          mma_16x8x16<T>(acc_dv[2 * dn + 1], ap, bdo[2], bdo[3]);
          mma_16x8x16<T>(acc_dk[2 * dn], ads, bq[0], bq[1]);
          mma_16x8x16<T>(acc_dk[2 * dn + 1], ads, bq[2], bq[3]);
        }
      }

      // dQ_i += dS_ij K_j (scaled in convert_dq_kernel): query rows 16 wr.., head-dim half wc, 16
      // columns at a time to keep the registers for dK and dV.
      float* dq_rows = p.dq_accum + q_offset + row0 * q_stride;
#pragma unroll 1  // rolled: keeps the compiler from hoisting every chunk's loads into registers
      for (int dn = 0; dn < kHalfDT / 2; ++dn) {
        float acc[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) {
          std::uint32_t a[4], bk[4];
          ldmatrix_x4(a, smem_addr(dSs + (wr * 16 + (lane & 15)) * kPS + kk * 16 + (lane >> 4) * 8));
          ldmatrix_x4_trans(bk, tile_addr<D>(Ks, kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                             wc * kHalfD + dn * 16 + (lane >> 4) * 8));
          mma_16x8x16<T>(acc[0], a, bk[0], bk[1]);
          mma_16x8x16<T>(acc[1], a, bk[2], bk[3]);
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = wr * 16 + g + 8 * hf;
          if (row0 + r >= p.seq_q) continue;
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            float* dst = dq_rows + r * q_stride + wc * kHalfD + dn * 16 + n * 8 + 2 * t;
            add_pair_to_global(dst, acc[n][2 * hf], acc[n][2 * hf + 1]);
          }
        }
      }
      if (item + 1 < n_items && threadIdx.x < kBr) {
        Ls0[(stage ^ 1) * kBr + threadIdx.x] = next_L2;
        Ds0[(stage ^ 1) * kBr + threadIdx.x] = next_D;
      }
    }
  }

  cp_async_wait<0>();  // a block with no work never waited for K_j, V_j

  // dK_j = scale * sum_i dS_ij^T Q_i; dV_j as accumulated. Rows past the end of the keys are dropped.
  T* dk = static_cast<T*>(p.dk) + kv_offset + col0 * kv_stride;
  T* dv = static_cast<T*>(p.dv) + kv_offset + col0 * kv_stride;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = wr * 16 + g + 8 * hf;
    if (col0 + r >= p.seq_k) continue;
#pragma unroll
    for (int nt = 0; nt < kHalfDT; ++nt) {
      const int c = wc * kHalfD + nt * 8 + 2 * t;
      *reinterpret_cast<std::uint32_t*>(dk + r * kv_stride + c) =
          MmaType<T>::pack(acc_dk[nt][2 * hf] * p.scale, acc_dk[nt][2 * hf + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(dv + r * kv_stride + c) =
          MmaType<T>::pack(acc_dv[nt][2 * hf], acc_dv[nt][2 * hf + 1]);
    }
  }
}

template <class T, int D, bool kDropout>
void launch_main(const Params& p) {
  constexpr int smem = BwdConfig::smem_bytes<D>();
  auto kernel = backward_kernel<T, D, kDropout>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const dim3 grid((p.seq_k + BwdConfig::kBc - 1) / BwdConfig::kBc, p.batch * p.heads_kv);
  kernel<<<grid, BwdConfig::kThreads, smem>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_for_dtype(const Params& p) {
  constexpr int kThreads = 256;
  const std::int64_t rows = std::int64_t(p.batch) * p.seq_q * p.heads_q;
  dsum_kernel<T><<<static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads), kThreads>>>(p);
  CUDA_CHECK_LAUNCH();

  auto pick = [&]<int D>() {
    if (p.dropout) launch_main<T, D, true>(p);
    else launch_main<T, D, false>(p);
  };
  switch (p.head_dim) {
    case 32: pick.template operator()<32>(); break;
    case 64: pick.template operator()<64>(); break;
    case 96: pick.template operator()<96>(); break;
    case 128: pick.template operator()<128>(); break;
    case 256: pick.template operator()<256>(); break;
    default: throw std::logic_error("cuda-fa2 backward: head_dim " + std::to_string(p.head_dim) + " has no kernel");
  }

  const std::int64_t n = rows * p.head_dim;
  convert_dq_kernel<T><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads>>>(p, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_backward(DType dtype, const Params& p) {
  if (p.seq_q == 0 || p.seq_k == 0 || p.batch == 0) return;
  if (dtype == DType::F16) return launch_for_dtype<__half>(p);
  if (dtype == DType::BF16) return launch_for_dtype<__nv_bfloat16>(p);
  throw std::logic_error("cuda-fa2 backward: dtype must be f16 or bf16");
}

}  // namespace flashlab::cuda::fa2
