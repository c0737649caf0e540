// cuda-fa2 forward: FlashAttention-2 (Dao, 2023, Algorithm 1) on tensor cores, fp16/bf16 in, fp32
// accumulation.
//
// What changed from fa2-simt (the readable CUDA-core FA2, same loop order: Q block outer, K/V inner,
// O rescaled once at the end):
//  * Both matmuls run on tensor cores (mma.sync m16n8k16) instead of FMA: ~16x the arithmetic rate.
//  * Operands reach the tensor cores through ldmatrix (K plain, V transposed), from shared tiles
//    padded so that no ldmatrix or cp.async store conflicts on a bank (fa2_tile.cuh).
//  * K_{j+1}, V_{j+1} are copied with cp.async into a second stage while tile j computes, so the
//    loads hide behind the math; one barrier per K/V tile.
//  * S_ij never leaves the registers: its fp32 C fragments are exponentiated in place and re-packed
//    as the A fragment of P_ij V_j (fa2_mma.cuh, pack_a_from_c).
//  * The softmax scale is folded into exp2: exp(scale * s - m) = exp2(scale * log2e * s - m'), one
//    FFMA per score on the raw S (a negative scale negates Q_i once instead; see the kernel).
//  * Causal: tiles that are fully masked are never visited, and only the tiles that straddle the
//    diagonal (or the end of the keys) pay for the element mask (core/mask.hpp).
//  * Each warp owns kMTiles * 16 query rows, so every K/V fragment loaded by ldmatrix feeds kMTiles
//    mma's; with two m-tiles the shared-memory bytes per FLOP halve.
//  * Blocks are launched heaviest first (causal: the last query blocks see the most keys).
// Block shapes (FwdConfig): 4 warps; Br = 128 (64 at d=256); Bc = 64 at d <= 128 and 32 at d=256, the
// largest tile for which S_ij, O_i and the rest fit in 255 registers with no spills (ptxas -v).
// Bc = 64 at d=128 rather than 32: half the barriers and softmax passes per key (measured:
// bench/results/h100-fa2-notes.md).
// Two things make it fit (ptxas -v, sm_90):
//  * the cp.async copies walk one pointer per thread (fa2_tile.cuh): the plain unrolled loop kept
//    ~30 registers of precomputed addresses live across the K/V loop;
//  * at d=96 and d=128, V_{j+1}'s copy is issued after the softmax, right before P_ij V_j (K_{j+1}'s
//    stays at the top): that branch ends ptxas's basic block there. In one block with the softmax,
//    ptxas schedules P_ij V_j's loads into it, where S_ij (64 registers) and O_i (128) are live, and
//    spills up to 84 bytes at d=128. V_{j+1} still has the whole P_ij V_j to land.
// Tried and measured slower (bench/results/h100-fa2-notes.md): 8 warps of 16 rows (Bc = 64 at d=128,
// Bc = 128 at d=64) fits in ~172 registers, but each warp then reads the whole K_j, V_j from shared
// memory for only 16 rows (half the FLOPs per byte), and shared memory becomes the bound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/common.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/fa2_launch.cuh"
#include "cuda/fa2_mma.cuh"
#include "cuda/fa2_tile.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa2 {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

// Block shape per head dim: kWarps warps, each owning kMTiles * 16 query rows (Br = kWarps * kMTiles
// * 16), Bc keys per K/V tile, kBlocksPerSm blocks per SM: the data cuda/tilings.hpp exports
// (fa2::forward_tiling), which the traffic model's GPU level reads.
template <int D>
struct FwdConfig {
  static constexpr KernelTiling kTiling = forward_tiling(D);
  static constexpr int kWarps = kTiling.warps;
  static constexpr int kMTiles = kTiling.Br / (kWarps * 16);  // d=256: O alone takes 128 registers per m-tile
  static constexpr int kBc = kTiling.Bc;  // S_ij and O_i must share 255 registers without spills
  static constexpr int kBlocksPerSm = kTiling.blocks_per_sm;
  // Issue V_{j+1}'s copy just before P_ij V_j instead of at the top: needed for no spills at Bc = 64
  // (see the header). Elsewhere the copies stay together: a branch between the exp2's and the P V
  // mma's keeps the scheduler from overlapping them (as the warp vote did; measured:
  // bench/results/h100-fa2-notes.md).
  static constexpr bool kLateV = D == 96 || D == 128;
  static constexpr int kCopyUnroll = 4;  // cp.async copies per thread issued back to back (fa2_tile.cuh)
  static constexpr int kBr = kWarps * kMTiles * 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kSmemBytes = (kBr + 2 * 2 * kBc) * kPitch<D> * 2;  // Q, 2 stages of K and V
  static_assert(kBr == kTiling.Br, "whole m-tiles of 16 rows per warp");
  static_assert(shared_memory_fits(kSmemBytes, kBlocksPerSm), "the blocks per SM of cuda/tilings.hpp must fit");
};

