// SetAssociativeL2 (l2_sets.hpp): tiles in the order of their last touch, the bytes between two touches of a
// tile from a tree of sums over that order, and H(D) tabulated.
#include "model/l2_sets.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab {

SetAssociativeL2::SetAssociativeL2(std::int64_t capacity_bytes, int ways, const Shape& shape, double store_age)
    : capacity_(double(std::max<std::int64_t>(0, capacity_bytes))),
      ways_(std::max(0, ways)),
      store_age_bytes_(std::max(0.0, store_age) * capacity_),
      heads_q_(shape.heads_q),
      heads_kv_(shape.heads_kv),
      slot_bytes_(std::size_t{1} << 16, 0),
      slot_tile_(std::size_t{1} << 16, -1) {
  size_tree(slot_tile_.size());
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
  // H interpolates between neighbours of the table. Where each is positive and at least half the one before,
  // their difference is exact and H above 0 wherever x < kSteps, which D below 4 C (1 - 2^-40) assures.
  bool positive = true;
  for (int n = 0; n < kSteps; ++n)
    positive = positive && h_table_[std::size_t(n)] > 0 && h_table_[std::size_t(n) + 1] >= h_table_[std::size_t(n)] / 2;
  if (positive) surely_held_ = kReach * capacity_ * (1 - 0x1p-40);
  // Over the first steps the table holds 1 exactly (the chance that a set took A lines more rounds to 0), and so
  // does H between two of them: below x = flat - 1, that is D below this, H is 1 with no division.
  std::size_t flat = 0;
  while (flat <= std::size_t(kSteps) && h_table_[flat] == 1) ++flat;
  if (flat >= 2) surely_whole_ = double(flat - 1) / kSteps * kReach * capacity_ * (1 - 0x1p-40);
}

inline double SetAssociativeL2::still_here(double distance, std::int64_t own_bytes) const {
  if (ways_ == 0) return distance + double(own_bytes) <= capacity_ ? 1 : 0;
  if (capacity_ <= 0) return 0;
  // D >= kReach C makes x >= kSteps below (the division rounds monotonically, and 4 C is exact): no division.
  if (distance >= kReach * capacity_) return 0;
  if (distance < surely_whole_) return 1;
  const double x = distance / capacity_ / kReach * kSteps;
  if (x >= kSteps) return 0;
  const auto n = std::size_t(x);
  return h_table_[n] + (h_table_[n + 1] - h_table_[n]) * (x - double(n));
}

namespace {
// The sum of g[0 .. n), 0 <= n <= 8, for g a group of eight siblings: masked, not looped, so that the count
// costs no branch.
constexpr std::array<std::array<std::int64_t, 8>, 9> kFirst = [] {
  std::array<std::array<std::int64_t, 8>, 9> m{};
  for (std::size_t n = 0; n <= 8; ++n)
    for (std::size_t k = 0; k < n; ++k) m[n][k] = -1;
  return m;
}();
inline std::int64_t sum_of_first(const std::int64_t* g, std::size_t n) {
  std::int64_t sum = 0;
  for (std::size_t k = 0; k < 8; ++k) sum += g[k] & kFirst[n][k];
  return sum;
}
}  // namespace

// The levels above 0 for `slots` slots, all 0: each a whole number of groups of kFan, up to the one whose
// nodes fit one group.
void SetAssociativeL2::size_tree(std::size_t slots) {
  static_assert(kFan == 8, "sum_of_first sums groups of 8");
  std::size_t total = 0;
  levels_ = 0;
  for (std::size_t n = slots; n > std::size_t(kFan);) {
    n = (n + kFan - 1) / kFan;
    level_at_[std::size_t(levels_++)] = total;
    total += (n + kFan - 1) / kFan * kFan;
  }
  sums_.assign(total, 0);
}

