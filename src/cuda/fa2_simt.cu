// cuda-fa2-simt: FlashAttention-2 (Dao, 2023) in fp32 on CUDA cores.
//
// What changed from cuda-fa1 (fa1.cu), and what it buys:
//  1. The loops are swapped. Forward: one thread block per (batch, head, Q block i); Q_i stays in
//     shared memory and O_i, m_i, l_i stay in registers while the block streams every K_j, V_j past
//     them. O_i is rescaled once at the end and written once, with L_i = m_i + log l_i. FA1 reads and
//     writes O_i, m_i, l_i in HBM at every step of its inner loop.
//  2. Sequence parallelism: B * H_q * ceil(S_q / Br) blocks instead of B * H_q, so a single long
//     sequence fills all 132 SMs (FA1 runs 16 blocks for B * H = 16, whatever the length).
//  3. Fewer non-matmul operations: Q is pre-scaled by scale * log2(e) as it is loaded, so a score is
//     already in base 2 (one exp2 per element, no multiply); O is divided by l_i once, not every step.
//  4. Causal: a Q block stops at the last K block its last row can see, so fully masked tiles are
//     never loaded; only the diagonal tiles evaluate the element mask.
// The tile arithmetic (simt_tiles.cuh) is the same as cuda-fa1's, so any speed difference between
// the two comes from the loop order.
//
// Backward (FA2 paper, Algorithm 2): one block per (batch, K/V head, K block j), the K/V loop outer.
// K_j, V_j stay in shared memory, dK_j and dV_j accumulate in registers (over every Q block and every
// query head of the GQA group), and are written once. dQ_i receives a share from every K block, i.e.
// from many blocks at once: those shares are added with fp32 atomicAdd into a zeroed dQ, as in the
// paper. We chose atomics over a separate dQ pass because a separate pass (Q block outer) must
// recompute S_ij, P_ij and dP_ij a second time: 3 more (Br, Bc, d) products per tile, +60% FLOPs,
// to save only Br * d atomic adds per tile. The price: the order of the fp32 additions into dQ
// varies from run to run, so dQ may differ in the last bits between runs (well inside 1e-5).
// D_i = rowsum(dO_i * O_i) is computed once by a small kernel before the main one.
#include <algorithm>

#include "cuda/cuda_variants.hpp"
#include "cuda/dispatch.cuh"
#include "cuda/host_passes.cuh"
#include "cuda/simt_tiles.cuh"

namespace flashlab {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Forward. Grid (Tr, H_q, B), 128 threads.

template <int D>
__global__ void __launch_bounds__(kFwdThreads) fa2_forward_kernel(AttnParams p, const float* __restrict__ Q,
                                                                  const float* __restrict__ K,
                                                                  const float* __restrict__ V,
                                                                  float* __restrict__ O, float* __restrict__ L) {
  using Layout = FwdLayout<D>;
  constexpr int kLd = Layout::kLd, kLdP = Layout::kLdP, kOCols = Layout::kOCols;
  extern __shared__ float4 smem4[];
  float* Qi = reinterpret_cast<float*>(smem4);  // (Br, D)
  float* Kj = Qi + kFwdBr * kLd;                // (Bc, D)
  float* Vj = Kj + kFwdBc * kLd;                // (Bc, D)
  float* Pij = Vj + kFwdBc * kLd;               // (Br, Bc)

  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / p.group;
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;
  const int row0 = i * kFwdBr;
  const int rows = min(kFwdBr, p.seq_q - row0);

  // Q_i, pre-scaled so that S_ij comes out in base-2 units.
  load_tile<kFwdBr, D, kLd, kFwdThreads>(Qi, Q + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim,
                                         p.scale_log2);

  float m[kFwdRows], l[kFwdRows], o[kFwdRows][kOCols];  // m_i, l_i (base 2) and unnormalized O_i
#pragma unroll
  for (int a = 0; a < kFwdRows; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int c = 0; c < kOCols; ++c) o[a][c] = 0.0f;
  }

  // Causal: the last row of this block sees keys up to last_key; later K blocks are fully masked.
  const int last_key = last_visible_key(p.causal, row0 + rows - 1, p.seq_q, p.seq_k);
  const int Tc = last_key < 0 ? 0 : last_key / kFwdBc + 1;

