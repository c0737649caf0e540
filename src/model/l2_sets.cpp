// SetAssociativeL2 (l2_sets.hpp): tiles in the order of their last touch, the bytes between two touches of a
// tile from a Fenwick tree over that order, and H(D) tabulated.
#include "model/l2_sets.hpp"

#include <algorithm>
#include <cmath>

namespace flashlab {

SetAssociativeL2::SetAssociativeL2(std::int64_t capacity_bytes, int ways, const Shape& shape, double store_age)
    : capacity_(double(std::max<std::int64_t>(0, capacity_bytes))),
      ways_(std::max(0, ways)),
      store_age_bytes_(std::max(0.0, store_age) * capacity_),
      heads_q_(shape.heads_q),
      heads_kv_(shape.heads_kv),
      fenwick_(std::size_t{1} << 16, 0),
      slot_tile_((std::size_t{1} << 16) - 1, -1) {
  if (ways_ == 0) return;
  h_table_.resize(kSteps + 2);
  for (int n = 0; n <= kSteps + 1; ++n) {  // P(Poisson(lambda) <= ways - 1), lambda = ways * D / C
    const double lambda = ways_ * kReach * n / kSteps;
    double term = std::exp(-lambda), sum = 0;
    for (int k = 0; k < ways_; ++k) {
      sum += term;
      term *= lambda / (k + 1);
    }
    h_table_[std::size_t(n)] = std::min(1.0, sum);
  }
}

double SetAssociativeL2::still_here(double distance, std::int64_t own_bytes) const {
  if (ways_ == 0) return distance + double(own_bytes) <= capacity_ ? 1 : 0;
  if (capacity_ <= 0) return 0;
  const double x = distance / capacity_ / kReach * kSteps;
  if (x >= kSteps) return 0;
  const auto n = std::size_t(x);
  return h_table_[n] + (h_table_[n + 1] - h_table_[n]) * (x - double(n));
}

// Fenwick tree over slots 0 .. fenwick_.size() - 2 (index = slot + 1).
void SetAssociativeL2::add_bytes(std::int32_t slot, std::int64_t bytes) {
  for (std::size_t i = std::size_t(slot) + 1; i < fenwick_.size(); i += i & (~i + 1)) fenwick_[i] += bytes;
}
std::int64_t SetAssociativeL2::bytes_up_to(std::int32_t slot) const {
  std::int64_t sum = 0;
  for (std::size_t i = std::size_t(slot) + 1; i > 0; i -= i & (~i + 1)) sum += fenwick_[i];
  return sum;
}

double SetAssociativeL2::distance(const Tile& t) const { return double(total_ - bytes_up_to(t.slot)) + t.age; }

SetAssociativeL2::Tile* SetAssociativeL2::find(const TileEvent& e) {
  const auto it = index_.find(cache_key(e, heads_q_, heads_kv_));
  return it == index_.end() ? nullptr : &tiles_[std::size_t(it->second)];
}
const SetAssociativeL2::Tile* SetAssociativeL2::find(const TileEvent& e) const {
  const auto it = index_.find(cache_key(e, heads_q_, heads_kv_));
  return it == index_.end() ? nullptr : &tiles_[std::size_t(it->second)];
}

double SetAssociativeL2::presence(const TileEvent& e) const {
  const Tile* t = find(e);
  return t ? t->here * still_here(distance(*t), t->bytes) : 0;
}

void SetAssociativeL2::write_back(const Tile& t, double bytes) { written_[std::size_t(t.tensor)] += bytes; }

double SetAssociativeL2::reuse(Tile& t) {
  const double h = still_here(distance(t), t.bytes);
  write_back(t, double(t.bytes) * t.dirty * (1 - h));  // dirty and evicted since the last touch
  t.dirty *= h;
  t.here *= h;
  return t.here;
}

void SetAssociativeL2::access(const TileEvent& e, double from_peer) {
  ++dram_.events;
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  const bool store = e.direction == Direction::Store;
  const double bytes = double(e.bytes);
  auto& read = read_[std::size_t(e.tensor)];
  if (Tile* t = find(e)) {
    const double here = reuse(*t);
    if (store) {
      t->dirty = 1;
    } else {
      const double missing = bytes * (1 - here);
      read += missing * (1 - from_peer);
      hit_ += bytes * here + missing * from_peer;
    }
    t->here = 1;
    t->age = store ? store_age_bytes_ : 0;
    t->bytes = e.bytes;
    touch(std::int32_t(t - tiles_.data()));
  } else {
    std::int32_t at;
    if (!free_tiles_.empty()) {
      at = free_tiles_.back();
      free_tiles_.pop_back();
    } else {
      at = std::int32_t(tiles_.size());
      tiles_.emplace_back();
    }
    tiles_[std::size_t(at)] = Tile{.key = cache_key(e, heads_q_, heads_kv_), .bytes = e.bytes, .tensor = e.tensor,
                                   .here = 1, .dirty = store ? 1.0 : 0.0, .age = store ? store_age_bytes_ : 0};
    index_.emplace(tiles_[std::size_t(at)].key, at);
    if (!store) {
      read += bytes * (1 - from_peer);
      hit_ += bytes * from_peer;
    }
    place(at);
  }
  drop_gone();
}

void SetAssociativeL2::refresh(const TileEvent& e) {
  Tile* t = find(e);
  if (!t) return;
  reuse(*t);
  touch(std::int32_t(t - tiles_.data()));
  drop_gone();
}

void SetAssociativeL2::settle() {
  dirty_at_end_ = 0;
  for (std::int32_t s = oldest_slot_; s < next_slot_; ++s) {
    const std::int32_t at = slot_tile_[std::size_t(s)];
    if (at < 0) continue;
    Tile& t = tiles_[std::size_t(at)];
    const double h = still_here(distance(t), t.bytes);
    write_back(t, double(t.bytes) * t.dirty * (1 - h));
    t.dirty *= h;
    dirty_at_end_ += double(t.bytes) * t.dirty;
  }
  for (std::size_t n = 0; n < read_.size(); ++n) {
    dram_.read[n] = std::llround(read_[n]);
    dram_.written[n] = std::llround(written_[n]);
  }
}

void SetAssociativeL2::touch(std::int32_t at) {
  Tile& t = tiles_[std::size_t(at)];
  add_bytes(t.slot, -t.counted);
  total_ -= t.counted;
  slot_tile_[std::size_t(t.slot)] = -1;
  place(at);
}

void SetAssociativeL2::place(std::int32_t at) {
  if (std::size_t(next_slot_) == slot_tile_.size()) renumber();
  Tile& t = tiles_[std::size_t(at)];
  t.slot = next_slot_++;
  t.counted = t.bytes;
  slot_tile_[std::size_t(t.slot)] = at;
  add_bytes(t.slot, t.counted);
  total_ += t.counted;
}

void SetAssociativeL2::forget(std::int32_t at) {
  Tile& t = tiles_[std::size_t(at)];
  add_bytes(t.slot, -t.counted);
  total_ -= t.counted;
  slot_tile_[std::size_t(t.slot)] = -1;
  t.slot = -1;
  index_.erase(t.key);
  free_tiles_.push_back(at);
}

// The oldest tiles, once surely gone (H = 0), leave the books; their dirty bytes were written back.
void SetAssociativeL2::drop_gone() {
  for (; oldest_slot_ < next_slot_; ++oldest_slot_) {
    const std::int32_t at = slot_tile_[std::size_t(oldest_slot_)];
    if (at < 0) continue;
    const Tile& t = tiles_[std::size_t(at)];
    if (still_here(distance(t), t.bytes) > 0) return;
    write_back(t, double(t.bytes) * t.dirty);
    forget(at);
  }
}

// The slots run out: the tiles held take slots 0, 1, ... in the same order, in a tree at least four times
// their number.
void SetAssociativeL2::renumber() {
  std::vector<std::int32_t> held;
  for (std::int32_t s = oldest_slot_; s < next_slot_; ++s)
    if (slot_tile_[std::size_t(s)] >= 0) held.push_back(slot_tile_[std::size_t(s)]);
  std::size_t slots = slot_tile_.size();
  while (slots < 4 * held.size()) slots = 2 * slots + 1;
  fenwick_.assign(slots + 1, 0);
  slot_tile_.assign(slots, -1);
  next_slot_ = oldest_slot_ = 0;
  total_ = 0;
  for (std::int32_t at : held) {
    Tile& t = tiles_[std::size_t(at)];
    t.slot = next_slot_++;
    slot_tile_[std::size_t(t.slot)] = at;
    add_bytes(t.slot, t.counted);
    total_ += t.counted;
  }
}

}  // namespace flashlab
