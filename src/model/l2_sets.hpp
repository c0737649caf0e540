#pragma once
// One L2 partition of the GPU level (model/gpu.hpp), as a set-associative cache in expectation.
//
// An L2 is not one LRU list: it is S sets of A ways, and a line's address picks its set through a hash.
// Under LRU within each set, a line reused after D bytes of other distinct lines is still there exactly
// when fewer than A of those lines fell into its set. With a hash that spreads lines evenly, the count
// that fell into one set is Poisson with mean A * D / C (C the capacity), so the line is still there with
// probability
//
//     H(D) = P(Poisson(A * D / C) <= A - 1).
//
// This is the classic conversion of LRU stack distances into a set-associative cache's misses. H falls
// from 1 to 0 around D = C, over a width that narrows as A grows; A = 0 stands for a fully associative LRU,
// whose H steps from 1 to 0 where D plus the tile itself passes C (and then this class reproduces an LRU of
// whole tiles exactly).
//
// Why it matters on an H100 (lesson 05, "What the counters say"): cuda-fa1 sweeps each head's Q and O again
// and again. An LRU either holds such a working set (no re-reads) or not (every pass misses); the counters
// move smoothly between the two, from about 24 MiB of Q and O to about 48 MiB, and sets of 28 ways follow them
// (bench/results/h100-dram-counters_l2-transition*.json).
//
// Written lines are not kept as well as read ones. Where cuda-fa1 starts to overflow the L2, the H100 writes
// back about one byte for every byte it reads again: what it evicts first is O, which the block wrote, not Q,
// which it only read (an LRU would evict both alike, and write back half). So a tile a store wrote enters the
// order of last touches as if `store_age` x C bytes of other lines had come after it: in its set it starts
// A x store_age lines below the newest, on average. A load makes it the newest again.
//
// The cache keeps whole tiles, as L2Model does, and for each the probability that it is here and the
// probability that it is here and dirty, so the bytes it reports are expectations: DRAM reads are the
// bytes a load finds missing, DRAM writes the dirty bytes that left before the next touch. D is counted
// exactly, in bytes of distinct tiles, with a tree of sums over the order of last touches.
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "core/problem.hpp"
#include "model/traffic.hpp"

namespace flashlab {

class SetAssociativeL2 {
 public:
  // `ways` = 0: a fully associative LRU. `shape` tells which query heads share a K/V head. `store_age`: how
  // far below the newest a store leaves its tile, in fractions of the capacity (0: a store is a touch).
  SetAssociativeL2(std::int64_t capacity_bytes, int ways, const Shape& shape, double store_age = 0);

  // A tile looked up once. A replay asks about the same tile two or three times per access (is it here? then
  // the access or refresh itself); a Found carries what the lookup learnt to the calls that follow, and is good
  // until this cache next changes (access, refresh or settle: using it after that throws std::logic_error).
  struct Found {
    std::uint64_t key = 0;
    std::int32_t tile = -1;       // index of its Tile; -1: not held
    double kept = 0;              // H(D): the chance it stayed since its last touch
    std::uint64_t generation = 0; // the cache's changes so far, when it was found
  };
  std::uint64_t key_of(const TileEvent& e) const { return cache_key(e, heads_q_, heads_kv_); }
  Found find(std::uint64_t key) const;
  // A hint that find(key) comes soon: its place in the index is fetched into the CPU's cache meanwhile.
  void prefetch(std::uint64_t key) const { index_.prefetch(key); }

  // The probability that this cache holds the tile now.
  double presence(const Found& f) const {
    check(f);
    return f.tile >= 0 ? tiles_[std::size_t(f.tile)].here * f.kept : 0;
  }
  // A Load or Store `e` of the tile `f` found (other events only count). A load's missing part is served by
  // DRAM, except `from_peer`, the share of it another cache serves (an L2 partition on the other side); it
  // counts as a hit. A store writes the whole tile (nothing fetched) and leaves it dirty. A tile is at most
  // 128 MiB (InputError otherwise).
  void access(const Found& f, const TileEvent& e, double from_peer = 0);
  // The tile, if here, becomes the most recently used, counting nothing (a near copy of bytes that a store
  // wrote in their home partition); it keeps the age a store gave it.
  void refresh(const Found& f);

  // The same for the tile of one Load or Store event, looked up each time.
  double presence(const TileEvent& e) const { return presence(find(key_of(e))); }
  void access(const TileEvent& e, double from_peer = 0);
  void refresh(const TileEvent& e) { refresh(find(key_of(e))); }
  // The kernel ended: what left dirty before now counts as written; the rest is dirty_bytes().
  void settle();

  const TrafficTotals& dram() const { return dram_; }  // per tensor; final after settle()
  std::int64_t hit_bytes() const { return std::llround(hit_); }
  std::int64_t dirty_bytes() const { return std::llround(dirty_at_end_); }

 private:
  // 32 bytes on a 32-byte boundary: a lookup that reaches it reads one cache line.
  static constexpr int kTileBytesBits = 27;  // a tile of at most 128 MiB, as the GPU level's accesses
  struct alignas(32) Tile {
    std::uint64_t key = 0;
    double here = 1, dirty = 0;  // P(held) and P(held and dirty), as of its last touch
    std::int32_t slot = -1;      // its place in the order of last touches; -1: gone
    std::uint32_t bytes : kTileBytesBits = 0;
    std::uint32_t tensor : 4 = 0;
    std::uint32_t stored : 1 = 0;  // its last touch was a store: it counts as store_age x C bytes older
  };
  static_assert(sizeof(Tile) == 32);
  static_assert(static_cast<int>(TensorId::Count) <= 16);
  // Tile keys to their index in tiles_: open addressing with linear probing, at most half full, and backward
  // shifts on erase (no tombstones). A replay looks up a tile for every access of every partition.
  class TileIndex {
   public:
    TileIndex();
    inline std::int32_t find(std::uint64_t key) const;  // -1: absent
    void prefetch(std::uint64_t key) const { __builtin_prefetch(&entries_[home(key)]); }
    void insert(std::uint64_t key, std::int32_t tile);  // the key is absent
    void erase(std::uint64_t key);                      // the key is present

