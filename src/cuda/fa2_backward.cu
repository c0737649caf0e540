// cuda-fa2 backward: FlashAttention-2 (Dao, 2023, Algorithm 2) on tensor cores.
//
// Three kernels:
//  1. D_i_kernel: D_i = rowsum(dO_i o O_i), one warp per row (the term that replaces rowsum(P o dP)).
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
// the last bits. On sm_90 one vector atomic adds four neighbouring columns of dQ (a quad's lanes swap
// a column pair first): a quarter of the L2 requests of scalar atomics.
//
// Q_i and dO_i (with L_i, D_i) are double-buffered: the next work item is copied with cp.async while
// the current one computes, so a step needs two barriers and never waits for global memory.
//
// What changed from the forward, on the tensor-core side: P and dS are needed transposed (dV = P^T
// dO, dK = dS^T Q), so they make one trip through shared memory, where ldmatrix.trans reads them
// back as A operands. Each of the three phases of a step has its own warp grid (BwdConfig): S/dP as
// 2 x 4 warps over (Br, Bc), dK/dV as 4 x 2 over (Bc, D), dQ as 2 x 4 over (Br, D). No row
// reductions are needed (L_i and D_i are known), so any split of the rows over warps is free.
//
// Shape of the block, and why (bench/results/h100-fa2-notes.md has the measurements): with Bc = 64
// and warps of 16 rows or keys, each ldmatrix feeds at most two mma's and dQ reloads dS for every 16
// columns; ~1.3 mma per ldmatrix leaves the kernel bound by shared-memory bandwidth. With Bc = 128
// (d <= 128) and 32 x 32 warp tiles it is ~2.2, the ratio of FlashAttention-2's own sm80 kernels, and
// every Q_i, dO_i load and dQ atomic serves twice the keys; at d = 64 the block also takes Br = 128
// query rows per step. With the same mma and ldmatrix counts as PyTorch's FA2, what is left is
// instruction count, which the profiler pointed at: the mask only on tiles that need it, a stepped
// copy loop and 32-bit dQ offsets.
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

namespace flashlab::cuda::fa2 {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Block shape per head dim. 8 warps; each of the three products gets its own warp grid, so that
// every warp owns a 32 x 32 (or larger) piece of it: each ldmatrix fragment then feeds two or four
// mma's instead of one or two (the shared-memory bytes per FLOP are what bound mma.sync on the H100).
// kCompact: Br = Bc = 64 at every head dim, for GPUs that give a block less shared memory than an H100
// (227 KiB): an A100 has 163 KiB, and the full tiles need 171 (d = 128) and 178 KiB (d = 64); compact,
// 121 and 72 KiB. Compiled for d = 64 and 128 only; picked at launch (launch_main) when the full tiles do
// not fit; FLASHLAB_FA2_COMPACT_BACKWARD=1 forces it (tests).
template <int D, bool kCompact>
struct BwdConfig {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // d = 64: 128 query rows per step (FlashAttention-2's sm80 shape too): twice the math per barrier and
  // per K_j, V_j fragment (measured against Br = 64: bench/results/h100-fa2-notes.md); at d >= 96 the
  // registers forbid it.
  static constexpr int kBr = D == 64 && !kCompact ? 128 : 64;
  // D <= 128: 128 keys per block, so each Q_i, dO_i tile fetched and each dQ_i atomic serves twice the
  // keys of Bc = 64. D = 256: dK_j, dV_j alone take 128 registers per thread at 64 keys.
  static constexpr int kBc = D <= 128 && !kCompact ? 128 : 64;
  // S_ij, dP_ij (Br, Bc) over 2 x 4 warps: 32 query rows x Bc/4 keys each.
  static constexpr int kSdpWarpsN = 4;
  static constexpr int kSdpMT = kBr / (kWarps / kSdpWarpsN) / 16;  // m-tiles per warp
  static constexpr int kSdpNT = kBc / kSdpWarpsN / 8;              // n-tiles per warp
  // dK_j, dV_j (Bc, D) over 4 x 2 warps: Bc/4 keys x D/2 columns each, in registers for the whole walk.
  static constexpr int kKvWarpsN = 2;
  static constexpr int kKvMT = kBc / (kWarps / kKvWarpsN) / 16;
  static constexpr int kKvNT = D / kKvWarpsN / 8;
  // dQ_i (Br, D) over 2 x 4 warps, or 4 x 2 where D/4 columns would not be whole 16-column pairs
  // (d = 32, 96); computed in passes of at most 64 accumulators (d = 256: two passes).
  static constexpr int kDqWarpsN = (D / 4) % 16 == 0 && kBr == 64 ? 4 : 2;
  static constexpr int kDqMT = kBr / (kWarps / kDqWarpsN) / 16;
  static constexpr int kDqWarpCols = D / kDqWarpsN;
  static constexpr int kDqPassCols = kDqWarpCols * kDqMT <= 64 ? kDqWarpCols : 32;
  static constexpr int kDqNT = kDqPassCols / 8;
  static_assert(kSdpNT % 2 == 0 && kKvNT % 2 == 0 && kDqNT % 2 == 0, "ldmatrix_x4 loads n-tiles in pairs");
  static_assert(kDqWarpCols % kDqPassCols == 0, "dQ passes must cover the warp's columns");

