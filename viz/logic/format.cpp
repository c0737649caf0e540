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

std::string format_length(std::int64_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= 1024 && n % 1024 == 0) return std::to_string(n >> 10) + "k";
  return std::to_string(n);
}

std::string format_ratio(double r) { return printf_string(r >= 10 ? "%.0f%s" : "%.1f%s", r, "x"); }

namespace {
// value / scale with up to three significant digits, then the unit: "1.5 GB".
std::string si(double v, const char* const* units, int count, double step) {
  int u = 0;
  while (std::fabs(v) >= step && u < count - 1) {
    v /= step;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g%s%s", v, units[u][0] ? " " : "", units[u]);
  return buf;
}
}  // namespace

std::string axis_bytes(double b) {
  static const char* const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  return si(b, units, 6, 1000.0);
}
std::string axis_count(double n) {
  static const char* const units[] = {"", "k", "M", "G"};
  return si(n, units, 4, 1000.0);
}
std::string axis_flops(double f) {
  static const char* const units[] = {"FLOP/s", "kF/s", "MF/s", "GF/s", "TF/s", "PF/s"};
  return si(f, units, 6, 1000.0);
}
std::string axis_seconds(double s) {
  char buf[32];
  if (s >= 1.0) std::snprintf(buf, sizeof buf, "%.3g s", s);
  else if (s >= 1e-3) std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
  else if (s >= 1e-6) std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
  else std::snprintf(buf, sizeof buf, "%.3g ns", s * 1e9);
  return buf;
}

}  // namespace flashlab::viz
