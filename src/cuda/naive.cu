// cuda-naive: standard attention as frameworks ran it before FlashAttention, the first GPU generation.
//
//   S = scale Q K^T        kernel 1: a GEMM                       S: (B, H_q, S_q, S_k) in HBM
//   P = softmax(S)         kernel 2: one warp per row, also L      P: (B, H_q, S_q, S_k) in HBM
//   O = dropout(P) V       kernel 3: a GEMM
//
// What it is for: the baseline every later generation improves on. Each step is simple and runs at
// whatever speed its kernel manages, but S and P are written to HBM and read back, so memory is
// O(S_q * S_k) per head and traffic Theta(N d + N^2): at B * H = 16, S_q = S_k = 32k, S and P alone
// are 128 GiB and do not fit on an 80 GB card. Before allocating, the prediction (naive_extra_bytes,
// the same formula the CPU reference and lesson 01 use) is compared with cudaMemGetInfo, and a problem
// that will not fit is refused with an InputError instead of failing halfway.
//
// The GEMM is a parameter: here simple_gemm (one thread per element of C, 16 x 16 shared-memory tiles,
// the textbook kernel); cublas.cu runs the same pipeline with cuBLAS (cuda-cublas), which isolates what
// fusion buys from what a tuned GEMM buys.
//
// Backward (same materialized style): recompute S, then P = exp(S - L) from the saved L, and
//   dV = dropout(P)^T dO,  dP = dropout_mask(dO V^T),  D_i = rowsum(P o dP),  dS = P o (dP - D_i),
//   dQ = scale dS K,  dK = scale dS^T Q,
// with S, P, dP, dS all (B, H_q, S_q, S_k) in HBM. GQA: the query heads of a group add into the same
// dK, dV (GEMMs with beta = 1 after the first head).
#include <algorithm>
#include <string>

