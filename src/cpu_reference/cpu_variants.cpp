// The CPU rows of the variant table: dtype dispatch (F64 -> double, F32 -> float; the inputs are
// already rounded to the dtype) around naive.cpp and tiled.cpp, plus the memory guard of cpu-naive.
#include "cpu_reference/cpu_variants.hpp"

#include <fstream>
#include <sstream>
#include <string>

#include "cpu_reference/naive.hpp"

namespace flashlab {

namespace {

// MemAvailable from /proc/meminfo in bytes, or -1 when it cannot be read (then nothing is refused).
std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    std::int64_t kib = -1;
    fields >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

// cpu-naive materializes S and P (and dP, dS): refuse before allocating what cannot fit.
void check_naive_fits(const Problem& p, DType dtype, bool backward) {
  validate(p);
  const std::int64_t needed = naive_extra_bytes(p.shape, dtype_bytes(dtype), backward);
  const std::int64_t available = available_memory_bytes();
  if (available >= 0 && needed > available)
    throw InputError("cpu-naive needs " + std::to_string(needed) + " bytes for its (seq_q x seq_k) score matrices " +
                     "but only " + std::to_string(available) +
                     " bytes of memory are available; use cpu-fa2, whose extra memory is O(seq_q)");
}

ForwardOut tiled_variant_forward(Algorithm a, const Problem& p, DType dtype, const Qkv& in,
                                 TrafficObserver* obs) {
  const Tiling t = cpu_variant_tiling(p.shape.head_dim);
  return dtype == DType::F64 ? tiled_forward<double>(a, p, in, t, obs, dtype_bytes(dtype))
                             : tiled_forward<float>(a, p, in, t, obs, dtype_bytes(dtype));
}

Grads tiled_variant_backward(Algorithm a, const Problem& p, DType dtype, const Qkv& in,
                             const ForwardOut& fwd, const HostTensor& dO) {
  const Tiling t = cpu_variant_tiling(p.shape.head_dim);
  return dtype == DType::F64 ? tiled_backward<double>(a, p, in, fwd, dO, t, nullptr, dtype_bytes(dtype))
                             : tiled_backward<float>(a, p, in, fwd, dO, t, nullptr, dtype_bytes(dtype));
}

}  // namespace

ForwardOut cpu_naive_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver* obs) {
  check_naive_fits(p, dtype, false);
  return dtype == DType::F64 ? naive_forward<double>(p, in, obs) : naive_forward<float>(p, in, obs);
}

Grads cpu_naive_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  check_naive_fits(p, dtype, true);
  return dtype == DType::F64 ? naive_backward<double>(p, in, fwd, dO) : naive_backward<float>(p, in, fwd, dO);
}

ForwardOut cpu_fa1_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver* obs) {
  return tiled_variant_forward(Algorithm::FA1, p, dtype, in, obs);
}
Grads cpu_fa1_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return tiled_variant_backward(Algorithm::FA1, p, dtype, in, fwd, dO);
}
ForwardOut cpu_fa2_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver* obs) {
  return tiled_variant_forward(Algorithm::FA2, p, dtype, in, obs);
}
Grads cpu_fa2_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return tiled_variant_backward(Algorithm::FA2, p, dtype, in, fwd, dO);
}

Tiling cpu_variant_tiling(int /*head_dim*/) {
  // The paper's rule sizes tiles for a GPU's ~100 KB of shared memory. On a CPU the "SRAM" is the
  // L2 cache (~1-2 MB per core), and Eigen's GEMM reaches most of its speed once a product is about
  // 64 on a side: Br = Bc = 64 keeps Q_i, K_j, V_j, O_i and S_ij (at most 5 x 64 x 256 doubles =
  // 640 KB at d = 256, 160 KB at d = 64) in L2 while amortizing the per-tile rescaling of O_i.
  constexpr int kBlock = 64;
  return Tiling{kBlock, kBlock};
}

}  // namespace flashlab