// A flushed slot's bytes change by `bytes`: each of its ancestors changes with it, and so does the kept answer.
inline void SetAssociativeL2::add_bytes(std::int32_t slot, std::int64_t bytes) {
  if (slot <= known_slot_) known_bytes_ += bytes;
  std::size_t at = std::size_t(slot);
  for (int l = 0; l < levels_; ++l) {
    at >>= kFanBits;
    sums_[level_at_[std::size_t(l)] + at] += bytes;
  }
}
// The bytes of slots 0 .. slot, all below flushed_.
inline std::int64_t SetAssociativeL2::bytes_up_to(std::int32_t slot) const {
  if (slot >= known_slot_ && slot - known_slot_ <= kFollow) {
    for (std::int32_t s = known_slot_ + 1; s <= slot; ++s) known_bytes_ += slot_bytes_[std::size_t(s)];
    known_slot_ = slot;
    return known_bytes_;
  }
  std::size_t at = std::size_t(slot);
  std::int64_t sum = sum_of_first(&slot_bytes_[at & ~std::size_t(kFan - 1)], (at & (kFan - 1)) + 1);
  for (int l = 0; l < levels_; ++l) {
    at >>= kFanBits;
    sum += sum_of_first(&sums_[level_at_[std::size_t(l)] + (at & ~std::size_t(kFan - 1))], at & (kFan - 1));
  }
  known_slot_ = slot;
  known_bytes_ = sum;
  return sum;
}

// The slots flushed_ .. next_slot_ - 1 enter the tree together: each group of kFan siblings among them adds its
// sum to its parent and the parent's ancestors, so a batch costs about one addition per slot.
void SetAssociativeL2::flush() {
  const std::size_t lo = std::size_t(flushed_), hi = std::size_t(next_slot_);  // hi excluded
  for (std::size_t g = lo >> kFanBits; g << kFanBits < hi; ++g) {
    const std::size_t from = std::max(lo, g << kFanBits), to = std::min(hi, (g + 1) << kFanBits);
    std::int64_t bytes = 0;
    for (std::size_t i = from; i < to; ++i) bytes += slot_bytes_[i];
    std::size_t at = g;
    for (int l = 0; l < levels_; ++l, at >>= kFanBits) sums_[level_at_[std::size_t(l)] + at] += bytes;
  }
  flushed_ = next_slot_;
}

// A slot takes `bytes` (0: it is left).
inline void SetAssociativeL2::set_slot(std::int32_t slot, std::int64_t bytes) {
  std::int64_t& held = slot_bytes_[std::size_t(slot)];
  if (slot < flushed_) add_bytes(slot, bytes - held);
  total_ += bytes - held;
  held = bytes;
}

// total_ - bytes_up_to(t.slot), in integers, so each way below gives the same D to the last bit.
inline double SetAssociativeL2::distance(const Tile& t) const {
  std::int64_t after = 0;
  if (t.slot >= flushed_ || next_slot_ - t.slot <= kScan) {  // among the newest (blocks in lock-step share tiles)
    for (std::int32_t s = t.slot + 1; s < next_slot_; ++s) after += slot_bytes_[std::size_t(s)];
  } else if (t.slot == oldest_slot_) {  // the slots before the oldest are empty
    after = total_ - slot_bytes_[std::size_t(t.slot)];
  } else {
    after = total_ - bytes_up_to(t.slot);
  }
  return double(after) + (t.stored ? store_age_bytes_ : 0);
}

SetAssociativeL2::Found SetAssociativeL2::find(std::uint64_t key) const {
  Found f{.key = key, .tile = index_.find(key), .kept = 0, .generation = generation_};
  if (f.tile >= 0) {
    const Tile& t = tiles_[std::size_t(f.tile)];
    f.kept = still_here(distance(t), t.bytes);
  }
  return f;
}

void SetAssociativeL2::stale() {
  throw std::logic_error("SetAssociativeL2: a Found was used after the cache changed; find the tile again");
}

inline void SetAssociativeL2::write_back(const Tile& t, double bytes) { written_[t.tensor] += bytes; }

inline double SetAssociativeL2::reuse(Tile& t, double kept) {
  write_back(t, double(t.bytes) * t.dirty * (1 - kept));  // dirty and evicted since the last touch
  t.dirty *= kept;
  t.here *= kept;
  return t.here;
}

void SetAssociativeL2::access(const TileEvent& e, double from_peer) {
  if (e.direction != Direction::Load && e.direction != Direction::Store) {
    ++dram_.events;
    return;
  }
  access(find(key_of(e)), e, from_peer);
}

