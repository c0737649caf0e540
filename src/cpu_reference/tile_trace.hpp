#pragma once
// Internal to src/cpu_reference: the event side of a tiled loop nest. The nest makes one call per
// HBM <-> SRAM transfer or pseudocode step; TileTrace turns it into a TileEvent for the observer and
// keeps the SRAM ledger (bytes resident). With no observer every call returns at once, so the
// arithmetic run pays nothing for it.
#include <cstdint>

#include "core/problem.hpp"
#include "model/traffic.hpp"

namespace flashlab::detail {

// A tile of a tensor: block (tile_row, tile_col), rows x cols elements.
struct TileRef {
  TensorId tensor;
  int tile_row, tile_col, rows, cols;
};

class TileTrace {
 public:
  TileTrace(TrafficObserver* observer, Algorithm algorithm, Pass pass, int bytes_per_element)
      : observer_(observer), bytes_per_element_(bytes_per_element) {
    event_.algorithm = algorithm;
    event_.pass = pass;
  }
  // Where the nest is: (batch * heads_q + head) and the loop indices (-1 outside that loop).
  void at(int bh, int i, int j) {
    event_.bh = bh;
    event_.i = i;
    event_.j = j;
  }
  void load(const TileRef& t, int line) { emit(t, Direction::Load, line, +1, true); }   // HBM -> SRAM
  void store(const TileRef& t, int line) { emit(t, Direction::Store, line, -1, true); } // SRAM -> HBM, leaves
  void create(const TileRef& t, int line) { emit(t, Direction::Compute, line, +1, false); }  // new on chip
  void compute(const TileRef& t, int line) { emit(t, Direction::Compute, line, 0, false); }  // update on chip
  void free(const TileRef& t, int line) { emit(t, Direction::Free, line, -1, false); }       // leaves, no write

 private:
  void emit(const TileRef& t, Direction direction, int line, int sram_sign, bool moves_bytes) {
    if (!observer_) return;
    const std::int64_t tile_bytes = std::int64_t{t.rows} * t.cols * bytes_per_element_;
    sram_bytes_ += sram_sign * tile_bytes;
    event_.tensor = t.tensor;
    event_.direction = direction;
    event_.tile_row = t.tile_row;
    event_.tile_col = t.tile_col;
    event_.rows = t.rows;
    event_.cols = t.cols;
    event_.bytes = moves_bytes ? tile_bytes : 0;
    event_.line = line;
    event_.sram_bytes = sram_bytes_;
    observer_->on_event(event_);
    ++event_.index;
  }

  TrafficObserver* observer_;
  int bytes_per_element_;
  std::int64_t sram_bytes_ = 0;
  TileEvent event_;
};

}  // namespace flashlab::detail
