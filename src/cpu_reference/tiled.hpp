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

}  // namespace flashlab
