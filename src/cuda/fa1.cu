// cuda-fa1: FlashAttention-1 (Dao et al., 2022), paper Algorithm 2 (forward, with dropout) and
// Algorithm 4 (backward), followed faithfully, fp32 on CUDA cores.
//
// What changed from cuda-naive / cuda-cublas (naive.cu, cublas.cu), and what it buys:
//  * One fused kernel per pass. S_ij and P_ij live only in shared memory and registers, tile by tile;
//    the (S_q, S_k) matrices never exist, so the memory beyond inputs and outputs drops from
//    O(S_q * S_k) to O(S_q) (m and l), and the HBM traffic from Theta(N d + N^2) to Theta(N^2 d^2 / M).
//  * Online softmax: each tile is normalized with the running row max m_i and sum l_i, and earlier
//    results are rescaled by exp(m_old - m_new), so one pass over K, V suffices.
//
// What it does NOT do yet (cuda-fa2-simt, fa2_simt.cu, does):
//  * The K/V block loop is outer (j), the Q block loop inner (i). So O_i, m_i, l_i must be read from
//    HBM and written back at every inner step: O is read and written Tc times instead of once.
//  * Parallel over batch x heads only: B * H_q thread blocks, one per (b, h), each walking all of
//    that head's tiles in sequence. With B * H = 16 a 132-SM H100 is mostly idle.
//  * O_i is divided by l_i at every step (the paper's line 12), not once at the end.
// The tile arithmetic is shared with cuda-fa2-simt (simt_tiles.cuh): the loop order is the difference.
//
// Backward, Algorithm 4: one block per (b, K/V head); j outer: K_j, V_j in shared memory, dK_j, dV_j
// in registers (summed over the query heads of a GQA group); i inner: Q_i, dO_i, L_i loaded, D_i =
// rowsum(dO_i o O_i) recomputed on chip, dQ_i read from HBM, updated and written back at every step.
// Only this block touches this head's dQ, so no atomics are needed. We pass L = m + log l (the LSE)
// instead of m and l: P_ij = diag(l_i)^-1 exp(S_ij - m_i) = exp(S_ij - L_i), the same numbers.
#include <algorithm>

#include "cuda/cuda_variants.hpp"
#include "cuda/dispatch.cuh"
#include "cuda/host_passes.cuh"
#include "cuda/simt_tiles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Forward, Algorithm 2. Grid (H_q, B), 128 threads. m and l are (B, H_q, S_q) scratch in HBM,
// m in base 2.

// Its tiles and blocks per SM are the data cuda/tilings.hpp exports (fa1::forward_tiling): the launch
// bounds and the shared memory below must allow that many blocks on an SM.
template <int D>
constexpr KernelTiling kFa1Tiling = fa1::forward_tiling(D);
static_assert(kFa1Tiling<64>.Br == kFwdBr && kFa1Tiling<64>.Bc == kFwdBc && kFa1Tiling<64>.warps * kWarpSize == kFwdThreads,
              "cuda/tilings.hpp describes fa1's forward tiles");

