#pragma once
// Tiled attention with online softmax: the FlashAttention algorithm on the CPU, in both loop orders.
// Each algorithm and pass has one loop nest (tiled_forward.cpp, tiled_backward.cpp). It computes the
// numbers (O, LSE, dQ, dK, dV), reports every HBM <-> SRAM tile transfer to an optional observer,
// and in count-only mode walks the same nest with no arithmetic, so the traffic of N = 128k is
// counted in milliseconds. The listings that TileEvent::line points into are model/pseudocode.hpp's.
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "model/tiling.hpp"
#include "model/traffic.hpp"

namespace flashlab {

// The loop order is the algorithm: FA1 keeps the K/V block loop outer, FA2 the Q block loop (in the
// forward pass; both keep K/V outer in the backward pass). Algorithm::Standard is an InputError here.

// Tiled forward in T (double or float). The observer sees bytes of bytes_per_element per element
// (the dtype a GPU would move, not T).
template <class T>
ForwardOut tiled_forward(Algorithm, const Problem&, const Qkv&, Tiling, TrafficObserver* = nullptr,
                         int bytes_per_element = 2);
// Tiled backward: recomputes S and P from the saved statistics (FA2: the LSE L; FA1: m and l, whose
// numbers it takes from L = m + log(l)) and D_i = rowsum(dO_i o O_i).
template <class T>
Grads tiled_backward(Algorithm, const Problem&, const Qkv&, const ForwardOut&, const HostTensor& dO, Tiling,
                     TrafficObserver* = nullptr, int bytes_per_element = 2);

// Count-only: the events of `algorithm`'s loop nest (Standard, FA1, FA2) for the problem, without
// arithmetic. Standard attention reports S and P written to and read from HBM.
void count_traffic(Algorithm, Pass, const Problem&, Tiling, int bytes_per_element, TrafficObserver&);

// A share of a forward loop nest: what one GPU thread block (or a run of them) executes, for the GPU
// level of the traffic model (model/gpu.hpp). The phases are standard attention's three kernels: S = QK^T,
// P = softmax(S), O = PV; the FlashAttention nests have one phase (All).
enum class NestPhase { All, Scores, Softmax, Output };
struct NestPart {
  int bh = -1;                       // batch * heads_q + head; -1: every one
  int i = -1;                        // query block; -1: every one (FA1 needs every one: its i loop is inner)
  NestPhase phase = NestPhase::All;  // standard attention: one kernel's phase, or All
};
// Count-only, forward: the events of that share, exactly as the whole walk emits them and in the same
// order (only TileEvent::index and the SRAM ledger start from 0). Walking every part in the nest's order
// gives the whole walk. Throws InputError for a part outside the problem, a phase on a FlashAttention
// nest, or a query block on FA1.
void count_part_traffic(Algorithm, const Problem&, Tiling, int bytes_per_element, const NestPart&, TrafficObserver&);

}  // namespace flashlab
