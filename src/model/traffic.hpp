#pragma once
// The traffic model: every HBM <-> SRAM tile transfer of a loop nest, as events. The tiled loop nest
// (src/cpu_reference) is the only producer; the CLI's `trace`, the tests and the app's animation are
// consumers. Two levels, as in the paper: HBM and SRAM (on-chip shared memory / registers).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashlab {

enum class Pass { Forward, Backward };

// Tensors that live in HBM. Row statistics: FA1 saves the running max m and the running sum l; FA2
// saves the logsumexp L = m + log(l) (TensorId::LSE, printed "L"). D holds D_i = rowsum(dO_i o O_i).
enum class TensorId { Q, K, V, O, S, P, m, l, LSE, dO, dQ, dK, dV, dS, dP, D, Count };
const char* to_string(TensorId);

enum class Direction {
  Load,     // HBM -> SRAM
  Store,    // SRAM -> HBM
  Free,     // leaves SRAM without being written back (no bytes move)
  Compute,  // arithmetic on tiles already in SRAM: marks a line of the pseudocode (bytes = 0)
};
// How the producer (the tiled loop nests) uses them, so a consumer can replay SRAM occupancy:
//  * Load adds the tile to SRAM; Store writes it back and it leaves SRAM; Free drops it unwritten.
//  * Compute names the tile it produces or updates (tensor, tile, rows, cols). A tile born on chip
//    (O_i initialized to 0, S_ij, dK_j, ...) enters SRAM with its first Compute event; sram_bytes
//    says so. P_ij overwrites S_ij and dS_ij overwrites dP_ij in place, as on a GPU.
//  * Causal attention emits nothing for a skipped tile.

struct TileEvent {
  std::int64_t index = 0;  // position of this event in the stream, from 0
  Algorithm algorithm{};
  Pass pass{};
  int bh = 0;              // batch * heads_q + head
  TensorId tensor{};
  Direction direction{};
  int tile_row = 0;        // block index along the query sequence (i), or 0
  int tile_col = 0;        // block index along the key sequence (j), or 0
  int rows = 0, cols = 0;  // the tile's extent in elements
  std::int64_t bytes = 0;  // rows * cols * bytes_per_element for Load/Store, else 0
  int i = -1, j = -1;      // the loop indices (i: query block, j: key block); -1 outside that loop
  int line = 0;            // line of the algorithm's pseudocode listing (pseudocode(), 1-based)
  std::int64_t sram_bytes = 0;  // bytes resident in SRAM after this event
};

class TrafficObserver {
 public:
  virtual ~TrafficObserver() = default;
  virtual void on_event(const TileEvent&) = 0;
};

// Totals per tensor and direction, plus peak SRAM: what `flashlab trace` prints.
struct TrafficTotals {
  std::array<std::int64_t, static_cast<int>(TensorId::Count)> read{}, written{};
  std::int64_t events = 0;
  std::int64_t peak_sram_bytes = 0;
  std::int64_t total_read() const;
  std::int64_t total_written() const;
  std::int64_t total() const { return total_read() + total_written(); }
};

class TrafficCounter : public TrafficObserver {
 public:
  void on_event(const TileEvent& e) override;
  const TrafficTotals& totals() const { return totals_; }

 private:
  TrafficTotals totals_;
};

// The key a cache keeps a tile under: (batch and head, tensor, tile). With heads_kv > 0 the query heads
// that share a K/V head (GQA) share its K, V, dK and dV tiles; with 0, every bh has its own.
std::uint64_t cache_key(const TileEvent& e, int heads_q, int heads_kv);
// The key of the same tile at another column: cache_key of e with tile_col = col (0 <= col < 2^22), from
// cache_key of e, without the division GQA costs.
std::uint64_t cache_key_at_col(std::uint64_t key, int col);

