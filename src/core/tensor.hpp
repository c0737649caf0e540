#pragma once
// Host tensors. Values are held in double whatever precision a variant computes in: inputs are
// rounded to the variant's dtype once, before anyone (the reference included) sees them, and
// outputs are exactly representable in it. Row-major; dims are outermost first.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashlab {

struct HostTensor {
  std::vector<std::int64_t> dims;
  std::vector<double> data;

  HostTensor() = default;
  explicit HostTensor(std::vector<std::int64_t> d, double fill = 0.0);
  std::int64_t numel() const { return static_cast<std::int64_t>(data.size()); }
  std::string dims_string() const;  // "(2, 128, 8, 64)"
  // (b, s, h, d) element of a 4-d tensor.
  double& at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
    return data[((b * dims[1] + s) * dims[2] + h) * dims[3] + d];
  }
  double at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return data[((b * dims[1] + s) * dims[2] + h) * dims[3] + d];
  }
};

// Expected dims of each tensor of a problem.
std::vector<std::int64_t> q_dims(const Shape&);    // (B, S_q, H_q, D)
std::vector<std::int64_t> kv_dims(const Shape&);   // (B, S_k, H_kv, D)
std::vector<std::int64_t> lse_dims(const Shape&);  // (B, H_q, S_q)

struct Qkv {
  HostTensor q, k, v;
};
struct ForwardOut {
  HostTensor o;    // (B, S_q, H_q, D)
  HostTensor lse;  // (B, H_q, S_q), natural log; -inf for a fully masked row
};
struct Grads {
  HostTensor dq, dk, dv;  // shaped like q, k, v
};

// Fresh standard-normal inputs (and dO), rounded to dtype. Deterministic in seed. E4M3 throws InputError (see
// round_to).
Qkv random_qkv(const Shape&, DType, std::uint64_t seed);
HostTensor random_like_o(const Shape&, DType, std::uint64_t seed);

// Round every element to the nearest value representable in dtype (round-to-nearest-even). E4M3 throws
// InputError: e4m3 needs a scale per head first (cpu_reference/fp8.hpp, quantize_e4m3_per_head).
void round_to(HostTensor&, DType);

// Throws InputError naming the tensor unless q, k, v (and dO when given) have the problem's dims.
void check_dims(const Shape&, const Qkv&, const HostTensor* dO = nullptr);

// The NaN and +-Inf elements of a tensor: how many, and the index of the first in row-major order
// (one entry per dim, outermost first: (b, s, h, d) for a 4-d tensor; empty when count == 0).
struct NonFinite {
  std::int64_t count = 0;
  std::vector<std::int64_t> first;
};
NonFinite first_non_finite(const HostTensor&);

}  // namespace flashlab