  // cp.async copies per thread issued back to back (fa2_tile.cuh); the dropout kernels use the rolled
  // index loop (0): with the stepped one, d = 128 spills 16 bytes. Elsewhere the stepped loop, because
  // the index loop's address arithmetic is a visible share of a step's instructions (ncu:
  // bench/results/h100-fa2-notes.md).
  template <bool kDropout>
  static constexpr int kCopyUnroll = kDropout ? 0 : 4;
  static constexpr int kPitchS = kBc + kPad;  // P and dS tiles (Br, Bc), padded like the others
  static constexpr int kSmemBytes = (2 * kBc + 2 * 2 * kBr) * kPitch<D> * 2  // K_j, V_j; two stages of Q_i, dO_i
                                    + 2 * kBr * kPitchS * 2                  // P_ij, dS_ij
                                    + 2 * 2 * kBr * 4;                       // two stages of L_i (log2 units), D_i
};

// D_i = sum_d dO[i, d] O[i, d] in fp32; one warp per (batch, row, head).
template <class T>
__global__ void D_i_kernel(const Params p) {
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
  if (lane == 0) p.D_i[(std::int64_t(b) * p.heads_q + h) * p.seq_q + s] = sum;
}

template <class T>
__global__ void convert_dq_kernel(const Params p, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (p.dq_sum != nullptr) p.dq_sum[i] += p.dq_accum[i] * p.scale;  // accumulate mode
  else static_cast<T*>(p.dq)[i] = static_cast<T>(p.dq_accum[i] * p.scale);
}

// dst[0..3] += v in global memory, atomically per element (dst 16-byte aligned). sm_90 has a vector
// reduction (red.global.add.v4.f32): one L2 request for four columns of dQ instead of four.
__device__ __forceinline__ void add_quad_to_global(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// acc (kMT x kNT tiles of 16 x 8) += A B^T over kK columns, both operands row-major in shared memory
// with a pitch of kPitchEl elements: A is (16 kMT, kK) from this lane's x4 A-fragment address a_frag,
// B is (8 kNT, kK) from its x4 B-fragment address b_frag (lane L: row L % 8 + 8 (L / 16), half (L / 8) % 2).
template <class T, int kMT, int kNT, int kK, int kPitchEl>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[kMT][kNT][4], std::uint32_t a_frag, std::uint32_t b_frag) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    std::uint32_t a[kMT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) ldmatrix_x4(a[mi], a_frag + (mi * 16 * kPitchEl + kk * 16) * sizeof(T));
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      std::uint32_t bf[4];
      ldmatrix_x4(bf, b_frag + (np * 16 * kPitchEl + kk * 16) * sizeof(T));
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) {
        mma_16x8x16<T>(acc[mi][2 * np], a[mi], bf[0], bf[1]);
        mma_16x8x16<T>(acc[mi][2 * np + 1], a[mi], bf[2], bf[3]);
      }
    }
  }
}