   private:
    struct Entry {
      std::uint64_t key = 0;
      std::int32_t tile = -1;  // -1: empty
    };
    std::size_t home(std::uint64_t key) const { return std::size_t((key * 0x9E3779B97F4A7C15ULL) >> shift_); }
    void grow();
    std::vector<Entry> entries_;
    std::size_t used_ = 0;
    int shift_ = 0;  // 64 - log2(entries_.size())
  };

  // The helpers of the hot path are inline (defined in l2_sets.cpp, the one file that calls them): built as
  // position-independent code, a function that could be interposed is not inlined otherwise.
  inline double still_here(double distance, std::int64_t own_bytes) const;  // H
  inline double distance(const Tile& t) const;  // bytes of other tiles touched since t, plus its age
  void check(const Found& f) const {            // f is still good: nothing changed since it was found
    if (f.generation != generation_) stale();
  }
  [[noreturn]] static void stale();
  // Its reuse: what left since the last touch (dirty bytes written back), then its touch. `kept` is H(D).
  inline double reuse(Tile& t, double kept);
  inline void touch(std::int32_t at);
  inline void place(std::int32_t at);
  void forget(std::int32_t at);
  inline void drop_gone();
  void renumber();
  inline void set_slot(std::int32_t slot, std::int64_t bytes);
  void flush();
  void size_tree(std::size_t slots);
  inline void add_bytes(std::int32_t slot, std::int64_t bytes);
  inline std::int64_t bytes_up_to(std::int32_t slot) const;
  inline void write_back(const Tile& t, double bytes);

  double capacity_;
  int ways_;
  double store_age_bytes_;
  int heads_q_, heads_kv_;
  static constexpr int kSteps = 4096;        // H tabulated over D / C in [0, kReach]
  static constexpr double kReach = 4.0;      // beyond 4 C a line of a set of 16 ways or more is gone (H < 1e-8)
  // The newest slots enter the tree kBatch at a time (a tile touched again before that never enters it, and
  // the batch costs little more than one slot); the bytes after a tile among them, or within the last kScan
  // slots, are summed slot by slot.
  static constexpr std::int32_t kBatch = 64, kScan = 32;
  static constexpr std::int32_t kRotate = 8;  // a tile touched within the last kRotate slots takes no new one
  static constexpr std::int32_t kDropAhead = 8;  // drop_gone fetches the tiles this many slots on
  std::vector<double> h_table_;
  double surely_held_ = 0;                   // H(D) > 0 for every D below it
  double surely_whole_ = 0;                  // H(D) = 1 for every D below it
  // Vectors whose data starts on a cache line: a node's kFan siblings (eight 8-byte sums) then fill one line.
  template <typename T>
  struct LineAligned {
    using value_type = T;
    LineAligned() = default;
    template <typename U>
    LineAligned(const LineAligned<U>&) {}
    T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
    void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); }
    template <typename U>
    bool operator==(const LineAligned<U>&) const { return true; }
  };
  // The tree of sums over the slots: level 0 is slot_bytes_, and node p of level L + 1 holds the bytes of the
  // nodes kFan p .. kFan p + kFan - 1 of level L, counting only the slots below flushed_. The bytes up to a slot
  // are, at each level, those of the siblings before its ancestor: one cache line per level, and few levels.
  static constexpr int kFanBits = 3, kFan = 1 << kFanBits;
  static constexpr int kMaxLevels = 24;
  std::vector<std::int64_t, LineAligned<std::int64_t>> slot_bytes_;  // bytes per slot: each tile's as of its
                                                                      // last touch, 0 for a free slot
  std::vector<std::int64_t, LineAligned<std::int64_t>> sums_;  // the levels above 0, one after another
  std::array<std::size_t, kMaxLevels> level_at_{};              // where level L + 1 starts in sums_
  int levels_ = 0;                                              // levels above 0
  // The last answer of bytes_up_to, kept up to date as slots change: a replay asks about the slot after the last
  // one it asked about most of the time (a block's tiles come back in the order they left, the two shares of a
  // tile one after the other), and that answer is the kept one plus one slot's bytes.
  static constexpr std::int32_t kFollow = 8;  // up to this many slots after the kept one are summed one by one
  mutable std::int32_t known_slot_ = -1;
  mutable std::int64_t known_bytes_ = 0;  // the bytes of slots 0 .. known_slot_ (none: 0)
  std::vector<std::int32_t> slot_tile_;      // tile index per slot, -1: free
  std::int32_t next_slot_ = 0, oldest_slot_ = 0, flushed_ = 0;
  std::int64_t total_ = 0;                   // bytes of the tiles held
  std::vector<Tile> tiles_;
  std::vector<std::int32_t> free_tiles_;
  TileIndex index_;
  std::uint64_t generation_ = 0;             // changes so far (access, refresh, settle)
  TrafficTotals dram_;
  std::array<double, static_cast<int>(TensorId::Count)> read_{}, written_{};
  double hit_ = 0, dirty_at_end_ = 0;
};

}  // namespace flashlab