void SetAssociativeL2::access(const Found& f, const TileEvent& e, double from_peer) {
  check(f);
  ++generation_;
  ++dram_.events;
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  const bool store = e.direction == Direction::Store;
  if (e.bytes < 0 || e.bytes >= (std::int64_t{1} << kTileBytesBits))
    throw InputError("a tile of " + std::to_string(e.bytes) + " bytes is beyond the L2 model's 128 MiB");
  const double bytes = double(e.bytes);
  auto& read = read_[std::size_t(e.tensor)];
  if (f.tile >= 0) {
    Tile* t = &tiles_[std::size_t(f.tile)];
    const double here = reuse(*t, f.kept);
    if (store) {
      t->dirty = 1;
    } else {
      const double missing = bytes * (1 - here);
      read += missing * (1 - from_peer);
      hit_ += bytes * here + missing * from_peer;
    }
    t->here = 1;
    t->stored = store;
    t->bytes = std::uint32_t(e.bytes);
    touch(f.tile);
  } else {
    std::int32_t at;
    if (!free_tiles_.empty()) {
      at = free_tiles_.back();
      free_tiles_.pop_back();
    } else {
      at = std::int32_t(tiles_.size());
      tiles_.emplace_back();
    }
    tiles_[std::size_t(at)] = Tile{.key = f.key, .here = 1, .dirty = store ? 1.0 : 0.0, .slot = -1,
                                   .bytes = std::uint32_t(e.bytes), .tensor = std::uint32_t(e.tensor),
                                   .stored = store};
    index_.insert(f.key, at);
    if (!store) {
      read += bytes * (1 - from_peer);
      hit_ += bytes * from_peer;
    }
    place(at);
  }
  drop_gone();
}

void SetAssociativeL2::refresh(const Found& f) {
  check(f);
  ++generation_;
  if (f.tile < 0) return;
  reuse(tiles_[std::size_t(f.tile)], f.kept);
  touch(f.tile);
  drop_gone();
}

