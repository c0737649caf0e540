#pragma once
// Closed forms of the memory an algorithm needs beyond its inputs and outputs. The CPU reference,
// the CUDA kernels and the CLI refuse problems that will not fit by asking these, before allocating.
#include <cstdint>

#include "core/problem.hpp"

namespace flashlab {

// Bytes standard (naive) attention needs beyond its inputs and outputs: S and P, and in the backward
// pass dP and dS, each (S_q, S_k), for one (batch, head) at a time. Saturates at INT64_MAX.
std::int64_t naive_extra_bytes(const Shape&, int bytes_per_element, bool backward);

}  // namespace flashlab
