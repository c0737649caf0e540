#pragma once
// The head dims each pass of cuda-fa3-ws is compiled for (cuda/constraints.hpp: fa3_ws::kHeadDims, kBackwardHeadDims),
// as the launchers assert them before they dispatch (cuda/dispatch.cuh): the registry refused any other head dim
// with the list in words, so one that reaches a launcher is a bug of its caller (host_checks.hpp's expect).
#include <cstddef>
#include <iterator>
#include <string>

#include "cuda/constraints.hpp"

namespace flashlab::cuda::fa3_ws {

// Whether `head_dim` is in the list.
template <const auto& kHeadDims>
bool lists_head_dim(int head_dim) {
  for (const int d : kHeadDims)
    if (d == head_dim) return true;
  return false;
}
// The list as words: "64, 128 and 256".
template <const auto& kHeadDims>
std::string listed_head_dims() {
  std::string dims;
  for (std::size_t i = 0; i < std::size(kHeadDims); ++i)
    dims += (i == 0 ? "" : i + 1 == std::size(kHeadDims) ? " and " : ", ") + std::to_string(kHeadDims[i]);
  return dims;
}

}  // namespace flashlab::cuda::fa3_ws
