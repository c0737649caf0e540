#pragma once
// cuda-fa3-ws backward, dQ's conversion (convert_dq_kernel): dQ = scale dQ_accum in the input dtype, a 64 x 64 piece
// at a time as soon as its sum is complete, overlapping the main kernel's last wave.
#include <cstdint>

#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_dq.cuh"
#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {

// dQ = scale dQ_accum in the input dtype, a piece (64 x 64) at a time, each as soon as its sum is complete: the
// kernel is launched while the main kernel runs (programmatic dependent launch, once every K/V block has started),
// so it converts on the SMs the main kernel's last wave leaves idle. A block takes the pieces in order from a
// ticket, waits until the piece's counter has all its additions (dq_additions), and converts it; at the end it
// waits for the main kernel to finish, so that work queued after the backward sees dK and dV written too.
// (Measured on the H100: the backward runs faster with it overlapped, most at d = 128; the figures are in
// bench/results/h100-fa3-ws-backward-notes.md.) Without a writer warp (d = 256) the additions
// are not counted in default mode, and the conversion waits for the main kernel first.
// stage_dq wrote thread `thread`'s registers 4 q .. 4 q + 3 of a piece as vector q * 128 + thread, and in wgmma's
// accumulator layout (thread = 32 w + 4 g + t) those are columns cc, cc + 1 of rows r and r + 8, with r = 16 w + g
// and cc = 8 q + 2 t of the piece: two 4-byte stores of dQ per vector, read in order (coalesced). (As fast as two
// columns a thread gathered from the staged order; four vectors a thread and 16-byte stores were slower.)
constexpr int kConvertThreads = 256;
template <class T, int D, int kC = kConsumers>
__global__ void __launch_bounds__(kConvertThreads) convert_dq_kernel(const Params p, int n_q) {
  using Cfg = BwdConfig<D, false, kC>;  // (dQ's pieces and their additions do not depend on dropout)
  constexpr int kVectors = Cfg::kDqPieceFloats / 4;  // per piece
  static_assert(kVectors % kConvertThreads == 0, "a block converts whole pieces");
  const int pieces = p.batch * p.heads_q * n_q * Cfg::kDqPieces;  // over (B, H_q, query block i, piece c)
  int* const ticket = p.dq_semaphore + pieces;
  // d = 256 (no writer warp): not counted in default mode, so wait for the whole main kernel.
  if constexpr (!Cfg::kDqWriter) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ int taken[2];  // double-buffered: one barrier a piece
  for (int round = 0;; ++round) {
    if (threadIdx.x == 0) {
      const int piece = atomicAdd(ticket, 1);
      if (Cfg::kDqWriter && piece < pieces)  // the main kernel's blocks are still running: poll gently
        wait_counter<500>(p.dq_semaphore + piece, dq_additions<Cfg>(p, piece / Cfg::kDqPieces % n_q));
      taken[round % 2] = piece;
    }
    __syncthreads();
    const int piece = taken[round % 2];
    if (piece >= pieces) break;
    const int c = piece % Cfg::kDqPieces, i = piece / Cfg::kDqPieces % n_q, bh = piece / Cfg::kDqPieces / n_q;
    const int h = bh % p.heads_q, b = bh / p.heads_q;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + std::int64_t(piece) * Cfg::kDqPieceFloats);
    float4 v[kVectors / kConvertThreads];
#pragma unroll
    for (int k = 0; k < kVectors / kConvertThreads; ++k) v[k] = __ldcg(src + k * kConvertThreads + threadIdx.x);
#pragma unroll
    for (int k = 0; k < kVectors / kConvertThreads; ++k) {
      const int vec = k * kConvertThreads + static_cast<int>(threadIdx.x);
      const int q = vec / kWarpgroupThreads, thread = vec % kWarpgroupThreads;
      // (Br = 128 at d = 64: piece c is rows 64 c .. 64 c + 63 of the query block, all columns.)
      const int r = 16 * (thread / 32) + (thread % 32) / 4 + (Cfg::kDqRowPieces ? 64 * c : 0);
      const int col = (Cfg::kDqRowPieces ? 0 : c * Cfg::kDqCols) + 8 * q + 2 * (thread % 4);
      const float pair[2][2] = {{v[k].x, v[k].y}, {v[k].z, v[k].w}};
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int s = i * Cfg::kBr + r + 8 * hf;
        if (s >= p.seq_q) continue;
        const std::int64_t at = ((std::int64_t(b) * p.seq_q + s) * p.heads_q + h) * D + col;
        if (p.dq_sum != nullptr) {  // accumulate mode
          float2* sum = reinterpret_cast<float2*>(p.dq_sum + at);
          const float2 was = *sum;
          *sum = make_float2(was.x + pair[hf][0] * p.scale, was.y + pair[hf][1] * p.scale);
        } else {
          *reinterpret_cast<std::uint32_t*>(static_cast<T*>(p.dq) + at) = pack2<T>(pair[hf][0] * p.scale, pair[hf][1] * p.scale);
        }
      }
    }
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
