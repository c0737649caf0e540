#pragma once
// From a runtime head dim to a compile-time one. Each kernel family is compiled once per head dim in
// its list in cuda/constraints.hpp (simt::kPaddedHeadDims, fa2::kHeadDims); a launcher says
//
//   dispatch_head_dim<fa2::kHeadDims>(p.head_dim, "cuda-fa2 forward", [&]<int D>() { launch<T, D>(p); });
//
// and the fold below instantiates the lambda for exactly the listed head dims and calls the one that
// matches. The registry checks every problem against the same list before calling in, so a head dim
// that is not listed reaching this point is a bug (std::logic_error), not a user error.
#include <cstddef>
#include <iterator>
#include <stdexcept>
#include <string>
#include <utility>

namespace flashlab::cuda {

template <const auto& kHeadDims, class F>
void dispatch_head_dim(int head_dim, const char* kernel, F&& launch) {
  const bool found = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return ((head_dim == kHeadDims[I] && (launch.template operator()<kHeadDims[I]>(), true)) || ...);
  }(std::make_index_sequence<std::size(kHeadDims)>{});
  if (!found)
    throw std::logic_error(std::string(kernel) + ": head dim " + std::to_string(head_dim) +
                           " has no compiled kernel (cuda/constraints.hpp lists the ones that do; the registry "
                           "should have refused it)");
}

}  // namespace flashlab::cuda
