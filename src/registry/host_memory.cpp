#include "registry/host_memory.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "model/memory.hpp"

namespace flashlab {

std::int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return static_cast<std::int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

void require_memory(std::int64_t needed, const std::string& what) {
  const std::int64_t available = available_memory_bytes();
  if (needed > available)
    throw InputError(what + " needs about " + format_bytes(double(needed)) + " but only " +
                     format_bytes(double(available)) +
                     " of memory is available: use shorter sequences, fewer heads or a smaller batch");
}

std::int64_t io_host_bytes(const Shape& s, bool backward) {
  const std::int64_t q = std::int64_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::int64_t kv = std::int64_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
  const std::int64_t lse = std::int64_t(s.batch) * s.heads_q * s.seq_q;
  std::int64_t elements = q + 2 * kv + q + lse;  // q, k, v, o, lse
  if (backward) elements += q + q + 2 * kv;      // dO, dq, dk, dv
  return elements * std::int64_t(sizeof(double));
}

std::int64_t host_bytes_for_run(const Variant& v, const Shape& s, DType dtype, bool backward) {
  if (dtype == DType::E4M3) {
    // The FP8 forward (no backward): the inputs quantized on the host (quantize_e4m3_per_head holds the e4m3
    // values in double, then their bytes), and O and the LSE downloaded in bf16 and fp32.
    const std::int64_t o = std::int64_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
    const std::int64_t inputs = o + 2 * std::int64_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
    const std::int64_t lse = std::int64_t(s.batch) * s.heads_q * s.seq_q;
    return io_host_bytes(s, false) + inputs * std::int64_t(sizeof(double) + 1) + o * 2 + lse * 4;
  }
  const int compute_bytes = dtype_bytes(dtype);
  // The variant converts its inputs and outputs to the compute type: one more copy of them.
  std::int64_t bytes = io_host_bytes(s, backward) / std::int64_t(sizeof(double)) * (sizeof(double) + compute_bytes);
  if (v.device == Device::Cpu && v.algorithm == Algorithm::Standard)
    bytes += naive_extra_bytes(s, compute_bytes, backward);
  return bytes;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double x = bytes;
  while (std::abs(x) >= 1024 && u < 5) x /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", x, units[u]);
  return buf;
}

}  // namespace flashlab