void SetAssociativeL2::settle() {
  ++generation_;
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

inline void SetAssociativeL2::touch(std::int32_t at) {
  Tile& t = tiles_[std::size_t(at)];
  if (t.slot == next_slot_ - 1) {  // already the newest: it stays in its slot, with its new bytes
    set_slot(t.slot, t.bytes);
    return;
  }
  // Among the last few slots, none of them in the tree (blocks in lock-step take turns on the same tiles): the
  // slots after it move down one and it takes the newest, so no slot is used up. The order is the one a new
  // slot would give, and so are the bytes after every tile.
  if (t.slot >= flushed_ && next_slot_ - t.slot <= kRotate) {
    total_ += t.bytes - slot_bytes_[std::size_t(t.slot)];
    for (std::int32_t s = t.slot; s < next_slot_ - 1; ++s) {
      const std::int32_t moved = slot_tile_[std::size_t(s) + 1];
      slot_tile_[std::size_t(s)] = moved;
      slot_bytes_[std::size_t(s)] = slot_bytes_[std::size_t(s) + 1];
      if (moved >= 0) tiles_[std::size_t(moved)].slot = s;
    }
    t.slot = next_slot_ - 1;
    slot_tile_[std::size_t(t.slot)] = at;
    slot_bytes_[std::size_t(t.slot)] = t.bytes;
    return;
  }
  set_slot(t.slot, 0);
  slot_tile_[std::size_t(t.slot)] = -1;
  place(at);
}

inline void SetAssociativeL2::place(std::int32_t at) {
  if (std::size_t(next_slot_) == slot_tile_.size()) renumber();
  Tile& t = tiles_[std::size_t(at)];
  t.slot = next_slot_++;
  slot_tile_[std::size_t(t.slot)] = at;
  set_slot(t.slot, t.bytes);
  if (next_slot_ - flushed_ == kBatch) flush();
}

void SetAssociativeL2::forget(std::int32_t at) {
  Tile& t = tiles_[std::size_t(at)];
  set_slot(t.slot, 0);
  slot_tile_[std::size_t(t.slot)] = -1;
  t.slot = -1;
  index_.erase(t.key);
  free_tiles_.push_back(at);
}

// The oldest tiles, once surely gone (H = 0), leave the books; their dirty bytes were written back. Where tiles
// stream through (each read once, then gone), one leaves at almost every access, and the next oldest tile and
// its index entry lie far apart in memory: each drop fetches the tile kDropAhead slots on, and the index entry
// of the one half as far, so the drops that follow find both in the CPU's cache.
inline void SetAssociativeL2::drop_gone() {
  for (; oldest_slot_ < next_slot_; ++oldest_slot_) {
    const std::int32_t at = slot_tile_[std::size_t(oldest_slot_)];
    if (at < 0) continue;
    const Tile& t = tiles_[std::size_t(at)];
    const double d = distance(t);
    if (d < surely_held_ || still_here(d, t.bytes) > 0) return;
    if (oldest_slot_ + kDropAhead < next_slot_) {
      if (const std::int32_t ahead = slot_tile_[std::size_t(oldest_slot_ + kDropAhead)]; ahead >= 0)
        __builtin_prefetch(&tiles_[std::size_t(ahead)]);
      if (const std::int32_t ahead = slot_tile_[std::size_t(oldest_slot_ + kDropAhead / 2)]; ahead >= 0)
        index_.prefetch(tiles_[std::size_t(ahead)].key);
    }
    write_back(t, double(t.bytes) * t.dirty);
    forget(at);
  }
}

// The slots run out: the tiles held take slots 0, 1, ... in the same order (moved down in place), among at least
// four times their number, and the tree is built again in one pass per level.
void SetAssociativeL2::renumber() {
  std::size_t held = 0;
  for (std::int32_t s = oldest_slot_; s < next_slot_; ++s)
    if (const std::int32_t at = slot_tile_[std::size_t(s)]; at >= 0) {
      tiles_[std::size_t(at)].slot = std::int32_t(held);
      slot_tile_[held] = at;
      slot_bytes_[held] = slot_bytes_[std::size_t(s)];
      ++held;
    }
  std::fill(slot_tile_.begin() + std::ptrdiff_t(held), slot_tile_.end(), -1);
  std::fill(slot_bytes_.begin() + std::ptrdiff_t(held), slot_bytes_.end(), 0);
  std::size_t slots = slot_tile_.size();
  while (slots < 4 * held) slots *= 2;
  slot_tile_.resize(slots, -1);
  slot_bytes_.resize(slots, 0);
  size_tree(slots);
  total_ = 0;
  for (std::size_t n = 0; n < held; ++n) total_ += slot_bytes_[n];
  const std::int64_t* below = slot_bytes_.data();
  std::size_t used = held;  // nodes of the level below that hold bytes
  for (int l = 0; l < levels_; ++l) {
    std::int64_t* level = &sums_[level_at_[std::size_t(l)]];
    for (std::size_t i = 0; i < used; ++i) level[i >> kFanBits] += below[i];
    below = level;
    used = (used + kFan - 1) >> kFanBits;
  }
  next_slot_ = flushed_ = std::int32_t(held);
  oldest_slot_ = 0;
  known_slot_ = -1;
  known_bytes_ = 0;
}

SetAssociativeL2::TileIndex::TileIndex() : entries_(1024), shift_(64 - 10) {}

inline std::int32_t SetAssociativeL2::TileIndex::find(std::uint64_t key) const {
  const std::size_t mask = entries_.size() - 1;
  for (std::size_t at = home(key);; at = (at + 1) & mask) {
    const Entry& e = entries_[at];
    if (e.tile < 0 || e.key == key) return e.tile;
  }
}

void SetAssociativeL2::TileIndex::insert(std::uint64_t key, std::int32_t tile) {
  if (2 * (used_ + 1) > entries_.size()) grow();
  const std::size_t mask = entries_.size() - 1;
  std::size_t at = home(key);
  while (entries_[at].tile >= 0) at = (at + 1) & mask;
  entries_[at] = Entry{key, tile};
  ++used_;
}

// The entries after the erased one, up to the next empty one, move back into the hole when their home is not
// between the hole and where they are: every key stays reachable from its home without a gap.
void SetAssociativeL2::TileIndex::erase(std::uint64_t key) {
  const std::size_t mask = entries_.size() - 1;
  std::size_t hole = home(key);
  while (entries_[hole].key != key || entries_[hole].tile < 0) hole = (hole + 1) & mask;
  for (std::size_t at = (hole + 1) & mask; entries_[at].tile >= 0; at = (at + 1) & mask) {
    const std::size_t from_home = (at - home(entries_[at].key)) & mask;  // how far it sits past its home
    if (from_home >= ((at - hole) & mask)) {  // its home is at or before the hole
      entries_[hole] = entries_[at];
      hole = at;
    }
  }
  entries_[hole].tile = -1;
  --used_;
}

void SetAssociativeL2::TileIndex::grow() {
  std::vector<Entry> old(2 * entries_.size());
  old.swap(entries_);
  --shift_;
  used_ = 0;
  for (const Entry& e : old)
    if (e.tile >= 0) insert(e.key, e.tile);
}

}  // namespace flashlab
