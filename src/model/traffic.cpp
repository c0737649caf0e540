// The traffic model's consumer-side pieces: tensor names, the totals a TrafficCounter keeps, and the
// L2 level. The events themselves come from the one loop nest per algorithm and pass in
// src/cpu_reference.
#include "model/traffic.hpp"

#include <algorithm>
#include <list>
#include <numeric>
#include <unordered_map>

namespace flashlab {

const char* to_string(TensorId t) {
  switch (t) {
    case TensorId::Q: return "Q";
    case TensorId::K: return "K";
    case TensorId::V: return "V";
    case TensorId::O: return "O";
    case TensorId::S: return "S";
    case TensorId::P: return "P";
    case TensorId::m: return "m";
    case TensorId::l: return "l";
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

// ---------------------------------------------------------------------------------------------
// L2Model: an LRU list of tiles (most recent at the front) and an index from tile key to entry.

struct L2Model::Cache {
  struct Tile {
    std::uint64_t key;
    TensorId tensor;
    std::int64_t bytes;
    bool dirty;
  };
  std::list<Tile> lru;
  std::unordered_map<std::uint64_t, std::list<Tile>::iterator> index;
  std::int64_t resident = 0;
};

namespace {
// One tile of one tensor of one (batch, head): 22 bits for each tile index, 4 for the tensor, the
// rest for bh. Distinct for every tile the loop nests emit up to 4M blocks per side.
std::uint64_t tile_key(const TileEvent& e) {
  constexpr int kTileBits = 22, kTensorBits = 4;
  return (((static_cast<std::uint64_t>(e.bh) << kTensorBits) | static_cast<std::uint64_t>(e.tensor))
          << (2 * kTileBits)) |
         (static_cast<std::uint64_t>(e.tile_row) << kTileBits) | static_cast<std::uint64_t>(e.tile_col);
}
}  // namespace

L2Model::L2Model(std::int64_t capacity_bytes)
    : cache_(std::make_unique<Cache>()), capacity_(std::max<std::int64_t>(0, capacity_bytes)) {}
L2Model::~L2Model() = default;

void L2Model::on_event(const TileEvent& e) {
  ++dram_.events;
  dram_.peak_sram_bytes = std::max(dram_.peak_sram_bytes, e.sram_bytes);
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  Cache& c = *cache_;
  const std::uint64_t key = tile_key(e);
  const bool store = e.direction == Direction::Store;
  if (auto it = c.index.find(key); it != c.index.end()) {
    Cache::Tile& t = *it->second;
    if (!store) hit_bytes_ += e.bytes;
    t.dirty = t.dirty || store;
    c.resident += e.bytes - t.bytes;
    t.bytes = e.bytes;
    c.lru.splice(c.lru.begin(), c.lru, it->second);  // now the most recently used
  } else {
    if (!store) dram_.read[static_cast<std::size_t>(e.tensor)] += e.bytes;  // a miss
    c.lru.push_front(Cache::Tile{key, e.tensor, e.bytes, store});            // write-allocate
    c.index.emplace(key, c.lru.begin());
    c.resident += e.bytes;
  }
  while (c.resident > capacity_ && !c.lru.empty()) {  // evict the least recently used
    const Cache::Tile& victim = c.lru.back();
    if (victim.dirty) dram_.written[static_cast<std::size_t>(victim.tensor)] += victim.bytes;
    c.resident -= victim.bytes;
    c.index.erase(victim.key);
    c.lru.pop_back();
  }
}

void L2Model::flush() {
  for (Cache::Tile& t : cache_->lru) {
    if (t.dirty) dram_.written[static_cast<std::size_t>(t.tensor)] += t.bytes;
    t.dirty = false;
  }
}

}  // namespace flashlab
