#pragma once
// Ring attention, exactly, on P virtual ranks of one CPU: sequence parallelism as model/ring.hpp's
// schedule runs it. Each rank keeps its queries; the K/V shares travel round the ring, one hop per
// step, and each rank folds every block it computes into its running (O, L) through the logsumexp
// (lse_merge.hpp). The backward pass sends each share's dK/dV partial sums along with it and brings
// them home with one more hop. Nothing here decides who computes what: the schedule does.
//
// Computed in T (double: checked against naive attention to 1e-12; float). Dropout is not supported.
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "model/ring.hpp"

namespace flashlab {

// O (B, S_q, H_q, D) and L (B, H_q, S_q) of attention, computed by the ring. Throws InputError for a bad
// problem, a schedule made for other lengths or another causal alignment, or dropout_p > 0.
template <class T>
ForwardOut ring_forward(const RingSchedule&, const Problem&, const Qkv&);

// dQ, dK, dV from the forward's O and L and the output gradient dO (B, S_q, H_q, D).
template <class T>
Grads ring_backward(const RingSchedule&, const Problem&, const Qkv&, const ForwardOut&, const HostTensor& dO);

}  // namespace flashlab
