#pragma once
// Host memory a run needs, and a guard that refuses, before anything is allocated, what will not fit.
// `flashlab check`, `run`, `bench` and the Python module's check share them.
#include <cstdint>
#include <string>

#include "core/problem.hpp"
#include "registry/variants.hpp"

namespace flashlab {

// What the OS says is available now (MemAvailable).
std::int64_t available_memory_bytes();
// Throws InputError when `needed` bytes will not fit: "<what> needs about X GiB but only Y GiB of memory
// is available: <advice>".
void require_memory(std::int64_t needed, const std::string& what);
// Host bytes one CPU run needs: inputs and outputs as HostTensors (double), plus the variant's working
// set (S and P for the standard algorithm: naive_extra_bytes; a copy of the inputs and outputs in the
// compute type for every variant). In e4m3: the inputs and outputs, the quantized inputs and the downloads.
std::int64_t host_bytes_for_run(const Variant&, const Shape&, DType, bool backward);
std::int64_t io_host_bytes(const Shape&, bool backward);

std::string format_bytes(double bytes);  // "1.50 MiB"

}  // namespace flashlab
