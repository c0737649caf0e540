// The traffic model's consumers-side pieces: tensor names and the totals a TrafficCounter keeps.
// The events themselves come from the one loop nest per algorithm in tiled.cpp.
#include "traffic.hpp"

#include <algorithm>
#include <numeric>

namespace flashlab {

const char* to_string(TensorId t) {
  switch (t) {
    case TensorId::Q: return "Q";
    case TensorId::K: return "K";
    case TensorId::V: return "V";
    case TensorId::O: return "O";
    case TensorId::S: return "S";
    case TensorId::P: return "P";
    case TensorId::M: return "m";
    case TensorId::L: return "l";
    case TensorId::LSE: return "L";
    case TensorId::dO: return "dO";
    case TensorId::dQ: return "dQ";
    case TensorId::dK: return "dK";
    case TensorId::dV: return "dV";
    case TensorId::dS: return "dS";
    case TensorId::dP: return "dP";
    case TensorId::D: return "D";
    case TensorId::Count: break;
  }
  return "?";
}

std::int64_t TrafficTotals::total_read() const { return std::accumulate(read.begin(), read.end(), std::int64_t{0}); }
std::int64_t TrafficTotals::total_written() const {
  return std::accumulate(written.begin(), written.end(), std::int64_t{0});
}

void TrafficCounter::on_event(const TileEvent& e) {
  const auto t = static_cast<std::size_t>(e.tensor);
  if (e.direction == Direction::Load) totals_.read[t] += e.bytes;
  if (e.direction == Direction::Store) totals_.written[t] += e.bytes;
  ++totals_.events;
  totals_.peak_sram_bytes = std::max(totals_.peak_sram_bytes, e.sram_bytes);
}

}  // namespace flashlab
