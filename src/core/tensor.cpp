#include "core/tensor.hpp"

#include <cmath>
#include <random>
#include <sstream>

#include "core/half.hpp"

namespace flashlab {

static std::size_t product(const std::vector<std::int64_t>& dims) {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

HostTensor::HostTensor(std::vector<std::int64_t> d, double fill) : dims(std::move(d)), data(product(dims), fill) {}

std::string HostTensor::dims_string() const {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ")";
  return os.str();
}

NonFinite first_non_finite(const HostTensor& t) {
  NonFinite found;
  for (std::size_t n = 0; n < t.data.size(); ++n) {
    if (std::isfinite(t.data[n])) continue;
    if (found.count++ > 0) continue;
    // Unravel the flat row-major offset into one index per dim, innermost last.
    found.first.assign(t.dims.size(), 0);
    auto rest = static_cast<std::int64_t>(n);
    for (std::size_t i = t.dims.size(); i-- > 0;) {
      found.first[i] = rest % t.dims[i];
      rest /= t.dims[i];
    }
  }
  return found;
}

std::vector<std::int64_t> q_dims(const Shape& s) { return {s.batch, s.seq_q, s.heads_q, s.head_dim}; }
std::vector<std::int64_t> kv_dims(const Shape& s) { return {s.batch, s.seq_k, s.heads_kv, s.head_dim}; }
std::vector<std::int64_t> lse_dims(const Shape& s) { return {s.batch, s.heads_q, s.seq_q}; }

void round_to(HostTensor& t, DType dtype) {
  switch (dtype) {
    case DType::F64: return;
    case DType::F32:
      for (double& x : t.data) x = static_cast<float>(x);
      return;
    case DType::F16:
      for (double& x : t.data) x = round_to_f16(x);
      return;
    case DType::BF16:
      for (double& x : t.data) x = round_to_bf16(x);
      return;
    case DType::E4M3:
      // Rounded as it stands, a tensor would use the format's 2^-9..448 range by chance: FP8 scales each head first.
      throw InputError("e4m3 values are not rounded one by one: each (batch, head) is scaled to the format's range "
                       "first and keeps its descale (quantize_e4m3_per_head, cpu_reference/fp8.hpp)");
  }
}

static HostTensor random_tensor(std::vector<std::int64_t> dims, DType dtype, std::mt19937_64& rng) {
  HostTensor t(std::move(dims));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double& x : t.data) x = normal(rng);
  round_to(t, dtype);
  return t;
}

Qkv random_qkv(const Shape& s, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Qkv in;
  in.q = random_tensor(q_dims(s), dtype, rng);
  in.k = random_tensor(kv_dims(s), dtype, rng);
  in.v = random_tensor(kv_dims(s), dtype, rng);
  return in;
}

HostTensor random_like_o(const Shape& s, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  return random_tensor(q_dims(s), dtype, rng);
}

static void check_one(const char* name, const HostTensor& t, const std::vector<std::int64_t>& want) {
  if (t.dims != want) {
    HostTensor expected;
    expected.dims = want;
    throw InputError(std::string(name) + " has shape " + t.dims_string() + " but the problem needs " +
                     expected.dims_string() + " in layout (batch, seq, heads, head_dim)");
  }
}

void check_dims(const Shape& s, const Qkv& in, const HostTensor* dO) {
  check_one("q", in.q, q_dims(s));
  check_one("k", in.k, kv_dims(s));
  check_one("v", in.v, kv_dims(s));
  if (dO) check_one("dO", *dO, q_dims(s));
}

}  // namespace flashlab