template <int D>
__global__ void __launch_bounds__(kFwdThreads, kFa1Tiling<D>.blocks_per_sm) fa1_forward_kernel(AttnParams p, const float* __restrict__ Q,
                                                                  const float* __restrict__ K,
                                                                  const float* __restrict__ V, float* O,
                                                                  float* L, float* m_hbm, float* l_hbm) {
  using Layout = FwdLayout<D>;
  constexpr int kLd = Layout::kLd, kLdP = Layout::kLdP, kOCols = Layout::kOCols;
  extern __shared__ float4 smem4[];
  float* Qi = reinterpret_cast<float*>(smem4);  // (Br, D)
  float* Kj = Qi + kFwdBr * kLd;                // (Bc, D)
  float* Vj = Kj + kFwdBc * kLd;                // (Bc, D)
  float* Pij = Vj + kFwdBc * kLd;               // (Br, Bc)

  const int h = blockIdx.x, b = blockIdx.y;
  const int hk = h / p.group;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;

  // Line 2: initialize O = (0), l = (0), m = (-inf) in HBM.
  for (int r = threadIdx.x; r < p.seq_q; r += kFwdThreads) {
    for (int c = 0; c < p.head_dim; ++c) O[p.q_offset(b, r, h) + c] = 0.0f;
    l_hbm[p.lse_offset(b, h, r)] = 0.0f;
    m_hbm[p.lse_offset(b, h, r)] = -INFINITY;
  }

  const int Tr = (p.seq_q + kFwdBr - 1) / kFwdBr, Tc = (p.seq_k + kFwdBc - 1) / kFwdBc;
  for (int j = 0; j < Tc; ++j) {  // line 5: outer loop over K/V blocks
    const int col0 = j * kFwdBc;
    const int cols = min(kFwdBc, p.seq_k - col0);
    __syncthreads();
    load_tile<kFwdBc, D, kLd, kFwdThreads>(Kj, K + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
    load_tile<kFwdBc, D, kLd, kFwdThreads>(Vj, V + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);

    for (int i = 0; i < Tr; ++i) {  // line 7: inner loop over Q blocks
      const int row0 = i * kFwdBr;
      const int rows = min(kFwdBr, p.seq_q - row0);
      if (p.causal != CausalAlign::None && tile_fully_masked(p.causal, row0, row0 + rows, col0, p.seq_q, p.seq_k))
        continue;  // causal: this tile is all masked (uniform across the block)
      __syncthreads();  // the previous step is done with Q_i and P_ij; O, m, l writes are visible
      // Line 8: load Q_i, O_i, l_i, m_i from HBM.
      load_tile<kFwdBr, D, kLd, kFwdThreads>(Qi, Q + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim,
                                             p.scale_log2);
      float o[kFwdRows][kOCols], m_old[kFwdRows], l_old[kFwdRows];
#pragma unroll
      for (int a = 0; a < kFwdRows; ++a) {
        const int row = row0 + ty + 16 * a;
        const bool valid = row < p.seq_q;
        m_old[a] = valid ? m_hbm[p.lse_offset(b, h, row)] : -INFINITY;
        l_old[a] = valid ? l_hbm[p.lse_offset(b, h, row)] : 0.0f;
#pragma unroll
        for (int q4 = 0; q4 < D / 32; ++q4)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 32 * q4 + 4 * tx + e;
            o[a][4 * q4 + e] = valid && col < p.head_dim ? O[p.q_offset(b, row, h) + col] : 0.0f;
          }
      }
      __syncthreads();  // Q_i in shared memory

      float s[kFwdRows][kFwdCols];
      score_tile<D>(Qi, Kj, ty, tx, s);  // line 9: S_ij = tau Q_i K_j^T (base 2)  (Br, Bc)
      if (tile_needs_any_mask(p, row0, col0, kFwdBc)) mask_scores(p, row0, col0, ty, tx, s);  // line 10

      float m_new[kFwdRows], l_new[kFwdRows];
#pragma unroll
      for (int a = 0; a < kFwdRows; ++a) {
        // Line 11: m~ = rowmax(S), P~ = exp(S - m~), l~ = rowsum(P~).
        float tile_max = s[a][0];
#pragma unroll
        for (int c = 1; c < kFwdCols; ++c) tile_max = fmaxf(tile_max, s[a][c]);
        const float m_tilde = row_max8(tile_max);
        float prob[kFwdCols], sum = 0.0f;
#pragma unroll
        for (int c = 0; c < kFwdCols; ++c) {
          prob[c] = exp2f(s[a][c] - safe_max(m_tilde));
          sum += prob[c];
        }
        const float l_tilde = row_sum8(sum);
        // Line 12: m_new = max(m_i, m~), l_new = exp(m_i - m_new) l_i + exp(m~ - m_new) l~.
        m_new[a] = fmaxf(m_old[a], m_tilde);
        const float alpha = exp2f(m_old[a] - safe_max(m_new[a])), beta = exp2f(m_tilde - safe_max(m_new[a]));
        l_new[a] = alpha * l_old[a] + beta * l_tilde;
        // Line 15: O_i = diag(l_new)^-1 (diag(l_i) exp(m_i - m_new) O_i + exp(m~ - m_new) dropout(P~) V_j).
        // The P~ stored for the product carries exp(m~ - m_new) / l_new and the dropout factor, and O_i
        // is scaled by l_i exp(m_i - m_new) / l_new first, so one accumulation does the whole line.
        const float inv_l = l_new[a] > 0.0f ? 1.0f / l_new[a] : 0.0f;
        const float o_scale = alpha * l_old[a] * inv_l, p_scale = beta * inv_l;
        const int r = ty + 16 * a;
#pragma unroll
        for (int c = 0; c < kFwdCols; ++c)
          Pij[r * kLdP + tx + 8 * c] = prob[c] * p_scale * dropout_factor(p, b, h, row0 + r, col0 + tx + 8 * c);
#pragma unroll
        for (int c = 0; c < kOCols; ++c) o[a][c] *= o_scale;
      }
      __syncthreads();  // P_ij complete
      pv_accumulate<D>(Pij, Vj, ty, tx, o);

      // Lines 15-16: write O_i, l_i, m_i back to HBM.
#pragma unroll
      for (int a = 0; a < kFwdRows; ++a) {
        const int row = row0 + ty + 16 * a;
        if (row >= p.seq_q) continue;
#pragma unroll
        for (int q4 = 0; q4 < D / 32; ++q4)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 32 * q4 + 4 * tx + e;
            if (col < p.head_dim) O[p.q_offset(b, row, h) + col] = o[a][4 * q4 + e];
          }
        if (tx == 0) {
          m_hbm[p.lse_offset(b, h, row)] = m_new[a];
          l_hbm[p.lse_offset(b, h, row)] = l_new[a];
        }
      }
    }
  }
  __syncthreads();
  // Our addition to the paper's outputs: L_i = m_i + log l_i, which the backward pass and the other
  // variants use (-inf for a fully masked row).
  for (int r = threadIdx.x; r < p.seq_q; r += kFwdThreads) {
    const float l = l_hbm[p.lse_offset(b, h, r)], m = m_hbm[p.lse_offset(b, h, r)];
    L[p.lse_offset(b, h, r)] = l > 0.0f ? m * kLn2 + logf(l) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, Algorithm 4. Grid (H_kv, B), 256 threads.

template <int D>
__global__ void __launch_bounds__(kBwdThreads)
    fa1_backward_kernel(AttnParams p, const float* __restrict__ Q, const float* __restrict__ K,
                        const float* __restrict__ V, const float* __restrict__ O, const float* __restrict__ dO,
                        const float* __restrict__ L, float* dQ, float* __restrict__ dK, float* __restrict__ dV) {
  using Layout = BwdLayout<D>;
  constexpr int kLd = Layout::kLd, kLdP = Layout::kLdP, kDCols = Layout::kDCols;
  extern __shared__ float4 smem4[];
  float* Qi = reinterpret_cast<float*>(smem4);  // (Br, D), pre-scaled by tau * log2 e
  float* dOi = Qi + kBwdBr * kLd;                // (Br, D)
  float* Kj = dOi + kBwdBr * kLd;                // (Bc, D)
  float* Vj = Kj + kBwdBc * kLd;                 // (Bc, D)
  float* Pij = Vj + kBwdBc * kLd;                // (Br, Bc), P_ij * Z / (1 - p)
  float* dSij = Pij + kBwdBr * kLdP;             // (Br, Bc)
  float* L_i = dSij + kBwdBr * kLdP;             // (Br), base 2
  float* D_i = L_i + kBwdBr;                     // (Br)

  const int hk = blockIdx.x, b = blockIdx.y;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

  // Line 5: initialize dQ = (0) in HBM (the query heads of this K/V head).
  for (int g = 0; g < p.group; ++g)
    for (int idx = threadIdx.x; idx < p.seq_q * p.head_dim; idx += kBwdThreads)
      dQ[p.q_offset(b, idx / p.head_dim, hk * p.group + g) + idx % p.head_dim] = 0.0f;

  const int Tr = (p.seq_q + kBwdBr - 1) / kBwdBr, Tc = (p.seq_k + kBwdBc - 1) / kBwdBc;
  for (int j = 0; j < Tc; ++j) {  // line 6: outer loop over K/V blocks
    const int col0 = j * kBwdBc;
    const int cols = min(kBwdBc, p.seq_k - col0);
    __syncthreads();
    load_tile<kBwdBc, D, kLd, kBwdThreads>(Kj, K + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
    load_tile<kBwdBc, D, kLd, kBwdThreads>(Vj, V + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
    float dk[kBwdRows][kDCols] = {}, dv[kBwdRows][kDCols] = {};  // line 8: dK~_j = dV~_j = 0 on chip

    for (int g = 0; g < p.group; ++g) {
      const int h = hk * p.group + g;
      for (int i = 0; i < Tr; ++i) {  // line 9: inner loop over Q blocks
        const int row0 = i * kBwdBr;
        const int rows = min(kBwdBr, p.seq_q - row0);
        if (p.causal != CausalAlign::None && tile_fully_masked(p.causal, row0, row0 + rows, col0, p.seq_q, p.seq_k))
          continue;
        __syncthreads();
        // Line 10: load Q_i, O_i, dO_i, dQ_i, L_i from HBM.
        load_tile<kBwdBr, D, kLd, kBwdThreads>(Qi, Q + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim,
                                               p.scale_log2);
        load_tile<kBwdBr, D, kLd, kBwdThreads>(dOi, dO + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim);
        __syncthreads();
        // Line 19 (computed early, on chip, as the paper does every step): D_i = rowsum(dO_i o O_i),
        // 4 threads per row.
        {
          const int r = threadIdx.x / 4, part = threadIdx.x % 4;
          float sum = 0.0f;
          if (r < rows)
            for (int c = part; c < p.head_dim; c += 4) sum += dOi[r * kLd + c] * O[p.q_offset(b, row0 + r, h) + c];
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          sum += __shfl_xor_sync(0xffffffffu, sum, 2);
          if (part == 0) {
            D_i[r] = sum;
            L_i[r] = lse_base2(r < rows ? L[p.lse_offset(b, h, row0 + r)] : 0.0f, r < rows);
          }
        }
        __syncthreads();
        // Lines 11-20: S_ij, P_ij (recomputed from L_i), dropout, dP_ij, dS_ij.
        backward_probs<D>(p, b, h, row0, col0, Qi, dOi, Kj, Vj, L_i, D_i, Pij, dSij, ty, tx);
        __syncthreads();
        tile_atb_acc<D>(Pij, dOi, ty, tx, dv);  // line 16: dV~_j += (P_ij o Z)^T dO_i
        tile_atb_acc<D>(dSij, Qi, ty, tx, dk);  // line 22: dK~_j += tau dS_ij^T Q_i
        float dq[kBwdRows][kDCols];
        tile_ab<D>(dSij, Kj, ty, tx, dq);       // line 21: dQ_i += tau dS_ij K_j, read-modify-write in HBM
#pragma unroll
        for (int a = 0; a < kBwdRows; ++a) {
          const int row = row0 + ty + 16 * a;
          if (row >= p.seq_q) continue;
          float* out = dQ + p.q_offset(b, row, h);
#pragma unroll
          for (int c = 0; c < kDCols; ++c) {
            const int col = tx + 16 * c;
            if (col < p.head_dim) out[col] += p.scale * dq[a][c];
          }
        }
      }
    }
    // Line 24: write dK_j, dV_j to HBM (Q_i carried tau * log2 e; divide the log2 e back out).
#pragma unroll
    for (int a = 0; a < kBwdRows; ++a) {
      const int row = col0 + ty + 16 * a;
      if (row >= p.seq_k) continue;
#pragma unroll
      for (int c = 0; c < kDCols; ++c) {
        const int col = tx + 16 * c;
        if (col >= p.head_dim) continue;
        dK[p.kv_offset(b, row, hk) + col] = dk[a][c] / kLog2e;
        dV[p.kv_offset(b, row, hk) + col] = dv[a][c];
      }
    }
  }
}

// Set on every launch, as cuda-fa2 does: the attribute is per device, and a process may use several.
template <int D>
void launch_forward(const AttnParams& p, const float* q, const float* k, const float* v, float* o, float* lse,
                    float* m, float* l) {
  static_assert(shared_memory_fits(FwdLayout<D>::kBytes, kFa1Tiling<D>.blocks_per_sm),
                "fa1's forward shared memory must let cuda/tilings.hpp's blocks per SM fit");
  allow_shared_bytes(fa1_forward_kernel<D>, FwdLayout<D>::kBytes);
  fa1_forward_kernel<D><<<dim3(p.heads_q, p.batch), kFwdThreads, FwdLayout<D>::kBytes>>>(p, q, k, v, o, lse, m, l);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_backward(const AttnParams& p, const float* q, const float* k, const float* v, const float* o,
                     const float* dO, const float* lse, float* dq, float* dk, float* dv) {
  allow_shared_bytes(fa1_backward_kernel<D>, BwdLayout<D>::kBytes);
  fa1_backward_kernel<D><<<dim3(p.heads_kv, p.batch), kBwdThreads, BwdLayout<D>::kBytes>>>(p, q, k, v, o, dO, lse,
                                                                                          dq, dk, dv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// Device-level passes on (B, S, H, D) fp32 tensors. m, l: lse_numel() scratch.
void fa1_forward_device(const AttnParams& p, const DeviceForwardIo& io, float* m, float* l) {
  dispatch_head_dim<simt::kPaddedHeadDims>(padded_head_dim(p.head_dim), "cuda-fa1 forward", [&]<int D>() {
    launch_forward<D>(p, as<float>(io.q), as<float>(io.k), as<float>(io.v), as<float>(io.o), io.lse, m, l);
  });
}

void fa1_backward_device(const AttnParams& p, const DeviceBackwardIo& io) {
  dispatch_head_dim<simt::kPaddedHeadDims>(padded_head_dim(p.head_dim), "cuda-fa1 backward", [&]<int D>() {
    launch_backward<D>(p, as<float>(io.q), as<float>(io.k), as<float>(io.v), as<float>(io.o), as<float>(io.d_o),
                       io.lse, as<float>(io.dq), as<float>(io.dk), as<float>(io.dv));
  });
}

namespace {
// FA1's running max m and sum l, (B, H_q, S_q) in HBM: what its K/V-outer loop order must keep there.
struct RunningStats {
  DeviceBuffer<float> m, l;
  explicit RunningStats(const AttnParams& p) : m(p.lse_numel()), l(p.lse_numel()) {}
};
}  // namespace

}  // namespace cuda

using namespace cuda;

void cuda_fa1_forward_on_device(const Problem& prob, DType, const DeviceForwardIo& io) {
  const AttnParams p = make_params(prob);
  RunningStats ml(p);
  fa1_forward_device(p, io, ml.m.data(), ml.l.data());
  finish_on_device();
}

void cuda_fa1_backward_on_device(const Problem& prob, DType, const DeviceBackwardIo& io) {
  fa1_backward_device(make_params(prob), io);
  finish_on_device();
}

ForwardOut cuda_fa1_forward(const Problem& prob, DType dtype, const Qkv& in, TrafficObserver*) {
  return forward_from_host(cuda_fa1_forward_on_device, prob, dtype, in);
}

Grads cuda_fa1_backward(const Problem& prob, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return backward_from_host(cuda_fa1_backward_on_device, BackwardReads::o_and_lse, prob, dtype, in, fwd, dO);
}

BenchResult cuda_fa1_bench(const Problem& prob, DType, const BenchSettings& settings) {
  const AttnParams p = make_params(prob);
  const PeakScope scope;
  auto t = DeviceAttention<float>::random(prob.shape, settings.backward);
  RunningStats ml(p);
  const DeviceForwardIo forward_io = t.forward_io();
  const DeviceBackwardIo backward_io = t.backward_io();
  return bench_passes(
      settings, scope, t, [&] { fa1_forward_device(p, forward_io, ml.m.data(), ml.l.data()); },
      [&] { fa1_backward_device(p, backward_io); });
}

}  // namespace flashlab
