#include "replay.hpp"

#include <algorithm>
#include <cstdio>

#include "format.hpp"

namespace flashlab::viz {

namespace {
constexpr int kTensorCount = static_cast<int>(TensorId::Count);
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

const char* to_string(TileState s) {
  switch (s) {
    case TileState::Pending: return "pending";
    case TileState::InSram: return "in_sram";
    case TileState::Done: return "done";
    case TileState::Skipped: return "skipped";
  }
  return "?";
}

Axis axis_of(TensorId t) {
  switch (t) {
    case TensorId::K:
    case TensorId::V:
    case TensorId::dK:
    case TensorId::dV: return Axis::Key;
    case TensorId::S:
    case TensorId::P:
    case TensorId::dS:
    case TensorId::dP: return Axis::Score;
    default: return Axis::Query;
  }
}

bool score_tile_of(const TileEvent& e, int& i, int& j) {
  if (e.i >= 0 && e.j >= 0) {
    i = e.i;
    j = e.j;
    return true;
  }
  if (axis_of(e.tensor) == Axis::Score) {
    i = e.tile_row;
    j = e.tile_col;
    return true;
  }
  return false;
}

Trace record_trace(const Scenario& s, Algorithm algorithm, std::int64_t max_events) {
  Trace t;
  t.algorithm = algorithm;
  t.pass = s.pass;
  t.problem = to_problem(s);
  t.tiling = resolve_tiling(s);
  t.bytes_per_element = bytes_per_element(s);
  t.sram_capacity = s.sram_bytes;
  t.Tr = ceil_div(s.seq_q, t.tiling.Br);
  t.Tc = ceil_div(s.seq_k, t.tiling.Bc);

  // Count first (no storage), so a huge run is refused before it fills memory.
  TrafficCounter counter;
  count_traffic(algorithm, s.pass, t.problem, t.tiling, t.bytes_per_element, counter);
  t.totals = counter.totals();
  if (t.totals.events > max_events)
    throw InputError(std::string(to_string(algorithm)) + " at N=" + std::to_string(s.seq_q) + " makes " +
                     format_count(double(t.totals.events)) + " events, more than the " +
                     format_count(double(max_events)) +
                     " the app animates: use a smaller N or a larger SRAM size (the plots still count it)");
  EventRecorder recorder;
  recorder.events.reserve(static_cast<std::size_t>(t.totals.events));
  count_traffic(algorithm, s.pass, t.problem, t.tiling, t.bytes_per_element, recorder);
  t.events = std::move(recorder.events);

  // The grids cover every tile an event names, even if the loop nest's blocks differ from ours.
  for (const TileEvent& e : t.events) {
    t.Tr = std::max(t.Tr, std::max(e.i, axis_of(e.tensor) == Axis::Key ? 0 : e.tile_row) + 1);
    t.Tc = std::max(t.Tc, std::max(e.j, e.tile_col) + 1);
  }
  t.score_visited.assign(std::size_t(t.Tr) * t.Tc, 0);
  for (const TileEvent& e : t.events) {
    int i, j;
    if (score_tile_of(e, i, j)) t.score_visited[std::size_t(i) * t.Tc + j] = 1;
  }
  return t;
}

Replay::Replay(const Trace& t) : trace_(&t) { reset(); }

void Replay::reset() {
  const Trace& t = *trace_;
  const std::size_t n = std::size_t(kTensorCount) * std::max(t.Tr, t.Tc);
  tiles_.assign(n, TileState::Pending);
  reads_.assign(n, 0);
  writes_.assign(n, 0);
  score_seen_.assign(std::size_t(t.Tr) * t.Tc, 0);
  score_loads_.assign(std::size_t(t.Tr) * t.Tc, 0);
  counter_ = TrafficCounter{};
  step_ = 0;
  cur_i_ = cur_j_ = -1;
}

int Replay::slot(TensorId t, int block) const {
  return static_cast<int>(t) * std::max(trace_->Tr, trace_->Tc) + block;
}

void Replay::apply(const TileEvent& e) {
  counter_.on_event(e);
  const Axis axis = axis_of(e.tensor);
  int si = -1, sj = -1;
  const bool on_score = score_tile_of(e, si, sj);
  cur_i_ = on_score ? si : -1;
  cur_j_ = on_score ? sj : -1;
  if (on_score) ++score_seen_[std::size_t(si) * trace_->Tc + sj];
  if (axis == Axis::Score) {
    if (e.direction == Direction::Load) ++score_loads_[std::size_t(e.tile_row) * trace_->Tc + e.tile_col];
    return;
  }
  const int s = slot(e.tensor, axis == Axis::Key ? e.tile_col : e.tile_row);
  // A Compute that grows SRAM creates the tile on chip (FA2's O_i, m_i, l_i); others update it in place.
  const std::int64_t before = step_ > 0 ? trace_->events[std::size_t(step_ - 1)].sram_bytes : 0;
  if (e.direction == Direction::Compute) {
    if (e.sram_bytes > before) tiles_[s] = TileState::InSram;
    return;
  }
  switch (e.direction) {
    case Direction::Load:
      tiles_[s] = TileState::InSram;
      ++reads_[s];
      break;
    case Direction::Store:
      tiles_[s] = TileState::Done;
      ++writes_[s];
      break;
    case Direction::Free: tiles_[s] = TileState::Done; break;
    case Direction::Compute: break;
  }
}

void Replay::seek(std::int64_t step) {
  step = std::clamp<std::int64_t>(step, 0, size());
  if (step < step_) reset();
  for (; step_ < step; ++step_) apply(trace_->events[std::size_t(step_)]);  // apply sees step_ = its index
}

TileState Replay::tile(TensorId t, int block) const { return tiles_[slot(t, block)]; }
int Replay::reads(TensorId t, int block) const { return reads_[slot(t, block)]; }
int Replay::writes(TensorId t, int block) const { return writes_[slot(t, block)]; }

TileState Replay::score(int i, int j) const {
  const std::size_t k = std::size_t(i) * trace_->Tc + j;
  if (!trace_->score_visited[k]) return TileState::Skipped;
  if (i == cur_i_ && j == cur_j_) return TileState::InSram;
  return score_seen_[k] > 0 ? TileState::Done : TileState::Pending;
}

int Replay::score_loads(int i, int j) const { return score_loads_[std::size_t(i) * trace_->Tc + j]; }

std::int64_t Replay::sram_bytes() const { return step_ > 0 ? trace_->events[std::size_t(step_ - 1)].sram_bytes : 0; }

const TileEvent* Replay::current() const { return step_ > 0 ? &trace_->events[std::size_t(step_ - 1)] : nullptr; }

std::int64_t lockstep(std::int64_t step, std::int64_t self_size, std::int64_t other_size) {
  if (self_size <= 0) return 0;
  if (step >= self_size) return other_size;
  return static_cast<std::int64_t>(double(step) / double(self_size) * double(other_size));
}

std::string describe(const TileEvent& e) {
  const char* verb = "compute";
  switch (e.direction) {
    case Direction::Load: verb = "load"; break;
    case Direction::Store: verb = "store"; break;
    case Direction::Free: verb = "free"; break;
    case Direction::Compute: verb = "compute"; break;
  }
  const Axis axis = axis_of(e.tensor);
  char tile[48];
  if (axis == Axis::Score) std::snprintf(tile, sizeof tile, "%s_%d,%d", to_string(e.tensor), e.tile_row, e.tile_col);
  else std::snprintf(tile, sizeof tile, "%s_%d", to_string(e.tensor), axis == Axis::Key ? e.tile_col : e.tile_row);
  char buf[192];
  if (e.direction == Direction::Compute)
    std::snprintf(buf, sizeof buf, "%s %s (line %d); SRAM %s", verb, tile, e.line,
                  format_bytes(double(e.sram_bytes)).c_str());
  else
    std::snprintf(buf, sizeof buf, "%s %s (%d x %d, %s); SRAM %s", verb, tile, e.rows, e.cols,
                  format_bytes(double(e.bytes)).c_str(), format_bytes(double(e.sram_bytes)).c_str());
  return buf;
}

std::vector<std::string> compare_totals(const Trace& a, const Trace& b) {
  std::vector<std::string> out;
  const char* na = to_string(a.algorithm);
  const char* nb = to_string(b.algorithm);
  auto upper = [](const char* s) {
    std::string u = s;
    for (char& c : u) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return u;
  };
  for (int t = 0; t < kTensorCount; ++t) {
    const double ba = double(a.totals.read[t] + a.totals.written[t]);
    const double bb = double(b.totals.read[t] + b.totals.written[t]);
    if (ba == bb) continue;
    const char* tensor = to_string(static_cast<TensorId>(t));
    const bool a_more = ba > bb;
    const std::string more = upper(a_more ? na : nb), less = upper(a_more ? nb : na);
    const std::string big = format_bytes(std::max(ba, bb)), small = format_bytes(std::min(ba, bb));
    char buf[256];
    if (ba == 0 || bb == 0)
      std::snprintf(buf, sizeof buf, "%s moves %s of %s; %s moves none", more.c_str(), big.c_str(), tensor, less.c_str());
    else
      std::snprintf(buf, sizeof buf, "%s moved %s more bytes for %s (%s vs %s)", more.c_str(),
                    format_ratio(std::max(ba, bb) / std::min(ba, bb)).c_str(), tensor, big.c_str(), small.c_str());
    const std::string line = buf;
    out.push_back(line);
  }
  return out;
}

}  // namespace flashlab::viz
