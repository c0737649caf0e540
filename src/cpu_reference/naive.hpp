#pragma once
// Standard attention, as frameworks ran it before FlashAttention: S = scale * Q K^T and P = softmax(S)
// are materialized as (S_q, S_k) matrices per head, then O = P V. Forward and backward, computed in T
// (double: the ground truth; float). Memory: O(S_q * S_k) per head, which is the point of lesson 01.
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "model/memory.hpp"  // naive_extra_bytes

namespace flashlab {

class TrafficObserver;

// With an observer, also reports standard attention's HBM traffic (count_traffic(Standard, ...)),
// blocked like the CPU variants (cpu_variant_tiling) with sizeof(T) bytes per element.
template <class T>
ForwardOut naive_forward(const Problem&, const Qkv&, TrafficObserver* = nullptr);
template <class T>
Grads naive_backward(const Problem&, const Qkv&, const ForwardOut&, const HostTensor& dO);

// The low-precision baseline of the tolerance rule: naive attention with S, P, O (and in the backward
// pass dP, dS and the gradients) rounded to dtype (F16 or BF16) after each matmul or softmax, with
// fp32 accumulation, the way a framework runs it in that precision.
ForwardOut naive_forward_lowp(const Problem&, DType, const Qkv&);
Grads naive_backward_lowp(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);

}  // namespace flashlab
