#pragma once
// Replay of a recorded event stream: the state of every tile after the first K events. The events
// come from the library's loop nest (count_traffic, the same nest tiled_forward runs); nothing here
// knows the loop order, it only applies events: Load puts a tile in SRAM, Store and Free take it out,
// the (i, j) of each event marks score tile S_ij as being computed.
#include <cstdint>
#include <string>
#include <vector>

#include "scenario.hpp"

namespace flashlab::viz {

enum class TileState : std::uint8_t { Pending, InSram, Done, Skipped };
const char* to_string(TileState);  // "pending", "in_sram", "done", "skipped"

// Collects every event of a run.
class EventRecorder : public TrafficObserver {
 public:
  void on_event(const TileEvent& e) override { events.push_back(e); }
  std::vector<TileEvent> events;
};

// One recorded run: the problem, its tiling and its whole event stream.
struct Trace {
  Algorithm algorithm{};
  Pass pass{};
  Problem problem;
  Tiling tiling;
  int bytes_per_element = 2;
  std::int64_t sram_capacity = 0;  // M in bytes
  int Tr = 0, Tc = 0;               // query blocks, key blocks
  std::vector<TileEvent> events;
  TrafficTotals totals;             // of the whole stream
  std::vector<std::uint8_t> score_visited;  // (Tr, Tc): 1 when some event works on S_ij
};

// Events the app will hold for animation; larger runs are refused (the plots still count them).
constexpr std::int64_t kMaxReplayEvents = 6'000'000;

// Records `algorithm`'s events for the scenario's problem. Throws InputError when the stream would be
// longer than max_events (with the count and how to shrink it).
Trace record_trace(const Scenario&, Algorithm algorithm, std::int64_t max_events = kMaxReplayEvents);

// Which 1-d grid a tensor's tiles lie on: query blocks (Q, O, dO, dQ, stats) or key blocks (K, V, dK, dV);
// S, P, dS, dP lie on the (Tr, Tc) score grid.
enum class Axis { Query, Key, Score };
Axis axis_of(TensorId);
// The score tile an event works on, or false: (i, j) when both loop indices are set, else the tile
// of an S/P/dS/dP event.
bool score_tile_of(const TileEvent&, int& i, int& j);

// The state after the first `step` events (step in [0, events.size()]).
class Replay {
 public:
  explicit Replay(const Trace&);
  void seek(std::int64_t step);  // forward: applies the new events; backward: replays from 0
  std::int64_t step() const { return step_; }
  std::int64_t size() const { return static_cast<std::int64_t>(trace_->events.size()); }
  const Trace& trace() const { return *trace_; }

  TileState tile(TensorId, int block) const;        // Q, K, V, O, ... tile `block` on its axis
  int reads(TensorId, int block) const;             // Load events of that tile so far
  int writes(TensorId, int block) const;            // Store events so far
  TileState score(int i, int j) const;              // S_ij
  int score_loads(int i, int j) const;              // S/P tiles read back from HBM (standard)
  const TrafficTotals& totals() const { return counter_.totals(); }  // of the first `step` events
  std::int64_t sram_bytes() const;                  // resident after the last applied event
  const TileEvent* current() const;                 // the last applied event, or nullptr at step 0
  int axis_length(Axis a) const { return a == Axis::Key ? trace_->Tc : trace_->Tr; }

 private:
  void reset();
  void apply(const TileEvent&);
  int slot(TensorId t, int block) const;

  const Trace* trace_;
  std::int64_t step_ = 0;
  TrafficCounter counter_;
  std::vector<TileState> tiles_;   // (TensorId::Count, max(Tr, Tc))
  std::vector<int> reads_, writes_;
  std::vector<int> score_seen_;    // events that worked on S_ij so far
  std::vector<int> score_loads_;
  int cur_i_ = -1, cur_j_ = -1;
};

// Lock-step: the step of `other` at the same fraction of its stream as `step` is of `self`'s.
std::int64_t lockstep(std::int64_t step, std::int64_t self_size, std::int64_t other_size);

// A one-line description of an event: "load K_3 (64 x 64, 8.0 KiB) -> SRAM 24.0 KiB".
std::string describe(const TileEvent&);

// Per tensor: "FA1 moved 8.0x more bytes for O than FA2 (...)". Empty when both moved the same.
std::vector<std::string> compare_totals(const Trace& a, const Trace& b);

}  // namespace flashlab::viz