// kAccumulate: dK_j, dV_j added to p.dk_sum, p.dv_sum in fp32 (a ring's block) rather than written to p.dk, p.dv.
// A template parameter, not a run-time branch: the branch made the d = 128 kernels spill.
template <class T, int D, bool kDropout, bool kCompact, bool kAccumulate = false>
__global__ void __launch_bounds__(BwdConfig<D, kCompact>::kThreads) backward_kernel(const Params p) {
  using Cfg = BwdConfig<D, kCompact>;
  constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kThreads = Cfg::kThreads, kPS = Cfg::kPitchS;
  constexpr int kSdpMT = Cfg::kSdpMT, kSdpNT = Cfg::kSdpNT, kKvMT = Cfg::kKvMT, kKvNT = Cfg::kKvNT;
  constexpr int kDqMT = Cfg::kDqMT, kDqNT = Cfg::kDqNT, kCopyUnroll = Cfg::template kCopyUnroll<kDropout>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  T* Ks = reinterpret_cast<T*>(smem_bytes);  // (Bc, D)
  T* Vs = Ks + kBc * kPitch<D>;              // (Bc, D)
  T* Qs0 = Vs + kBc * kPitch<D>;             // (2, Br, D): stage s at Qs0 + s * Br * pitch
  T* dOs0 = Qs0 + 2 * kBr * kPitch<D>;       // (2, Br, D)
  T* Ps = dOs0 + 2 * kBr * kPitch<D>;        // (Br, Bc): P_ij after dropout
  T* dSs = Ps + kBr * kPS;                   // (Br, Bc)
  float* Ls0 = reinterpret_cast<float*>(dSs + kBr * kPS);  // (2, Br): L_i * log2(e), +inf for empty rows
  float* D_i_s0 = Ls0 + 2 * kBr;                           // (2, Br): D_i

  const int n_block = static_cast<int>(blockIdx.x);
  const int b = static_cast<int>(blockIdx.y) / p.heads_kv, h_kv = static_cast<int>(blockIdx.y) % p.heads_kv;
  const int group = p.heads_q / p.heads_kv;
  const int col0 = n_block * kBc;
  const std::int64_t q_stride = std::int64_t(p.heads_q) * D, kv_stride = std::int64_t(p.heads_kv) * D;
  const std::int64_t kv_offset = (std::int64_t(b) * p.seq_k * p.heads_kv + h_kv) * D;

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int g = lane / 4, t = lane % 4;
  // This warp's piece of each product (rows x columns of the block's tile).
  const int sdp_row0 = warp / Cfg::kSdpWarpsN * kSdpMT * 16;     // S, dP: query rows
  const int sdp_col0 = warp % Cfg::kSdpWarpsN * kSdpNT * 8;      //        keys
  const int kv_row0 = warp / Cfg::kKvWarpsN * kKvMT * 16;        // dK, dV: keys
  const int kv_col0 = warp % Cfg::kKvWarpsN * kKvNT * 8;         //         head dim
  const int dq_row0 = warp / Cfg::kDqWarpsN * kDqMT * 16;        // dQ: query rows
  const int dq_col0 = warp % Cfg::kDqWarpsN * Cfg::kDqWarpCols;  //     head dim

  // Each lane's ldmatrix row address in every tile it reads, as 32-bit shared addresses: a fragment's
  // address is then one of these plus a compile-time offset, which ptxas can fold into the instruction,
  // so six registers per lane address every fragment of the step.
  // x4 A fragment: lane L reads row L % 16, column half L / 16; x4 B fragment (or a transposed A):
  // row L % 8 + 8 (L / 16), column half (L / 8) % 2; x4.trans B: row L % 8 + 8 ((L / 8) % 2), half L / 16.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 8;
  const int bt_row = (lane & 7) + ((lane >> 3) & 1) * 8, bt_col = (lane >> 4) * 8;
  const std::uint32_t q_frag = tile_addr<D>(Qs0, sdp_row0 + a_row, a_col);     // Q_i, dO_i (+ kDOBytes)
  const std::uint32_t k_frag = tile_addr<D>(Ks, sdp_col0 + b_row, b_col);      // K_j, V_j (+ kVBytes)
  const std::uint32_t pt_frag = smem_addr(Ps + b_row * kPS + kv_row0 + b_col);  // P^T, dS^T (+ kDSBytes)
  const std::uint32_t qt_frag = tile_addr<D>(Qs0, bt_row, kv_col0 + bt_col);   // Q_i, dO_i as B
  const std::uint32_t ds_frag = smem_addr(dSs + (dq_row0 + a_row) * kPS + a_col);  // dS as A
  const std::uint32_t kt_frag = tile_addr<D>(Ks, bt_row, dq_col0 + bt_col);       // K_j as B
  constexpr std::uint32_t kVBytes = kBc * kPitch<D> * sizeof(T), kDOBytes = 2 * kBr * kPitch<D> * sizeof(T);
  constexpr std::uint32_t kStageBytes = kBr * kPitch<D> * sizeof(T), kDSBytes = kBr * kPS * sizeof(T);

  load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Ks, static_cast<const T*>(p.k) + kv_offset + col0 * kv_stride,
                                                    kv_stride, p.seq_k - col0);
  load_tile_async<T, D, kBc, kThreads, kCopyUnroll>(Vs, static_cast<const T*>(p.v) + kv_offset + col0 * kv_stride,
                                                    kv_stride, p.seq_k - col0);
  cp_async_commit();

  // The first Q block that sees any key of this block (the mask is monotone in the row).
  const int Tr = (p.seq_q + kBr - 1) / kBr;
  int i_begin = 0;
  while (i_begin < Tr && tile_fully_masked(p.align, i_begin * kBr, min(i_begin * kBr + kBr, p.seq_q), col0,
                                           p.seq_q, p.seq_k))
    ++i_begin;

  float acc_dk[kKvMT][kKvNT][4], acc_dv[kKvMT][kKvNT][4];  // (Bc/4 keys, D/2) per warp