#include "model/memory.hpp"
#include "cuda/cuda_variants.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/simt_tiles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda {
namespace {

// Tile sizes and blocks per SM: the data cuda/tilings.hpp exports to the traffic model's GPU level.
constexpr int kGemmTile = unfused::kGemmTiling.Br;
constexpr int kWarp = kWarpSize;
constexpr int kGemmThreads = kGemmTile * kGemmTile;  // one thread per element of C's tile
constexpr int kRowThreads = unfused::kSoftmaxRowsPerBlock * kWarp;  // row kernels: one warp per row
constexpr int kElementThreads = 256;
static_assert(unfused::kGemmTiling.Bc == kGemmTile && kGemmThreads == unfused::kGemmTiling.warps * kWarp,
              "simple_gemm's tile is square, one thread per element");

// ---------------------------------------------------------------------------------------------
// Kernels 1 and 3: C = alpha op(A) op(B) + beta C, one thread per element of C, K in steps of 16
// staged through shared memory. Grid (ceil(n/16), ceil(m/16), batch). Its 32 registers per thread let
// 8 blocks share an SM (all its 2048 threads); the launch bounds keep it so.
__global__ void __launch_bounds__(kGemmThreads, unfused::kGemmTiling.blocks_per_sm) simple_gemm_kernel(GemmCall g) {
  __shared__ float As[kGemmTile][kGemmTile + 1];  // (16 rows of C, 16 of K), +1: no bank conflicts
  __shared__ float Bs[kGemmTile][kGemmTile + 1];  // (16 of K, 16 columns of C)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * kGemmTile + ty, col = blockIdx.x * kGemmTile + tx;
  const float* A = g.a + blockIdx.z * g.stride_a;
  const float* B = g.b + blockIdx.z * g.stride_b;
  float* C = g.c + blockIdx.z * g.stride_c;
  float acc = 0.0f;
  for (int k0 = 0; k0 < g.k; k0 += kGemmTile) {
    const int ka = k0 + tx, kb = k0 + ty;
    As[ty][tx] = row < g.m && ka < g.k ? (g.trans_a ? A[ka * g.lda + row] : A[row * g.lda + ka]) : 0.0f;
    Bs[ty][tx] = kb < g.k && col < g.n ? (g.trans_b ? B[col * g.ldb + kb] : B[kb * g.ldb + col]) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGemmTile; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();
  }
  if (row < g.m && col < g.n) {
    float* c = C + row * g.ldc + col;
    *c = g.beta == 0.0f ? g.alpha * acc : g.alpha * acc + g.beta * *c;
  }
}

// Kernel 2: row i of S -> row i of P (dropout applied: what multiplies V) and L_i = log sum exp.
// One warp per (b, h, i); S already carries the softmax scale. It reads the row three times
// (unfused::kSoftmaxReadsOfS): its max, its sum, then P. Its 48 registers per thread let 5 blocks share an
// SM; the launch bounds keep at least that many.
__global__ void __launch_bounds__(kRowThreads, unfused::kSoftmaxBlocksPerSm) softmax_forward_kernel(AttnParams p, const float* __restrict__ S, float* __restrict__ P,
                                       float* __restrict__ L) {
  const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= (long long)p.lse_numel()) return;
  const int i = static_cast<int>(w % p.seq_q), h = static_cast<int>((w / p.seq_q) % p.heads_q);
  const int b = static_cast<int>(w / ((long long)p.seq_q * p.heads_q));
  const float* s = S + w * p.seq_k;
  float* prob = P + w * p.seq_k;
  const int last = last_visible_key(p.causal, i, p.seq_q, p.seq_k);  // keys after it are masked
  float m = -INFINITY;
  for (int j = lane; j <= last; j += kWarp) m = fmaxf(m, s[j]);
  for (int off = kWarp / 2; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float sum = 0.0f;
  for (int j = lane; j <= last; j += kWarp) sum += expf(s[j] - m);
  for (int off = kWarp / 2; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float inv_sum = last >= 0 ? 1.0f / sum : 0.0f;  // a fully masked row: P = 0, L = -inf
  for (int j = lane; j < p.seq_k; j += kWarp)
    prob[j] = j <= last ? expf(s[j] - m) * inv_sum * dropout_factor(p, b, h, i, j) : 0.0f;
  if (lane == 0) L[w] = last >= 0 ? m + logf(sum) : -INFINITY;
}

// Backward, step 2: S -> P = exp(S - L) and, in place of S, P o Z / (1 - p). One thread per element.
__global__ void probs_from_lse_kernel(AttnParams p, float* __restrict__ S_to_Pd, float* __restrict__ P,
                                      const float* __restrict__ L) {
  const long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  const long long total = (long long)p.lse_numel() * p.seq_k;
  if (idx >= total) return;
  const long long w = idx / p.seq_k;
  const int j = static_cast<int>(idx % p.seq_k), i = static_cast<int>(w % p.seq_q);
  const int h = static_cast<int>((w / p.seq_q) % p.heads_q), b = static_cast<int>(w / ((long long)p.seq_q * p.heads_q));
  const bool masked = is_masked(p.causal, i, j, p.seq_q, p.seq_k) || L[w] == -INFINITY;
  const float prob = masked ? 0.0f : expf(S_to_Pd[idx] - L[w]);
  P[idx] = prob;
  S_to_Pd[idx] = prob * dropout_factor(p, b, h, i, j);
}

// Backward, step 4: dP <- dP o Z / (1 - p) (the gradient reaching P through dropout), D_i =
// rowsum(P o dP), dS = P o (dP - D_i). One warp per row.
__global__ void softmax_backward_kernel(AttnParams p, const float* __restrict__ P, const float* __restrict__ dP,
                                        float* __restrict__ dS) {
  const long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (w >= (long long)p.lse_numel()) return;
  const int i = static_cast<int>(w % p.seq_q), h = static_cast<int>((w / p.seq_q) % p.heads_q);
  const int b = static_cast<int>(w / ((long long)p.seq_q * p.heads_q));
  const float* prob = P + w * p.seq_k;
  const float* dprob = dP + w * p.seq_k;
  float* ds = dS + w * p.seq_k;
  float D_i = 0.0f;
  for (int j = lane; j < p.seq_k; j += kWarp) D_i += prob[j] * dprob[j] * dropout_factor(p, b, h, i, j);
  for (int off = kWarp / 2; off > 0; off >>= 1) D_i += __shfl_xor_sync(0xffffffffu, D_i, off);
  for (int j = lane; j < p.seq_k; j += kWarp) ds[j] = prob[j] * (dprob[j] * dropout_factor(p, b, h, i, j) - D_i);
}

unsigned blocks_for(long long items, int per_block) { return static_cast<unsigned>((items + per_block - 1) / per_block); }

// ---------------------------------------------------------------------------------------------
// The batched products of attention, per (batch b, group member g), batched over the K/V heads: the
// query head h = h_kv * group + g reads K/V head h_kv. One call per (b, g) keeps every batch stride
// uniform, so the same GemmCall serves simple_gemm and cuBLAS.

struct Buffers {
  const float *q, *k, *v;
  long long sq, sk;  // S_q * S_k: one (b, h) matrix
};

// The (b, g) slice of a (B, S_q, H_q, D) tensor, batched over h_kv.
struct Slice {
  long long offset, ld, stride;
};
Slice q_slice(const AttnParams& p, int b, int g) { return {p.q_offset(b, 0, g), p.q_row(), (long long)p.group * p.head_dim}; }
Slice kv_slice(const AttnParams& p, int b) { return {p.kv_offset(b, 0, 0), p.kv_row(), p.head_dim}; }
// The (b, g) slice of a (B, H_q, S_q, S_k) matrix, batched over h_kv.
Slice score_slice(const AttnParams& p, int b, int g) {
  const long long sq_sk = (long long)p.seq_q * p.seq_k;
  return {((long long)b * p.heads_q + g) * sq_sk, p.seq_k, p.group * sq_sk};
}

// C (m, n) slice = alpha op(A) op(B) + beta C for every h_kv of (b, g).
void slice_gemm(GemmFn gemm, const AttnParams& p, bool ta, bool tb, int m, int n, int k, float alpha, const float* A,
                Slice sa, const float* B, Slice sb, float beta, float* C, Slice sc) {
  GemmCall c;
  c.trans_a = ta, c.trans_b = tb, c.m = m, c.n = n, c.k = k, c.alpha = alpha, c.beta = beta;
  c.a = A + sa.offset, c.lda = sa.ld, c.stride_a = sa.stride;
  c.b = B + sb.offset, c.ldb = sb.ld, c.stride_b = sb.stride;
  c.c = C + sc.offset, c.ldc = sc.ld, c.stride_c = sc.stride;
  c.batch = p.heads_kv;
  gemm(c);
}

// S = scale Q K^T (or dP = dO V^T with X = dO, Y = V, alpha = 1): (S_q, S_k) per head.
void scores(GemmFn gemm, const AttnParams& p, float alpha, const float* X, const float* Y, float* S) {
  for (int b = 0; b < p.batch; ++b)
    for (int g = 0; g < p.group; ++g)
      slice_gemm(gemm, p, false, true, p.seq_q, p.seq_k, p.head_dim, alpha, X, q_slice(p, b, g), Y, kv_slice(p, b),
                 0.0f, S, score_slice(p, b, g));
}

std::size_t score_elements(const AttnParams& p) { return p.lse_numel() * (std::size_t)p.seq_k; }

// Refuse, before allocating its scratch, a problem whose S and P (and dP, dS) will not fit. The inputs and
// outputs count too unless they are already in device memory (Io::in_place: the device entry points).
enum class Io { to_allocate, in_place };
void check_fits(const char* variant, const Problem& prob, const AttnParams& p, bool backward, Io io_state) {
  const std::size_t io = io_state == Io::in_place
                             ? 0
                             : (2 * p.q_numel() + 2 * p.kv_numel() + p.lse_numel()) * sizeof(float) * (backward ? 2 : 1);
  const std::size_t extra = static_cast<std::size_t>(naive_extra_bytes(prob.shape, sizeof(float), backward)) *
                            prob.shape.batch * prob.shape.heads_q;  // formula is per (batch, head)
  const std::size_t free_bytes = device_memory_info().first;
  constexpr double kHeadroom = 0.95;  // leave room for the CUDA context and cuBLAS workspace
  if (io + extra > kHeadroom * free_bytes)
    throw InputError(std::string(variant) + " needs " + mebibytes(io + extra) + " on the GPU (" +
                     mebibytes(extra) + " for the (B, H, S_q, S_k) matrices S and P" + (backward ? ", dP and dS" : "") +
                     ") but only " + mebibytes(free_bytes) + " are free; use cuda-fa2-simt, whose extra memory is O(S_q)");
}

// The unfused pipeline's own scratch: S and P, and for the backward dP and dS, each (B, H_q, S_q, S_k).
struct Scores {
  DeviceBuffer<float> s, pr, dp, ds;
  Scores(const AttnParams& p, bool backward) : s(score_elements(p)), pr(score_elements(p)) {
    if (backward) {
      dp = DeviceBuffer<float>(score_elements(p));
      ds = DeviceBuffer<float>(score_elements(p));
    }
  }
};

// Device-level passes on fp32 (B, S, H, D) tensors.
void forward_device(GemmFn gemm, const AttnParams& p, const DeviceForwardIo& io, Scores& sc) {
  float *s = sc.s.data(), *pr = sc.pr.data();
  scores(gemm, p, p.scale, as<float>(io.q), as<float>(io.k), s);  // kernel 1: S = scale Q K^T
  softmax_forward_kernel<<<blocks_for(p.lse_numel(), kRowThreads / kWarp), kRowThreads>>>(p, s, pr,
                                                                                         io.lse);  // kernel 2
  CUDA_CHECK_LAUNCH();
  for (int b = 0; b < p.batch; ++b)  // kernel 3: O = dropout(P) V
    for (int g = 0; g < p.group; ++g)
      slice_gemm(gemm, p, false, false, p.seq_q, p.head_dim, p.seq_k, 1.0f, pr, score_slice(p, b, g),
                 as<float>(io.v), kv_slice(p, b), 0.0f, as<float>(io.o), q_slice(p, b, g));
}

// Reads q, k, v, lse and dO (not o: P is recomputed from lse alone).
void backward_device(GemmFn gemm, const AttnParams& p, const DeviceBackwardIo& io, Scores& sc) {
  const float *q = as<float>(io.q), *k = as<float>(io.k), *dO = as<float>(io.d_o);
  float *dq = as<float>(io.dq), *dk = as<float>(io.dk), *dv = as<float>(io.dv);
  float *s = sc.s.data(), *pr = sc.pr.data(), *dp = sc.dp.data(), *ds = sc.ds.data();
  scores(gemm, p, p.scale, q, k, s);  // S = scale Q K^T
  probs_from_lse_kernel<<<blocks_for((long long)score_elements(p), kElementThreads), kElementThreads>>>(
      p, s, pr, io.lse);
  CUDA_CHECK_LAUNCH();                            // pr = P, s = P o Z / (1 - p)
  scores(gemm, p, 1.0f, dO, as<float>(io.v), dp);  // dP = dO V^T (the gradient of the dropped-out P)
  softmax_backward_kernel<<<blocks_for(p.lse_numel(), kRowThreads / kWarp), kRowThreads>>>(p, pr, dp, ds);
  CUDA_CHECK_LAUNCH();
  for (int b = 0; b < p.batch; ++b)
    for (int g = 0; g < p.group; ++g) {
      const float beta = g == 0 ? 0.0f : 1.0f;  // GQA: heads of a group add into dK, dV
      // dV = (P o Z)^T dO  (S_k, d)
      slice_gemm(gemm, p, true, false, p.seq_k, p.head_dim, p.seq_q, 1.0f, s, score_slice(p, b, g), dO,
                 q_slice(p, b, g), beta, dv, kv_slice(p, b));
      // dK = scale dS^T Q  (S_k, d)
      slice_gemm(gemm, p, true, false, p.seq_k, p.head_dim, p.seq_q, p.scale, ds, score_slice(p, b, g), q,
                 q_slice(p, b, g), beta, dk, kv_slice(p, b));
      // dQ = scale dS K  (S_q, d)
      slice_gemm(gemm, p, false, false, p.seq_q, p.head_dim, p.seq_k, p.scale, ds, score_slice(p, b, g), k,
                 kv_slice(p, b), 0.0f, dq, q_slice(p, b, g));
    }
}

}  // namespace

void simple_gemm(const GemmCall& g) {
  const dim3 block(kGemmTile, kGemmTile);
  const dim3 grid((g.n + kGemmTile - 1) / kGemmTile, (g.m + kGemmTile - 1) / kGemmTile, g.batch);
  simple_gemm_kernel<<<grid, block>>>(g);
  CUDA_CHECK_LAUNCH();
}

void unfused_forward_on_device(const char* variant, GemmFn gemm, const Problem& prob, DType,
                               const DeviceForwardIo& io) {
  const AttnParams p = make_params(prob);
  check_fits(variant, prob, p, false, Io::in_place);
  Scores sc(p, false);
  forward_device(gemm, p, io, sc);
  finish_on_device();
}

void unfused_backward_on_device(const char* variant, GemmFn gemm, const Problem& prob, DType,
                                const DeviceBackwardIo& io) {
  const AttnParams p = make_params(prob);
  check_fits(variant, prob, p, true, Io::in_place);
  Scores sc(p, true);
  backward_device(gemm, p, io, sc);
  finish_on_device();
}

BenchResult unfused_bench(const char* variant, GemmFn gemm, const Problem& prob, DType,
                          const BenchSettings& settings) {
  const AttnParams p = make_params(prob);
  check_fits(variant, prob, p, settings.backward, Io::to_allocate);
  const PeakScope scope;
  auto t = DeviceAttention<float>::random(prob.shape, settings.backward);
  Scores sc(p, settings.backward);
  const DeviceForwardIo forward_io = t.forward_io();
  const DeviceBackwardIo backward_io = t.backward_io();
  return bench_passes(
      settings, scope, t, [&] { forward_device(gemm, p, forward_io, sc); },
      [&] { backward_device(gemm, p, backward_io, sc); });
}

}  // namespace flashlab::cuda

namespace flashlab {

void cuda_naive_forward_on_device(const Problem& p, DType t, const DeviceForwardIo& io) {
  cuda::unfused_forward_on_device("cuda-naive", cuda::simple_gemm, p, t, io);
}
void cuda_naive_backward_on_device(const Problem& p, DType t, const DeviceBackwardIo& io) {
  cuda::unfused_backward_on_device("cuda-naive", cuda::simple_gemm, p, t, io);
}
ForwardOut cuda_naive_forward(const Problem& p, DType t, const Qkv& in, TrafficObserver*) {
  return cuda::forward_from_host(cuda_naive_forward_on_device, p, t, in);
}
Grads cuda_naive_backward(const Problem& p, DType t, const Qkv& in, const ForwardOut& f, const HostTensor& dO) {
  return cuda::backward_from_host(cuda_naive_backward_on_device, cuda::BackwardReads::lse, p, t, in, f, dO);
}
BenchResult cuda_naive_bench(const Problem& p, DType t, const BenchSettings& s) {
  return cuda::unfused_bench("cuda-naive", cuda::simple_gemm, p, t, s);
}

}  // namespace flashlab
