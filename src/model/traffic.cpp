// The traffic model's consumer-side pieces: tensor names, the totals a TrafficCounter keeps, and the
// L2 level. The events themselves come from the one loop nest per algorithm and pass in
// src/cpu_reference.
#include "model/traffic.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

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
// L2Model: a pool of tile entries on a doubly linked LRU list (most recent at the head), found through
// an open-addressing hash table (linear probing, deletion by backward shift). A GPU-level replay makes
// hundreds of millions of accesses, so the table is a flat array rather than a node-based map.

struct L2Model::Cache {
  static constexpr std::int32_t kNone = -1;
  struct Entry {
    std::uint64_t key = 0;
    std::int64_t bytes = 0;
    std::int32_t newer = kNone, older = kNone;  // LRU neighbours; `older` chains the free entries
    TensorId tensor{};
    bool dirty = false;
  };
  std::vector<Entry> entries;
  std::int32_t newest = kNone, oldest = kNone, free_entries = kNone;
  std::vector<std::int32_t> table = std::vector<std::int32_t>(1024, kNone);  // entry index, or kNone
  std::size_t live = 0;
  std::int64_t resident = 0, dirty = 0;

  static std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer: spreads adjacent keys
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  std::size_t mask() const { return table.size() - 1; }
  std::size_t home(std::uint64_t key) const { return mix(key) & mask(); }

  std::int32_t find(std::uint64_t key) const {
    for (std::size_t at = home(key);; at = (at + 1) & mask()) {
      const std::int32_t e = table[at];
      if (e == kNone || entries[std::size_t(e)].key == key) return e;
    }
  }
  void place(std::int32_t e) {
    std::size_t at = home(entries[std::size_t(e)].key);
    while (table[at] != kNone) at = (at + 1) & mask();
    table[at] = e;
  }
  void grow_if_needed() {
    if (2 * (live + 1) <= table.size()) return;
    table.assign(2 * table.size(), kNone);
    for (std::int32_t e = newest; e != kNone; e = entries[std::size_t(e)].older) place(e);
  }
  void unindex(std::uint64_t key) {  // linear probing's deletion: shift later members of the run back
    std::size_t at = home(key);
    while (entries[std::size_t(table[at])].key != key) at = (at + 1) & mask();
    for (std::size_t next = (at + 1) & mask(); table[next] != kNone; next = (next + 1) & mask()) {
      const std::size_t want = home(entries[std::size_t(table[next])].key);
      // Move the member at `next` into the hole unless its home lies cyclically in (at, next].
      const bool stays = at <= next ? (at < want && want <= next) : (at < want || want <= next);
      if (!stays) {
        table[at] = table[next];
        at = next;
      }
    }
    table[at] = kNone;
  }

  void unlink(std::int32_t e) {
    Entry& x = entries[std::size_t(e)];
    (x.newer != kNone ? entries[std::size_t(x.newer)].older : newest) = x.older;
    (x.older != kNone ? entries[std::size_t(x.older)].newer : oldest) = x.newer;
  }
  void link_newest(std::int32_t e) {
    Entry& x = entries[std::size_t(e)];
    x.newer = kNone;
    x.older = newest;
    (newest != kNone ? entries[std::size_t(newest)].newer : oldest) = e;
    newest = e;
  }
  std::int32_t insert(std::uint64_t key, TensorId tensor, std::int64_t bytes, bool is_dirty) {
    grow_if_needed();
    std::int32_t e = free_entries;
    if (e != kNone) {
      free_entries = entries[std::size_t(e)].older;
    } else {
      e = static_cast<std::int32_t>(entries.size());
      entries.emplace_back();
    }
    entries[std::size_t(e)] = Entry{key, bytes, kNone, kNone, tensor, is_dirty};
    place(e);
    link_newest(e);
    ++live;
    resident += bytes;
    if (is_dirty) dirty += bytes;
    return e;
  }
  // Drops the least recently used entry; returns it (its bytes and whether it was dirty) by value.
  Entry evict_oldest() {
    const std::int32_t e = oldest;
    const Entry victim = entries[std::size_t(e)];
    unlink(e);
    unindex(victim.key);
    entries[std::size_t(e)].older = free_entries;
    free_entries = e;
    --live;
    resident -= victim.bytes;
    if (victim.dirty) dirty -= victim.bytes;
    return victim;
  }
};

namespace {
// One tile of one tensor of one (batch, head): 22 bits for each tile index, 4 for the tensor, the
// rest for bh. Distinct for every tile the loop nests emit up to 4M blocks per side.
constexpr int kTileBits = 22, kTensorBits = 4;
std::uint64_t tile_key(int bh, const TileEvent& e) {
  return (((static_cast<std::uint64_t>(bh) << kTensorBits) | static_cast<std::uint64_t>(e.tensor))
          << (2 * kTileBits)) |
         (static_cast<std::uint64_t>(e.tile_row) << kTileBits) | static_cast<std::uint64_t>(e.tile_col);
}
bool kv_side(TensorId t) { return t == TensorId::K || t == TensorId::V || t == TensorId::dK || t == TensorId::dV; }
}  // namespace

