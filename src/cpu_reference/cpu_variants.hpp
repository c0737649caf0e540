#pragma once
// The CPU rows of the variant table (registry/variants.cpp): the naive and tiled implementations behind
// the common forward/backward signatures, dispatching DType F64 -> double and F32 -> float. What they
// accept is exported below as data; the registry checks a problem against it before calling in.
// An observer given to a forward sees elements of the dtype's size (8 bytes for f64, 4 for f32).
// cpu-naive throws InputError, before allocating, when its S and P would not fit in MemAvailable.
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/tiled.hpp"

namespace flashlab {

namespace cpu {
inline constexpr DType kDTypes[] = {DType::F64, DType::F32};
inline constexpr int kMaxHeadDim = 256;  // every head dim up to validate()'s limit
}  // namespace cpu

ForwardOut cpu_naive_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_naive_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
ForwardOut cpu_fa1_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_fa1_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
ForwardOut cpu_fa2_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cpu_fa2_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);

// Block sizes the cpu-fa1/cpu-fa2 variants use for a head dim (the trace uses the paper's rule).
Tiling cpu_variant_tiling(int head_dim);

}  // namespace flashlab
