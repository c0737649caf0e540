#pragma once
// The CPU rows of the variant table (core/variants.cpp): the naive and tiled implementations behind
// the common forward/backward signatures, dispatching DType F64 -> double and F32 -> float.
// An observer given to a forward sees elements of the dtype's size (8 bytes for f64, 4 for f32).
// cpu-naive throws InputError, before allocating, when its S and P would not fit in MemAvailable.
#include "../core/variants.hpp"
#include "tiled.hpp"

namespace flashlab {

ForwardOut cpu_naive_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_naive_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
ForwardOut cpu_fa1_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_fa1_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
ForwardOut cpu_fa2_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_fa2_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);

// Block sizes the cpu-fa1/cpu-fa2 variants use for a head dim (the trace uses the paper's rule).
Tiling cpu_variant_tiling(int head_dim);

}  // namespace flashlab