L2Model::L2Model(std::int64_t capacity_bytes, const Shape* shape)
    : cache_(std::make_unique<Cache>()), capacity_(std::max<std::int64_t>(0, capacity_bytes)) {
  if (shape) {
    heads_q_ = shape->heads_q;
    heads_kv_ = shape->heads_kv;
  }
}
L2Model::~L2Model() = default;

std::int64_t L2Model::dirty_bytes() const { return cache_->dirty; }


std::uint64_t cache_key(const TileEvent& e, int heads_q, int heads_kv) {
  int bh = e.bh;
  if (heads_kv > 0 && kv_side(e.tensor))  // the K/V head this query head reads: (b, h / group)
    bh = (e.bh / heads_q) * heads_kv + (e.bh % heads_q) / (heads_q / heads_kv);
  return tile_key(bh, e);
}

std::uint64_t cache_key_at_col(std::uint64_t key, int col) {
  constexpr std::uint64_t kColumn = (std::uint64_t{1} << kTileBits) - 1;  // tile_key's lowest bits
  return (key & ~kColumn) | (static_cast<std::uint64_t>(col) & kColumn);
}

std::uint64_t L2Model::key_of(const TileEvent& e) const { return cache_key(e, heads_q_, heads_kv_); }

void L2Model::on_event(const TileEvent& e) {
  ++dram_.events;
  dram_.peak_sram_bytes = std::max(dram_.peak_sram_bytes, e.sram_bytes);
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  Cache& c = *cache_;
  const std::uint64_t key = key_of(e);
  const bool store = e.direction == Direction::Store;
  // Blocks running side by side load the same tile one after another: check the newest entry first.
  const std::int32_t at = c.newest != Cache::kNone && c.entries[std::size_t(c.newest)].key == key ? c.newest : c.find(key);
  if (at != Cache::kNone) {
    Cache::Entry& t = c.entries[std::size_t(at)];
    if (!store) hit_bytes_ += e.bytes;
    c.resident += e.bytes - t.bytes;
    if (t.dirty) c.dirty -= t.bytes;
    t.bytes = e.bytes;
    t.dirty = t.dirty || store;
    if (t.dirty) c.dirty += t.bytes;
    if (c.newest != at) {  // now the most recently used
      c.unlink(at);
      c.link_newest(at);
    }
  } else {
    if (!store) dram_.read[static_cast<std::size_t>(e.tensor)] += e.bytes;  // a miss
    c.insert(key, e.tensor, e.bytes, store);  // write-allocate
  }
  while (c.resident > capacity_ && c.live > 0) {  // evict the least recently used
    const Cache::Entry victim = c.evict_oldest();
    if (victim.dirty) dram_.written[static_cast<std::size_t>(victim.tensor)] += victim.bytes;
  }
}

void L2Model::flush() {
  Cache& c = *cache_;
  for (std::int32_t e = c.newest; e != Cache::kNone; e = c.entries[std::size_t(e)].older) {
    Cache::Entry& t = c.entries[std::size_t(e)];
    if (t.dirty) dram_.written[static_cast<std::size_t>(t.tensor)] += t.bytes;
    t.dirty = false;
  }
  c.dirty = 0;
}

// ---------------------------------------------------------------------------------------------
// CompulsoryTraffic: the tiles in one flat table, each entry holding its tile (no indirection, no list).

CompulsoryTraffic::CompulsoryTraffic(const Shape* shape) {
  if (shape) {
    heads_q_ = shape->heads_q;
    heads_kv_ = shape->heads_kv;
  }
}

CompulsoryTraffic::Tile& CompulsoryTraffic::find_or_add(std::uint64_t key) {
  if (last_ && last_key_ == key) return *last_;
  if (2 * (used_ + 1) > table_.size()) grow();
  const std::size_t mask = table_.size() - 1;
  std::size_t at = home(key);
  while (table_[at].bytes >= 0 && table_[at].key != key) at = (at + 1) & mask;
  Tile& t = table_[at];
  if (t.bytes < 0) {
    t.key = key;
    ++used_;
  }
  last_key_ = key;
  last_ = &t;
  return t;
}

void CompulsoryTraffic::grow() {
  std::vector<Tile> old(2 * table_.size());
  old.swap(table_);
  --shift_;
  const std::size_t mask = table_.size() - 1;
  for (const Tile& t : old) {
    if (t.bytes < 0) continue;
    std::size_t at = home(t.key);
    while (table_[at].bytes >= 0) at = (at + 1) & mask;
    table_[at] = t;
  }
  last_ = nullptr;
}

void CompulsoryTraffic::on_event(const TileEvent& e, std::uint64_t key) {
  ++dram_.events;
  dram_.peak_sram_bytes = std::max(dram_.peak_sram_bytes, e.sram_bytes);
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  Tile& t = find_or_add(key);
  const bool store = e.direction == Direction::Store;
  if (t.bytes < 0) {  // its first access: a load reads it from DRAM, a store allocates it
    t.tensor = e.tensor;
    if (!store) dram_.read[static_cast<std::size_t>(e.tensor)] += e.bytes;
  }
  t.bytes = e.bytes;
  t.stored = t.stored || store;
}

void CompulsoryTraffic::flush() {
  for (Tile& t : table_)
    if (t.bytes >= 0 && t.stored) {
      dram_.written[static_cast<std::size_t>(t.tensor)] += t.bytes;
      t.stored = false;
    }
}

}  // namespace flashlab