template <class T, int D, bool kDropout>
__global__ void __launch_bounds__(FwdConfig<D>::kThreads, FwdConfig<D>::kBlocksPerSm) forward_kernel(const Params p) {
  using Cfg = FwdConfig<D>;
  constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kM = Cfg::kMTiles, kThreads = Cfg::kThreads;
  constexpr int kCopyUnroll = Cfg::kCopyUnroll;
  constexpr int kNT = kBc / 8;  // n-tiles of S per row block
  constexpr int kDT = D / 8;    // n-tiles of O
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Qs = reinterpret_cast<T*>(smem_bytes);  // (Br, D)
  T* Ks = Qs + kBr * kPitch<D>;              // (2, Bc, D)
  T* Vs = Ks + 2 * kBc * kPitch<D>;          // (2, Bc, D)

  const int m_block = forward_query_block(static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x));  // heaviest first
  const int b = static_cast<int>(blockIdx.y) / p.heads_q, h = static_cast<int>(blockIdx.y) % p.heads_q;
  const int h_kv = h / (p.heads_q / p.heads_kv);
  const int row0 = m_block * kBr;
  const std::int64_t q_stride = std::int64_t(p.heads_q) * D, kv_stride = std::int64_t(p.heads_kv) * D;
  const T* q = static_cast<const T*>(p.q) + (std::int64_t(b) * p.seq_q * p.heads_q + h) * D;
  const T* k = static_cast<const T*>(p.k) + (std::int64_t(b) * p.seq_k * p.heads_kv + h_kv) * D;
  const T* v = static_cast<const T*>(p.v) + (std::int64_t(b) * p.seq_k * p.heads_kv + h_kv) * D;
  T* o = static_cast<T*>(p.o) + (std::int64_t(b) * p.seq_q * p.heads_q + h) * D;
  float* lse = p.lse + (std::int64_t(b) * p.heads_q + h) * p.seq_q;

  // Tc: K/V tiles this block must visit; under a causal mask the last row sees the most keys.
  const int last_row = min(row0 + kBr, p.seq_q) - 1;
  const int last_key = last_visible_key(p.align, last_row, p.seq_q, p.seq_k);
  const int Tc = last_key < 0 ? 0 : last_key / kBc + 1;

  load_tile_async<T, D, kBr, kThreads, kCopyUnroll>(Qs, q + row0 * q_stride, q_stride, p.seq_q - row0);
  if (Tc > 0) {
    load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Ks, k, kv_stride, p.seq_k);
    load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Vs, v, kv_stride, p.seq_k);
  }
  cp_async_commit();

  // The scale is applied inside the exponent (below), to raw scores, so the row max must be taken where
  // the scaled scores are largest. For a negative scale c, c Q K^T = |c| (-Q) K^T: Q_i is negated once,
  // in shared memory, and the loop sees |c|. (A sign test inside the loop instead costs work on every
  // score of every tile; measured: bench/results/h100-fa2-notes.md.)
  const float scale_log2 = fabsf(p.scale_log2);
  if (p.scale_log2 < 0.f) {
    cp_async_wait<0>();
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < kBr * D / 2; c += kThreads)  // two elements per word
      reinterpret_cast<std::uint32_t*>(Qs + c / (D / 2) * kPitch<D>)[c % (D / 2)] ^= 0x80008000u;  // sign bits
  }  // the loop's first barrier publishes the negated tile

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;  // fragment row group, thread in group
  const int warp_row0 = warp * kM * 16;  // first row of this warp within the block

  // Per row this thread holds (m-tile mi, half hf: rows g and g + 8): the running max m_i (in log2
  // units, scale folded in) and this thread's part of the running sum l_i.
  float m_i[kM][2], l_i[kM][2];
  float acc_o[kM][kDT][4];  // O_i, unnormalized: (16 * kM, D) per warp
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m_i[mi][hf] = -INFINITY;
      l_i[mi][hf] = 0.f;
    }