#pragma unroll
  for (int mi = 0; mi < kKvMT; ++mi)
#pragma unroll
    for (int nt = 0; nt < kKvNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[mi][nt][e] = acc_dv[mi][nt][e] = 0.f;

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
    load_tile_async<T, D, kBr, kThreads, kCopyUnroll>(Qs0 + stage * kBr * kPitch<D>,
                                                      static_cast<const T*>(p.q) + offset, q_stride, p.seq_q - row0);
    load_tile_async<T, D, kBr, kThreads, kCopyUnroll>(dOs0 + stage * kBr * kPitch<D>,
                                                      static_cast<const T*>(p.d_o) + offset, q_stride, p.seq_q - row0);
    cp_async_commit();
  };
  // Row threadIdx.x (< Br) of an item: L_i in log2 units, and D_i. exp2(S - (+inf)) = 0, so rows past the
  // end and rows that saw no key (L = -inf) contribute nothing.
  const auto read_row_stats = [&](int item, float& L2, float& D_i) {
    const int row = item_row0(item) + static_cast<int>(threadIdx.x);
    const std::int64_t at = (std::int64_t(b) * p.heads_q + item_head(item)) * p.seq_q + row;
    const float L = row < p.seq_q ? p.lse[at] : -INFINITY;
    L2 = L == -INFINITY ? INFINITY : L * kLog2e;
    D_i = row < p.seq_q ? p.D_i[at] : 0.f;
  };
  if (n_items > 0) {
    prefetch_tiles(0, 0);
    if (threadIdx.x < kBr) read_row_stats(0, Ls0[threadIdx.x], D_i_s0[threadIdx.x]);
  }

  for (int item = 0; item < n_items; ++item) {
    const int stage = item & 1;
    const int h = item_head(item), row0 = item_row0(item);
    const std::int64_t q_offset = (std::int64_t(b) * p.seq_q * p.heads_q + h) * D;
    const float* Ls = Ls0 + stage * kBr;
    const float* D_i_s = D_i_s0 + stage * kBr;
    const std::uint32_t stage_bytes = stage * kStageBytes;  // Q_i, dO_i of this item
    // Item `item` has landed, and every warp is done with the other stage and with P, dS.
    cp_async_wait<0>();
    __syncthreads();
    float next_L2 = 0.f, next_D_i = 0.f;
    if (item + 1 < n_items) {
      prefetch_tiles(item + 1, stage ^ 1);
      if (threadIdx.x < kBr) read_row_stats(item + 1, next_L2, next_D_i);
    }

    // S_ij = Q_i K_j^T on this warp's (32 rows, Bc/4 keys), then P_ij = exp2(scale log2e S - L log2e)
    // in place, masked. S and dP are computed one after the other (not in one k loop): only one
    // product's fragments are live at a time, which keeps d = 128 within 255 registers.
    const bool needs_mask = tile_needs_mask(p.align, row0, col0 + kBc, p.seq_q, p.seq_k);
    float pr[kSdpMT][kSdpNT][4] = {};  // S_ij, then P_ij (before dropout), fp32
    warp_mma_abt<T, kSdpMT, kSdpNT, D, kPitch<D>>(pr, q_frag + stage_bytes, k_frag);
    // Two copies of the loop: only tiles that straddle the diagonal or the end of the keys pay for the mask.
    const auto exponentiate = [&]<bool kMasked>() {
#pragma unroll
      for (int mi = 0; mi < kSdpMT; ++mi)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = row0 + sdp_row0 + mi * 16 + g + 8 * hf;
          const float L = Ls[sdp_row0 + mi * 16 + g + 8 * hf];
          int last = 0;  // the last visible key, relative to this lane's first column
          if constexpr (kMasked) last = last_visible_key(p.align, row, p.seq_q, p.seq_k) - col0 - sdp_col0 - 2 * t;
#pragma unroll
          for (int nt = 0; nt < kSdpNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float prob = fast_exp2(pr[mi][nt][2 * hf + e] * p.scale_log2 - L);
              pr[mi][nt][2 * hf + e] = kMasked && nt * 8 + e > last ? 0.f : prob;
            }
        }
    };
    if (needs_mask) exponentiate.template operator()<true>();
    else exponentiate.template operator()<false>();

    // dP_ij = dO_i V_j^T; dS_ij = P_ij o (dP_ij - D_i); dropout on both. P and dS go to shared memory.
    float dp[kSdpMT][kSdpNT][4] = {};
    warp_mma_abt<T, kSdpMT, kSdpNT, D, kPitch<D>>(dp, q_frag + stage_bytes + kDOBytes, k_frag + kVBytes);