// A third level between HBM and SRAM: a last-level cache (on an H100, Nsight Compute shows the
// 50 MB L2 absorbing FA2's re-reads of K and V). Replays the events through an LRU cache of whole
// tiles with write-back and write-allocate, and counts the bytes that reach DRAM: a Load of a tile
// still in L2 is a hit; a Store dirties the tile (a whole tile is written, so nothing is fetched
// first); a dirty tile is written to DRAM when it is evicted or at flush().
//
// Why whole tiles and not 128-byte lines: every access of a loop nest moves a whole tile, so all the
// lines of a tile are touched together and sit side by side in LRU order; evicting the tile evicts
// those lines. The only difference from a line-by-line LRU is the one tile cut in two at the capacity
// boundary, at most one tile's bytes (16-64 KB against tens of MB). Tiles are keyed by (batch and
// head, tensor, tile): with a Shape, the query heads that share a K/V head (GQA) share its K, V, dK
// and dV tiles; without one, every bh has its own (cache_key). Fed by a loop nest directly, the order is
// the nest's sequential one. Capacity 0 reproduces the two-level TrafficCounter totals exactly; an
// endless one gives the compulsory traffic (CompulsoryTraffic counts the same faster, and the GPU level,
// model/gpu.hpp, takes it from there). The GPU level's L2 partitions are SetAssociativeL2s (model/l2_sets.hpp),
// which with 0 ways reproduce this LRU exactly.
class L2Model : public TrafficObserver {
 public:
  explicit L2Model(std::int64_t capacity_bytes, const Shape* shape = nullptr);
  ~L2Model() override;
  L2Model(const L2Model&) = delete;
  L2Model& operator=(const L2Model&) = delete;
  void on_event(const TileEvent& e) override;
  // Writes back what is still dirty; call once after the walk. The totals are final after it.
  void flush();
  // DRAM bytes per tensor (read: L2 misses; written: write-backs), events and peak SRAM.
  const TrafficTotals& dram() const { return dram_; }
  std::int64_t hit_bytes() const { return hit_bytes_; }  // loads served by L2
  std::int64_t dirty_bytes() const;                        // written to L2 and not yet to DRAM
  std::int64_t capacity_bytes() const { return capacity_; }

 private:
  std::uint64_t key_of(const TileEvent& e) const;
  struct Cache;
  std::unique_ptr<Cache> cache_;
  std::int64_t capacity_;
  int heads_q_ = 0, heads_kv_ = 0;  // from the Shape; 0: no sharing
  TrafficTotals dram_;
  std::int64_t hit_bytes_ = 0;
};

// The compulsory traffic: what an L2 of endless size lets through to DRAM. Each distinct tile is read once, if
// its first access is a Load, and written once, with the bytes of its last access, if any access was a Store.
// The same totals as L2Model with an endless capacity, counted without an order of last touches (nothing is
// ever evicted, so there is none to keep): one lookup per event in a flat table of tiles. Keys as cache_key.
class CompulsoryTraffic : public TrafficObserver {
 public:
  explicit CompulsoryTraffic(const Shape* shape = nullptr);
  void on_event(const TileEvent& e) override { on_event(e, key_of(e)); }
  // The same for an event whose key (key_of) the caller has, and a hint that a key's event comes soon: its
  // place in the table is fetched into the CPU's cache meanwhile (the table holds every tile ever seen, so
  // without the hint most lookups of a long replay miss the CPU's caches).
  std::uint64_t key_of(const TileEvent& e) const { return cache_key(e, heads_q_, heads_kv_); }
  void on_event(const TileEvent& e, std::uint64_t key);
  void prefetch(std::uint64_t key) const { __builtin_prefetch(&table_[home(key)]); }
  // Adds the written bytes of the tiles that were stored; call once after the walk. The totals are final after it.
  void flush();
  const TrafficTotals& dram() const { return dram_; }  // reads, writes, events and peak SRAM

 private:
  struct Tile {
    std::uint64_t key = 0;
    std::int64_t bytes = -1;  // as of its last access; -1: an empty entry
    TensorId tensor{};
    bool stored = false;
  };
  Tile& find_or_add(std::uint64_t key);
  std::size_t home(std::uint64_t key) const { return std::size_t((key * 0x9E3779B97F4A7C15ULL) >> shift_); }
  void grow();
  std::vector<Tile> table_ = std::vector<Tile>(1024);  // open addressing, linear probing, at most half full
  std::size_t used_ = 0;
  int shift_ = 64 - 10;  // 64 - log2(table_.size())
  std::uint64_t last_key_ = 0;
  Tile* last_ = nullptr;  // the tile of the last access (blocks side by side access the same tile in turn)
  int heads_q_ = 0, heads_kv_ = 0;
  TrafficTotals dram_;
};

}  // namespace flashlab