#pragma unroll
    for (int nt = 0; nt < kDT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mi][nt][e] = 0.f;
  }

  // This lane's ldmatrix row address in Q_i (A fragments: rows lane % 16, column half lane / 16).
  const std::uint32_t q_frag_base = tile_addr<D>(Qs, warp_row0 + (lane & 15), (lane >> 4) * 8);

  for (int j = 0; j < Tc; ++j) {
    // Tile j has landed, and every warp is done with the stage tile j + 1 will overwrite.
    cp_async_wait<0>();
    __syncthreads();
    if (j + 1 < Tc) {
      const int next_row = (j + 1) * kBc;
      const int stage = (j + 1) & 1;
      load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Ks + stage * kBc * kPitch<D>, k + next_row * kv_stride,
                                                        kv_stride, p.seq_k - next_row);
      if constexpr (!Cfg::kLateV)
        load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Vs + stage * kBc * kPitch<D>, v + next_row * kv_stride,
                                                          kv_stride, p.seq_k - next_row);
    }
    cp_async_commit();
    const T* Kj = Ks + (j & 1) * kBc * kPitch<D>;  // (Bc, D)
    const T* Vj = Vs + (j & 1) * kBc * kPitch<D>;  // (Bc, D)

    // S_ij = Q_i K_j^T  // (16 * kM, Bc) per warp
    float s[kM][kNT][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mi][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      std::uint32_t a[kM][4];
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) ldmatrix_x4(a[mi], q_frag_base + (mi * 16 * kPitch<D> + kk * 16) * sizeof(T));
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t bk[4];
        ldmatrix_x4(bk, tile_addr<D>(Kj, np * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_16x8x16<T>(s[mi][2 * np], a[mi], bk[0], bk[1]);
          mma_16x8x16<T>(s[mi][2 * np + 1], a[mi], bk[2], bk[3]);
        }
      }
    }

    // Mask only tiles that straddle the diagonal or the end of the keys. S_ij stays unscaled: the scale
    // is applied inside the exponent's FFMA below (one instruction per element less than scaling first;
    // measured: bench/results/h100-fa2-notes.md).
    const int col0 = j * kBc;
    const bool needs_mask = tile_needs_mask(p.align, row0, col0 + kBc, p.seq_q, p.seq_k);
    if (needs_mask) {
#pragma unroll
      for (int mi = 0; mi < kM; ++mi)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = row0 + warp_row0 + mi * 16 + g + 8 * hf;
          // Columns of this thread are col0 + 8 nt + 2t + e: compare against the tile-relative limit.
          const int last = last_visible_key(p.align, row, p.seq_q, p.seq_k) - col0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            s[mi][nt][2 * hf] = nt * 8 > last ? -INFINITY : s[mi][nt][2 * hf];
            s[mi][nt][2 * hf + 1] = nt * 8 + 1 > last ? -INFINITY : s[mi][nt][2 * hf + 1];
          }
        }
    }

    // Online softmax: m_i^(j) = max(m_i^(j-1), rowmax(scale S_ij)) in log2 units; P_ij = exp2(scale S_ij -
    // m_i^(j)); l_i and O_i are rescaled by exp2(m_i^(j-1) - m_i^(j)); the scale is positive here, so the
    // largest scaled score is the largest raw one. Each m-tile's P is packed to 16 bits as soon as it is
    // final (the A fragments of P_ij V_j): the fp32 S_ij dies here rather than at its mma.
    // (ptxas -v: with the always-on rescale below, this is what keeps d=128 and d=256 spill-free.)
    std::uint32_t pa[kM][kBc / 16][4];  // A fragments of P_ij, (16 * kM, Bc) per warp
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float raw_max = s[mi][0][2 * hf];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) raw_max = fmaxf(raw_max, fmaxf(s[mi][nt][2 * hf], s[mi][nt][2 * hf + 1]));
        const float row_max = fmaxf(m_i[mi][hf], quad_max(raw_max) * scale_log2);
        // A row that has seen only masked keys keeps m = -inf; subtract 0 then so exp2 gives 0, not NaN.
        const float m_use = row_max == -INFINITY ? 0.f : row_max;
        const float correction = fast_exp2(m_i[mi][hf] - m_use);
        m_i[mi][hf] = row_max;
        float row_sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          s[mi][nt][2 * hf] = fast_exp2(fmaf(s[mi][nt][2 * hf], scale_log2, -m_use));
          s[mi][nt][2 * hf + 1] = fast_exp2(fmaf(s[mi][nt][2 * hf + 1], scale_log2, -m_use));
          row_sum += s[mi][nt][2 * hf] + s[mi][nt][2 * hf + 1];
        }
        l_i[mi][hf] = l_i[mi][hf] * correction + row_sum;  // this thread's columns; quad-summed at the end
        // Always rescale (D/4 multiplies): a warp vote that skipped it when no row max moved put a
        // branch between the exp2's and the P V mma's, so the scheduler could not overlap them, which
        // cost more than the multiplies it saved (measured: bench/results/h100-fa2-notes.md).
