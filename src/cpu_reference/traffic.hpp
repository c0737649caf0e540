#pragma once
// The traffic model: every HBM <-> SRAM tile transfer of a loop nest, as events. The tiled loop nest
// (tiled.cpp) is the only producer; the CLI's `trace`, the tests and the app's animation are
// consumers. Two levels, as in the paper: HBM and SRAM (on-chip shared memory / registers).
#include <array>
#include <cstdint>
#include <string>

#include "../core/problem.hpp"

namespace flashlab {

enum class Pass { Forward, Backward };

// Tensors that live in HBM. Stats: m and l (FA1) or the LSE (FA2); D = rowsum(dO * O).
enum class TensorId { Q, K, V, O, S, P, M, L, LSE, dO, dQ, dK, dV, dS, dP, D, Count };
const char* to_string(TensorId);

enum class Direction {
  Load,     // HBM -> SRAM
  Store,    // SRAM -> HBM
  Free,     // leaves SRAM without being written back (no bytes move)
  Compute,  // arithmetic on tiles already in SRAM: marks a line of the pseudocode (bytes = 0)
};

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

}  // namespace flashlab