#pragma unroll
    for (int mi = 0; mi < kSdpMT; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = sdp_row0 + mi * 16 + g + 8 * hf;  // row within the block
        const float D_i = D_i_s[r];
        std::uint32_t keep = 0;
        if constexpr (kDropout) keep = dropout_keep_bits<kSdpNT>(p, b, h, row0 + r, col0 + sdp_col0 + 2 * t, t);
#pragma unroll
        for (int nt = 0; nt < kSdpNT; ++nt) {
          const int c = sdp_col0 + nt * 8 + 2 * t;  // column within the block (even)
          float kept[2], ds[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float prob = pr[mi][nt][2 * hf + e];
            float dprob = dp[mi][nt][2 * hf + e];
            kept[e] = prob;
            if constexpr (kDropout) {
              const float z = (keep >> (2 * nt + e)) & 1u ? p.drop_rescale : 0.f;
              kept[e] *= z;  // P after dropout, what O used
              dprob *= z;    // dP w.r.t. the undropped P
            }
            ds[e] = prob * (dprob - D_i);
          }
          *reinterpret_cast<std::uint32_t*>(Ps + r * kPS + c) = MmaType<T>::pack(kept[0], kept[1]);
          *reinterpret_cast<std::uint32_t*>(dSs + r * kPS + c) = MmaType<T>::pack(ds[0], ds[1]);
        }
      }
    __syncthreads();

    // dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i on this warp's (Bc/4 keys, D/2 columns).
#pragma unroll
    for (int kq = 0; kq < kBr / 16; ++kq) {
      std::uint32_t ap[kKvMT][4], ads[kKvMT][4];
#pragma unroll
      for (int mi = 0; mi < kKvMT; ++mi) {
        const std::uint32_t at = (kq * 16 * kPS + mi * 16) * sizeof(T);
        ldmatrix_x4_trans(ap[mi], pt_frag + at);
        ldmatrix_x4_trans(ads[mi], pt_frag + kDSBytes + at);
      }
#pragma unroll
      for (int dn = 0; dn < kKvNT / 2; ++dn) {
        const std::uint32_t at = (kq * 16 * kPitch<D> + dn * 16) * sizeof(T);
        std::uint32_t bdo[4], bq[4];
        ldmatrix_x4_trans(bdo, qt_frag + stage_bytes + kDOBytes + at);
        ldmatrix_x4_trans(bq, qt_frag + stage_bytes + at);
#pragma unroll
        for (int mi = 0; mi < kKvMT; ++mi) {
          mma_16x8x16<T>(acc_dv[mi][2 * dn], ap[mi], bdo[0], bdo[1]);
          mma_16x8x16<T>(acc_dv[mi][2 * dn + 1], ap[mi], bdo[2], bdo[3]);
          mma_16x8x16<T>(acc_dk[mi][2 * dn], ads[mi], bq[0], bq[1]);
          mma_16x8x16<T>(acc_dk[mi][2 * dn + 1], ads[mi], bq[2], bq[3]);
        }
      }
    }

    // dQ_i += dS_ij K_j (scaled in convert_dq_kernel) on this warp's (rows, columns), added to dQ_accum
    // four neighbouring columns per atomic: the two lanes t, t^1 of a quad swap one column pair each.
    // This lane's first dQ element (row g of the warp's rows; its first quad's column), and how many of
    // its rows exist. Offsets within the item fit in 32 bits: fa2.cu refuses batch x heads_q > 65535.
    const bool even = (t & 1) == 0;
    const int q_pitch = p.heads_q * D;
    float* dq_lane =
        p.dq_accum + q_offset + row0 * q_stride + ((dq_row0 + g) * q_pitch + dq_col0 + (even ? 2 * t : 2 * t + 6));
    const int lane_rows = p.seq_q - row0 - dq_row0 - g;