#pragma unroll
        for (int nt = 0; nt < kDT; ++nt) {
          acc_o[mi][nt][2 * hf] *= correction;
          acc_o[mi][nt][2 * hf + 1] *= correction;
        }
        // Dropout acts on P after its row sum (l_i normalizes the undropped softmax): keep / (1 - p).
        if constexpr (kDropout) {
          const int row = row0 + warp_row0 + mi * 16 + g + 8 * hf;
          const std::uint32_t keep = dropout_keep_bits<kNT>(p, b, h, row, col0 + 2 * t, t);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            s[mi][nt][2 * hf] *= (keep >> (2 * nt)) & 1u ? p.drop_rescale : 0.f;
            s[mi][nt][2 * hf + 1] *= (keep >> (2 * nt + 1)) & 1u ? p.drop_rescale : 0.f;
          }
        }
      }
#pragma unroll
      for (int kp = 0; kp < kBc / 16; ++kp) pack_a_from_c<T>(pa[mi][kp], s[mi][2 * kp], s[mi][2 * kp + 1]);
    }

    // V_{j+1} is first read by the next tile's P V, so its copy can wait until here; the branch also
    // ends ptxas's basic block, so V_j's ldmatrix's are not hoisted into the softmax above.
    if constexpr (Cfg::kLateV) {
      if (j + 1 < Tc) {
        const int next_row = (j + 1) * kBc;
        load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Vs + ((j + 1) & 1) * kBc * kPitch<D>,
                                                          v + next_row * kv_stride, kv_stride, p.seq_k - next_row);
      }
      cp_async_commit();
    }

    // O_i += P_ij V_j, P_ij straight from the registers.
#pragma unroll
    for (int kp = 0; kp < kBc / 16; ++kp) {
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        std::uint32_t bv[4];
        ldmatrix_x4_trans(bv,
                          tile_addr<D>(Vj, kp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, dp * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          mma_16x8x16<T>(acc_o[mi][2 * dp], pa[mi][kp], bv[0], bv[1]);
          mma_16x8x16<T>(acc_o[mi][2 * dp + 1], pa[mi][kp], bv[2], bv[3]);
        }
      }
    }
  }

  // O_i = diag(l_i)^-1 O_i; L_i = m_i + log(l_i). A row that saw no key: O = 0, L = -inf.
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = row0 + warp_row0 + mi * 16 + g + 8 * hf;
      const float l = quad_sum(l_i[mi][hf]);
      if (row >= p.seq_q) continue;
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      std::uint32_t* o_row = reinterpret_cast<std::uint32_t*>(o + row * q_stride);
#pragma unroll
      for (int nt = 0; nt < kDT; ++nt)
        o_row[nt * 4 + t] = MmaType<T>::pack(acc_o[mi][nt][2 * hf] * inv_l, acc_o[mi][nt][2 * hf + 1] * inv_l);
      if (t == 0) lse[row] = l > 0.f ? (m_i[mi][hf] + log2f(l)) * kLn2 : -INFINITY;
    }
}

template <class T, int D, bool kDropout>
void launch(const Params& p, cudaStream_t stream) {
  using Cfg = FwdConfig<D>;
  auto kernel = forward_kernel<T, D, kDropout>;
  require_shared_memory(Cfg::kSmemBytes, "cuda-fa2 forward at head dim " + std::to_string(D));
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  const dim3 grid((p.seq_q + Cfg::kBr - 1) / Cfg::kBr, p.batch * p.heads_q);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_for_dtype(const Params& p, cudaStream_t stream) {
  dispatch_head_dim<kHeadDims>(p.head_dim, "cuda-fa2 forward", [&]<int D>() {
    if (p.dropout) launch<T, D, true>(p, stream);
    else launch<T, D, false>(p, stream);
  });
}

}  // namespace

void launch_forward(DType dtype, const Params& p, cudaStream_t stream) {
  if (p.seq_q == 0 || p.batch == 0) return;
  if (dtype == DType::F16) return launch_for_dtype<__half>(p, stream);
  if (dtype == DType::BF16) return launch_for_dtype<__nv_bfloat16>(p, stream);
  throw std::logic_error("cuda-fa2 forward: dtype must be f16 or bf16");
}

}  // namespace flashlab::cuda::fa2
