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
#include <algorithm>
#include <limits>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/blocks.hpp"
#include "cpu_reference/tile_trace.hpp"
#include "cpu_reference/tiled.hpp"

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

// Which share of a nest to walk: the (batch * head) values in [bh_begin, bh_end), the query blocks in
// [i_begin, i_end) and, for standard attention, one phase. The default is the whole nest. A forward nest
// only walks a share when counting (count_part_traffic); with arithmetic it always walks all of it.
struct NestRange {
  static constexpr int kAll = std::numeric_limits<int>::max();
  int bh_begin = 0, bh_end = kAll;
  int i_begin = 0, i_end = kAll;
  NestPhase phase = NestPhase::All;
  bool walks(NestPhase p) const { return phase == NestPhase::All || phase == p; }
};

// The FA1 or FA2 nest of a pass (algorithm is FA1 or FA2: the caller has rejected Standard).
// Instantiated for <double, true>, <float, true> and, count-only, <double, false>.
template <class T, bool kArith>
void forward_nest(Algorithm, const Problem&, const Blocks&, const ForwardArgs&, TileTrace&, const NestRange& = {});
template <class T, bool kArith>
void backward_nest(Algorithm, const Problem&, const Blocks&, const BackwardArgs&, TileTrace&);

// Standard attention's traffic, count-only: its numbers are naive.cpp's.
void standard_walk(Pass, const Problem&, const Blocks&, TileTrace&, const NestRange& = {});

}  // namespace flashlab::detail