#pragma unroll 1  // d = 256: two passes; rolled, so the second does not double the live registers
    for (int pc = 0; pc < Cfg::kDqWarpCols; pc += Cfg::kDqPassCols) {
      float acc[kDqMT][kDqNT][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        std::uint32_t a[kDqMT][4];
#pragma unroll
        for (int mi = 0; mi < kDqMT; ++mi) ldmatrix_x4(a[mi], ds_frag + (mi * 16 * kPS + kk * 16) * sizeof(T));
#pragma unroll
        for (int np = 0; np < kDqNT / 2; ++np) {
          std::uint32_t bk[4];
          ldmatrix_x4_trans(bk, kt_frag + (kk * 16 * kPitch<D> + pc + np * 16) * sizeof(T));
#pragma unroll
          for (int mi = 0; mi < kDqMT; ++mi) {
            mma_16x8x16<T>(acc[mi][2 * np], a[mi], bk[0], bk[1]);
            mma_16x8x16<T>(acc[mi][2 * np + 1], a[mi], bk[2], bk[3]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < kDqMT; ++mi)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int r = mi * 16 + 8 * hf;  // row of this lane, relative to its first
#pragma unroll
          for (int np = 0; np < kDqNT / 2; ++np) {
            // Lane t holds columns 2t, 2t+1 of n-tiles 2np (lo) and 2np+1 (hi). Even t keeps lo and takes
            // its neighbour's lo (columns 2t+2, 2t+3); odd t keeps hi and takes its neighbour's hi.
            const float* lo = acc[mi][2 * np] + 2 * hf;
            const float* hi = acc[mi][2 * np + 1] + 2 * hf;
            const float give0 = even ? hi[0] : lo[0], give1 = even ? hi[1] : lo[1];
            const float take0 = __shfl_xor_sync(0xffffffffu, give0, 1);
            const float take1 = __shfl_xor_sync(0xffffffffu, give1, 1);
            if (r >= lane_rows) continue;
            const float4 quad =
                even ? make_float4(lo[0], lo[1], take0, take1) : make_float4(take0, take1, hi[0], hi[1]);
            add_quad_to_global(dq_lane + (r * q_pitch + pc + np * 16), quad);
          }
        }
    }
    if (item + 1 < n_items && threadIdx.x < kBr) {
      Ls0[(stage ^ 1) * kBr + threadIdx.x] = next_L2;
      D_i_s0[(stage ^ 1) * kBr + threadIdx.x] = next_D_i;
    }
  }

  cp_async_wait<0>();  // a block with no work never waited for K_j, V_j

  // dK_j = scale * sum_i dS_ij^T Q_i; dV_j as accumulated. Rows past the end of the keys are dropped.
  if constexpr (kAccumulate) {  // added to the fp32 sums instead
    float* dk = p.dk_sum + kv_offset + col0 * kv_stride;
    float* dv = p.dv_sum + kv_offset + col0 * kv_stride;
#pragma unroll
    for (int mi = 0; mi < kKvMT; ++mi)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = kv_row0 + mi * 16 + g + 8 * hf;
        if (col0 + r >= p.seq_k) continue;
#pragma unroll
        for (int nt = 0; nt < kKvNT; ++nt) {
          const int c = kv_col0 + nt * 8 + 2 * t;
          float2* at_k = reinterpret_cast<float2*>(dk + r * kv_stride + c);
          float2* at_v = reinterpret_cast<float2*>(dv + r * kv_stride + c);
          const float2 sk = *at_k, sv = *at_v;
          *at_k = make_float2(sk.x + acc_dk[mi][nt][2 * hf] * p.scale, sk.y + acc_dk[mi][nt][2 * hf + 1] * p.scale);
          *at_v = make_float2(sv.x + acc_dv[mi][nt][2 * hf], sv.y + acc_dv[mi][nt][2 * hf + 1]);
        }
      }
    return;
  }
  T* dk = static_cast<T*>(p.dk) + kv_offset + col0 * kv_stride;
  T* dv = static_cast<T*>(p.dv) + kv_offset + col0 * kv_stride;