  for (int j = 0; j < Tc; ++j) {
    const int col0 = j * kFwdBc;
    const int cols = min(kFwdBc, p.seq_k - col0);
    __syncthreads();  // the previous step has finished reading K_j, V_j and P_ij
    load_tile<kFwdBc, D, kLd, kFwdThreads>(Kj, K + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
    load_tile<kFwdBc, D, kLd, kFwdThreads>(Vj, V + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
    __syncthreads();

    float s[kFwdRows][kFwdCols];
    score_tile<D>(Qi, Kj, ty, tx, s);  // S_ij = Q_i K_j^T (base 2)  (Br, Bc)
    if (tile_needs_any_mask(p, row0, col0, kFwdBc)) mask_scores(p, row0, col0, ty, tx, s);

    // Online softmax: m_new = max(m, rowmax(S_ij)); P_ij = exp2(S_ij - m_new);
    // l = exp2(m - m_new) l + rowsum(P_ij); O = diag(exp2(m - m_new)) O (+ P_ij V_j below).
#pragma unroll
    for (int a = 0; a < kFwdRows; ++a) {
      float tile_max = s[a][0];
#pragma unroll
      for (int c = 1; c < kFwdCols; ++c) tile_max = fmaxf(tile_max, s[a][c]);
      const float m_new = fmaxf(m[a], row_max8(tile_max));
      const float m_use = safe_max(m_new);
      const float rescale = exp2f(m[a] - m_use);
      const int r = ty + 16 * a;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kFwdCols; ++c) {
        const float prob = exp2f(s[a][c] - m_use);
        sum += prob;  // l counts P before dropout: dropout scales what multiplies V, not the softmax
        Pij[r * kLdP + tx + 8 * c] = prob * dropout_factor(p, b, h, row0 + r, col0 + tx + 8 * c);
      }
      l[a] = rescale * l[a] + row_sum8(sum);
      m[a] = m_new;
#pragma unroll
      for (int c = 0; c < kOCols; ++c) o[a][c] *= rescale;
    }
    __syncthreads();  // P_ij complete
    pv_accumulate<D>(Pij, Vj, ty, tx, o);  // O_i += P_ij V_j  (Br, D)
  }

  // Epilogue: O_i = diag(l_i)^-1 O_i, L_i = m_i + log l_i (natural log), written once.
#pragma unroll
  for (int a = 0; a < kFwdRows; ++a) {
    const int row = row0 + ty + 16 * a;
    if (row >= p.seq_q) continue;
    const float inv_l = l[a] > 0.0f ? 1.0f / l[a] : 0.0f;  // a fully masked row: O = 0
    float* out = O + p.q_offset(b, row, h);
#pragma unroll
    for (int q4 = 0; q4 < D / 32; ++q4)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 32 * q4 + 4 * tx + e;
        if (col < p.head_dim) out[col] = o[a][4 * q4 + e] * inv_l;
      }
    if (tx == 0) L[p.lse_offset(b, h, row)] = l[a] > 0.0f ? m[a] * kLn2 + logf(l[a]) : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward.

// D_i = rowsum(dO_i * O_i), one warp per (b, h, row). Output (B, H_q, S_q).
__global__ void D_i_kernel(AttnParams p, const float* __restrict__ dO, const float* __restrict__ O,
                           float* __restrict__ D_i) {
  constexpr int kWarp = 32;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (warp >= (long long)p.lse_numel()) return;
  const int row = static_cast<int>(warp % p.seq_q);
  const int h = static_cast<int>((warp / p.seq_q) % p.heads_q);
  const int b = static_cast<int>(warp / ((long long)p.seq_q * p.heads_q));
  const long long off = p.q_offset(b, row, h);
  float sum = 0.0f;
  for (int c = lane; c < p.head_dim; c += kWarp) sum += dO[off + c] * O[off + c];
  for (int s = kWarp / 2; s > 0; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
  if (lane == 0) D_i[warp] = sum;
}

// Grid (Tc, H_kv, B), 256 threads. dQ must be zero on entry.
template <int D>
__global__ void __launch_bounds__(kBwdThreads)
    fa2_backward_kernel(AttnParams p, const float* __restrict__ Q, const float* __restrict__ K,
                        const float* __restrict__ V, const float* __restrict__ dO, const float* __restrict__ L,
                        const float* __restrict__ D_i_hbm, float* __restrict__ dQ, float* __restrict__ dK,
                        float* __restrict__ dV) {
  using Layout = BwdLayout<D>;
  constexpr int kLd = Layout::kLd, kLdP = Layout::kLdP, kDCols = Layout::kDCols;
  extern __shared__ float4 smem4[];
  float* Qi = reinterpret_cast<float*>(smem4);  // (Br, D), pre-scaled by scale * log2 e
  float* dOi = Qi + kBwdBr * kLd;                // (Br, D)
  float* Kj = dOi + kBwdBr * kLd;                // (Bc, D)
  float* Vj = Kj + kBwdBc * kLd;                 // (Bc, D)
  float* Pij = Vj + kBwdBc * kLd;                // (Br, Bc), P_ij * Z / (1 - p)
  float* dSij = Pij + kBwdBr * kLdP;             // (Br, Bc)
  float* L_i = dSij + kBwdBr * kLdP;             // (Br), base 2
  float* D_i = L_i + kBwdBr;                     // (Br)

  const int j = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int col0 = j * kBwdBc;
  const int cols = min(kBwdBc, p.seq_k - col0);

  load_tile<kBwdBc, D, kLd, kBwdThreads>(Kj, K + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);
  load_tile<kBwdBc, D, kLd, kBwdThreads>(Vj, V + p.kv_offset(b, col0, hk), p.kv_row(), cols, p.head_dim);

  float dk[kBwdRows][kDCols] = {}, dv[kBwdRows][kDCols] = {};  // dK_j, dV_j: rows ty + 16a
  const int Tr = (p.seq_q + kBwdBr - 1) / kBwdBr;
  for (int g = 0; g < p.group; ++g) {
    const int h = hk * p.group + g;
    for (int i = 0; i < Tr; ++i) {
      const int row0 = i * kBwdBr;
      const int rows = min(kBwdBr, p.seq_q - row0);
      if (p.causal != CausalAlign::None &&
          tile_fully_masked(p.causal, row0, row0 + rows, col0, p.seq_q, p.seq_k))
        continue;  // uniform across the block
      __syncthreads();  // the previous step has finished with Q_i, dO_i, P_ij, dS_ij
      load_tile<kBwdBr, D, kLd, kBwdThreads>(Qi, Q + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim,
                                             p.scale_log2);
      load_tile<kBwdBr, D, kLd, kBwdThreads>(dOi, dO + p.q_offset(b, row0, h), p.q_row(), rows, p.head_dim);
      for (int r = threadIdx.x; r < kBwdBr; r += kBwdThreads) {
        const bool valid = r < rows;
        L_i[r] = lse_base2(valid ? L[p.lse_offset(b, h, row0 + r)] : 0.0f, valid);
        D_i[r] = valid ? D_i_hbm[p.lse_offset(b, h, row0 + r)] : 0.0f;
      }
      __syncthreads();
      backward_probs<D>(p, b, h, row0, col0, Qi, dOi, Kj, Vj, L_i, D_i, Pij, dSij, ty, tx);
      __syncthreads();
      tile_atb_acc<D>(Pij, dOi, ty, tx, dv);   // dV_j += (P_ij o Z)^T dO_i  (Bc, D)
      tile_atb_acc<D>(dSij, Qi, ty, tx, dk);   // dK_j += dS_ij^T Q_i (Q_i carries scale * log2 e)
      float dq[kBwdRows][kDCols];
      tile_ab<D>(dSij, Kj, ty, tx, dq);        // dQ_i += scale dS_ij K_j  (Br, D), shared with other blocks
#pragma unroll
      for (int a = 0; a < kBwdRows; ++a) {
        const int row = row0 + ty + 16 * a;
        if (row >= p.seq_q) continue;
        float* out = dQ + p.q_offset(b, row, h);
#pragma unroll
        for (int c = 0; c < kDCols; ++c) {
          const int col = tx + 16 * c;
          if (col < p.head_dim) atomicAdd(out + col, p.scale * dq[a][c]);
        }
      }
    }
  }

  // dK_j = scale dS^T Q: Q_i was loaded times scale * log2 e, so divide the log2 e back out.
  const float dk_fix = 1.0f / kLog2e;
#pragma unroll
  for (int a = 0; a < kBwdRows; ++a) {
    const int row = col0 + ty + 16 * a;
    if (row >= p.seq_k) continue;
#pragma unroll
    for (int c = 0; c < kDCols; ++c) {
      const int col = tx + 16 * c;
      if (col >= p.head_dim) continue;
      dK[p.kv_offset(b, row, hk) + col] = dk[a][c] * dk_fix;
      dV[p.kv_offset(b, row, hk) + col] = dv[a][c];
    }
  }
}

// Set on every launch, as cuda-fa2 does: the attribute is per device, and a process may use several.
template <int D>
void launch_forward(const AttnParams& p, const float* q, const float* k, const float* v, float* o, float* lse) {
  allow_shared_bytes(fa2_forward_kernel<D>, FwdLayout<D>::kBytes);
  const dim3 grid((p.seq_q + kFwdBr - 1) / kFwdBr, p.heads_q, p.batch);
  fa2_forward_kernel<D><<<grid, kFwdThreads, FwdLayout<D>::kBytes>>>(p, q, k, v, o, lse);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void launch_backward(const AttnParams& p, const float* q, const float* k, const float* v, const float* dO,
                     const float* lse, const float* D_i, float* dq, float* dk, float* dv) {
  allow_shared_bytes(fa2_backward_kernel<D>, BwdLayout<D>::kBytes);
  const dim3 grid((p.seq_k + kBwdBc - 1) / kBwdBc, p.heads_kv, p.batch);
  fa2_backward_kernel<D><<<grid, kBwdThreads, BwdLayout<D>::kBytes>>>(p, q, k, v, dO, lse, D_i, dq, dk, dv);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// Device-level passes on (B, S, H, D) fp32 tensors.
void fa2_simt_forward_device(const AttnParams& p, const DeviceForwardIo& io) {
  dispatch_head_dim<simt::kPaddedHeadDims>(padded_head_dim(p.head_dim), "cuda-fa2-simt forward", [&]<int D>() {
    launch_forward<D>(p, as<float>(io.q), as<float>(io.k), as<float>(io.v), as<float>(io.o), io.lse);
  });
}

// `D_i` is scratch of lse_numel() floats; dq is overwritten (zeroed, then accumulated).
void fa2_simt_backward_device(const AttnParams& p, const DeviceBackwardIo& io, float* D_i) {
  constexpr int kThreads = 256, kWarpsPerBlock = kThreads / 32;
  const long long warps = static_cast<long long>(p.lse_numel());
  D_i_kernel<<<static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads>>>(
      p, as<float>(io.d_o), as<float>(io.o), D_i);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemsetAsync(io.dq, 0, p.q_numel() * sizeof(float)));
  dispatch_head_dim<simt::kPaddedHeadDims>(padded_head_dim(p.head_dim), "cuda-fa2-simt backward", [&]<int D>() {
    launch_backward<D>(p, as<float>(io.q), as<float>(io.k), as<float>(io.v), as<float>(io.d_o), io.lse, D_i,
                       as<float>(io.dq), as<float>(io.dk), as<float>(io.dv));
  });
}

}  // namespace cuda

using namespace cuda;

void cuda_fa2_simt_forward_on_device(const Problem& prob, DType, const DeviceForwardIo& io) {
  fa2_simt_forward_device(make_params(prob), io);
  finish_on_device();
}

void cuda_fa2_simt_backward_on_device(const Problem& prob, DType, const DeviceBackwardIo& io) {
  const AttnParams p = make_params(prob);
  DeviceBuffer<float> D_i(p.lse_numel());
  fa2_simt_backward_device(p, io, D_i.data());
  finish_on_device();
}

ForwardOut cuda_fa2_simt_forward(const Problem& prob, DType dtype, const Qkv& in, TrafficObserver*) {
  return forward_from_host(cuda_fa2_simt_forward_on_device, prob, dtype, in);
}

Grads cuda_fa2_simt_backward(const Problem& prob, DType dtype, const Qkv& in, const ForwardOut& fwd,
                             const HostTensor& dO) {
  return backward_from_host(cuda_fa2_simt_backward_on_device, BackwardReads::o_and_lse, prob, dtype, in, fwd, dO);
}

BenchResult cuda_fa2_simt_bench(const Problem& prob, DType, const BenchSettings& settings) {
  const AttnParams p = make_params(prob);
  const PeakScope scope;
  auto t = DeviceAttention<float>::random(prob.shape, settings.backward);
  DeviceBuffer<float> D_i(settings.backward ? p.lse_numel() : 0);
  const DeviceForwardIo forward_io = t.forward_io();
  const DeviceBackwardIo backward_io = t.backward_io();
  return bench_passes(
      settings, scope, t, [&] { fa2_simt_forward_device(p, forward_io); },
      [&] { fa2_simt_backward_device(p, backward_io, D_i.data()); });
}

}  // namespace flashlab
