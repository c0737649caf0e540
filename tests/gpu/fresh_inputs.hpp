#pragma once
// What every GPU suite draws its random inputs from, and how it names a failing case: a fresh seed per
// run (printed on failure, so a failure can be replayed), and one line describing the problem.
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "core/problem.hpp"

inline std::uint64_t fresh_seed() {
  static std::random_device device;
  return (std::uint64_t(device()) << 32) ^ device();
}

// "bf16 B=1 Hq=8 Hkv=2 Sq=200 Sk=300 d=64 causal=bottom-right dropout=0 scale=0.125 seed=..."
inline std::string describe(const flashlab::Problem& p, flashlab::DType dtype, std::uint64_t seed) {
  const flashlab::Shape& s = p.shape;
  std::ostringstream os;
  os << to_string(dtype) << " B=" << s.batch << " Hq=" << s.heads_q << " Hkv=" << s.heads_kv << " Sq=" << s.seq_q
     << " Sk=" << s.seq_k << " d=" << s.head_dim << " causal=" << to_string(p.options.causal)
     << " dropout=" << p.options.dropout_p << " scale=" << p.softmax_scale() << " seed=" << seed;
  return os.str();
}