#pragma unroll
  for (int mi = 0; mi < kKvMT; ++mi)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = kv_row0 + mi * 16 + g + 8 * hf;
      if (col0 + r >= p.seq_k) continue;
#pragma unroll
      for (int nt = 0; nt < kKvNT; ++nt) {
        const int c = kv_col0 + nt * 8 + 2 * t;
        *reinterpret_cast<std::uint32_t*>(dk + r * kv_stride + c) =
            MmaType<T>::pack(acc_dk[mi][nt][2 * hf] * p.scale, acc_dk[mi][nt][2 * hf + 1] * p.scale);
        *reinterpret_cast<std::uint32_t*>(dv + r * kv_stride + c) =
            MmaType<T>::pack(acc_dv[mi][nt][2 * hf], acc_dv[mi][nt][2 * hf + 1]);
      }
    }
}

template <class T, int D, bool kDropout, bool kCompact, bool kAccumulate>
void launch_tiles(const Params& p, cudaStream_t stream) {
  using Cfg = BwdConfig<D, kCompact>;
  auto kernel = backward_kernel<T, D, kDropout, kCompact, kAccumulate>;
  require_shared_memory(Cfg::kSmemBytes, "cuda-fa2 backward at head dim " + std::to_string(D));
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Cfg::kSmemBytes);
  const dim3 grid((p.seq_k + Cfg::kBc - 1) / Cfg::kBc, p.batch * p.heads_kv);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

// The full tiles where they fit in the GPU's shared memory, else the compact ones (BwdConfig). Accumulate mode
// (a ring's block) is compiled without dropout only: the ring has none.
template <class T, int D, bool kDropout>
void launch_main(const Params& p, cudaStream_t stream) {
  const auto go = [&]<bool kCompact>() {
    if constexpr (!kDropout) {
      if (p.dk_sum != nullptr) return launch_tiles<T, D, kDropout, kCompact, true>(p, stream);
    } else if (p.dk_sum != nullptr) {
      throw std::logic_error("cuda-fa2 backward: accumulate mode has no dropout");
    }
    launch_tiles<T, D, kDropout, kCompact, false>(p, stream);
  };
  using Full = BwdConfig<D, false>;
  // Compact tiles exist where the full ones outgrow an A100 (d = 32 and 96 fit, d = 256 fits no Ampere).
  if constexpr (D == 64 || D == 128) {
    if (p.compact_backward || Full::kSmemBytes > shared_memory_per_block()) return go.template operator()<true>();
  }
  go.template operator()<false>();
}

template <class T>
void launch_for_dtype(const Params& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const std::int64_t rows = std::int64_t(p.batch) * p.seq_q * p.heads_q;
  D_i_kernel<T><<<static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();

  dispatch_head_dim<kHeadDims>(p.head_dim, "cuda-fa2 backward", [&]<int D>() {
    if (p.dropout) launch_main<T, D, true>(p, stream);
    else launch_main<T, D, false>(p, stream);
  });

  const std::int64_t n = rows * p.head_dim;
  convert_dq_kernel<T><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_backward(DType dtype, const Params& p, cudaStream_t stream) {
  if (p.seq_q == 0 || p.seq_k == 0 || p.batch == 0) return;
  const int sums = (p.dq_sum != nullptr) + (p.dk_sum != nullptr) + (p.dv_sum != nullptr);
  if (sums != 0 && sums != 3)
    throw std::logic_error("cuda-fa2 backward: accumulate mode needs all three of dq_sum, dk_sum and dv_sum");
  if (dtype == DType::F16) return launch_for_dtype<__half>(p, stream);
  if (dtype == DType::BF16) return launch_for_dtype<__nv_bfloat16>(p, stream);
  throw std::logic_error("cuda-fa2 backward: dtype must be f16 or bf16");
}

}  // namespace flashlab::cuda::fa2
