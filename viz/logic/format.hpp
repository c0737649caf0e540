#pragma once
// Human units for the panels and CSV headers: bytes in KiB/MiB/GiB, seconds in ns..s, big counts.
#include <cstdint>
#include <string>

namespace flashlab::viz {

std::string format_bytes(double bytes);      // "1.5 MiB"
std::string format_seconds(double seconds);  // "12.3 us"
std::string format_count(double n);          // "1.2 M"
std::string format_ratio(double r);          // "8.0x"
std::string format_length(std::int64_t n);   // sequence lengths as people write them: "512", "32k", "1M"
// Compact decimal labels for plot axes: "10 GB", "100 ms", "1k", "750 TF/s".
std::string axis_bytes(double bytes);
std::string axis_seconds(double seconds);
std::string axis_count(double n);
std::string axis_flops(double flops_per_second);

}  // namespace flashlab::viz
