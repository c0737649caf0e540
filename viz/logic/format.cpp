#include "format.hpp"

#include <cmath>
#include <cstdio>

namespace flashlab::viz {

namespace {
std::string printf_string(const char* fmt, double v, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v, unit);
  return buf;
}
}  // namespace

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(b) >= 1024.0 && u < 5) {
    b /= 1024.0;
    ++u;
  }
  return printf_string(u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
}

std::string format_seconds(double s) {
  if (s >= 1.0) return printf_string("%.2f %s", s, "s");
  if (s >= 1e-3) return printf_string("%.2f %s", s * 1e3, "ms");
  if (s >= 1e-6) return printf_string("%.2f %s", s * 1e6, "us");
  return printf_string("%.1f %s", s * 1e9, "ns");
}

std::string format_count(double n) {
  if (std::fabs(n) >= 1e9) return printf_string("%.2f %s", n / 1e9, "G");
  if (std::fabs(n) >= 1e6) return printf_string("%.2f %s", n / 1e6, "M");
  if (std::fabs(n) >= 1e4) return printf_string("%.1f %s", n / 1e3, "k");
  return printf_string("%.0f%s", n, "");
}

std::string format_ratio(double r) { return printf_string(r >= 10 ? "%.0f%s" : "%.1f%s", r, "x"); }

}  // namespace flashlab::viz
