#pragma once
// Human units for the panels and CSV headers: bytes in KiB/MiB/GiB, seconds in ns..s, big counts.
#include <cstdint>
#include <string>

namespace flashlab::viz {

std::string format_bytes(double bytes);      // "1.5 MiB"
std::string format_seconds(double seconds);  // "12.3 us"
std::string format_count(double n);          // "1.2 M"
std::string format_ratio(double r);          // "8.0x"

}  // namespace flashlab::viz
