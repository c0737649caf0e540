#pragma once
// Internal to src/cpu_reference: the loop nests behind tiled.hpp, one per algorithm and pass.
// tiled.cpp validates the input and calls these; tiled_forward.cpp, tiled_backward.cpp and
// standard_walk.cpp define them.
//
// Each FlashAttention nest is a template over kArith. kArith = true: the numbers (Eigen block products
// on contiguous tile copies, the tiles' "SRAM"). kArith = false: count-only, the same nest with every
// arithmetic block compiled out, so traffic for N = 128k is walked in milliseconds. Both report the
// same TileEvents (tensor, tile, bytes, direction, loop indices, pseudocode line, SRAM in use) to
// the observer; the tests check that the two streams are identical.
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/blocks.hpp"
#include "cpu_reference/tile_trace.hpp"

namespace flashlab::detail {

// Arguments of a nest. In count-only mode every pointer is null and nothing is read.
struct ForwardArgs {
  const Qkv* in = nullptr;
  ForwardOut* out = nullptr;
};
struct BackwardArgs {
  const Qkv* in = nullptr;
  const ForwardOut* fwd = nullptr;
  const HostTensor* dO = nullptr;
  Grads* grads = nullptr;
};

// The FA1 or FA2 nest of a pass (algorithm is FA1 or FA2: the caller has rejected Standard).
// Instantiated for <double, true>, <float, true> and, count-only, <double, false>.
template <class T, bool kArith>
void forward_nest(Algorithm, const Problem&, const Blocks&, const ForwardArgs&, TileTrace&);
template <class T, bool kArith>
void backward_nest(Algorithm, const Problem&, const Blocks&, const BackwardArgs&, TileTrace&);

// Standard attention's traffic, count-only: its numbers are naive.cpp's.
void standard_walk(Pass, const Problem&, const Blocks&, TileTrace&);

}  // namespace flashlab::detail
