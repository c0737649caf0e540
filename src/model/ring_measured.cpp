// A measured ring timeline, read step by step (ring_measured.hpp gives the definitions). The schedule
// (ring.hpp) says which transfers each (rank, step) must have and what they carry when the file does not say;
// everything timed comes from the spans.
#include "model/ring_measured.hpp"

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>

namespace flashlab {

namespace {

const std::vector<std::string> kRequiredInfo = {"ranks", "layout", "pass",   "batch", "heads",       "heads_kv",
                                                "seq",   "causal", "dtype",  "head_dim", "block_kernel"};
constexpr std::int64_t kMaxExtent = std::int64_t(1) << 30;

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : ", ") + w;
  return s;
}

// A whole number >= 1 written as a string ("4"), as the info map holds every value.
std::int64_t positive(const Timeline& t, const std::string& key, std::int64_t most, const std::string& what) {
  const std::string& text = t.info.at(key);
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > most)
    throw InputError(what + ": info \"" + key + "\" is \"" + text + "\"; it must be a whole number from 1 to " +
                     std::to_string(most));
  return v;
}

// [begin, end) intervals, sorted and merged: a rank's compute stream.
using Intervals = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& iv : v) {
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

std::uint64_t overlap(const Intervals& busy, std::uint64_t b, std::uint64_t e) {
  std::uint64_t sum = 0;
  for (const auto& [ib, ie] : busy) {
    const std::uint64_t lo = std::max(b, ib), hi = std::min(e, ie);
    if (hi > lo) sum += hi - lo;
  }
  return sum;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

RingRun parse_run(const Timeline& t, const std::string& what) {
  if (!t.is_ring())
    throw InputError(what + " is not a ring timeline: its otherData.info has no \"ranks\" (a ring timeline names " +
                     join(kRequiredInfo) + ")");
  for (const std::string& key : kRequiredInfo)
    if (!t.info.count(key))
      throw InputError(what + ": info \"" + key + "\" is missing; a ring timeline names " + join(kRequiredInfo));
  RingRun run;
  try {
    run.ranks = int(positive(t, "ranks", 1 << 16, what));
    run.layout = parse_ring_layout(t.info.at("layout"));
    const std::string& pass = t.info.at("pass");
    if (pass != "forward" && pass != "backward")
      throw InputError(what + ": info \"pass\" is \"" + pass + "\"; it must be forward or backward");
    run.pass = pass == "forward" ? Pass::Forward : Pass::Backward;
    const int seq = int(positive(t, "seq", kMaxExtent, what));
    run.shape = Shape{.batch = int(positive(t, "batch", kMaxExtent, what)),
                      .heads_q = int(positive(t, "heads", kMaxExtent, what)),
                      .heads_kv = int(positive(t, "heads_kv", kMaxExtent, what)),
                      .seq_q = seq,
                      .seq_k = t.info.count("seq_k") ? int(positive(t, "seq_k", kMaxExtent, what)) : seq,
                      .head_dim = int(positive(t, "head_dim", kMaxExtent, what))};
    run.causal = parse_causal(t.info.at("causal"));
    run.dtype = parse_dtype(t.info.at("dtype"));
    run.block_kernel = t.info.at("block_kernel");
    if (t.info.count("hop_bytes")) run.hop_bytes = positive(t, "hop_bytes", std::int64_t(1) << 50, what);
    if (t.info.count("partials_bytes")) run.partials_bytes = positive(t, "partials_bytes", std::int64_t(1) << 50, what);
    Problem p;
    p.shape = run.shape;
    p.options.causal = run.causal;
    validate(p);
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (msg.rfind(what, 0) == 0) throw;
    throw InputError(what + ": " + msg);  // the library's sentence, prefixed with the file
  }
  return run;
}

// The transfers the schedule has a rank make at `step`, in the order the communication stream runs them.
std::vector<RingTransferKind> expected_transfers(const RingSchedule& ring, Pass pass, int step) {
  std::vector<RingTransferKind> kinds;
  if (ring.kv_travels_on(step)) kinds.push_back(RingTransferKind::KV);
  if (pass == Pass::Backward) kinds.push_back(RingTransferKind::Partials);
  return kinds;
}

std::string describe(const std::vector<RingTransferKind>& kinds) {
  if (kinds.empty()) return "none";
  std::string s;
  for (RingTransferKind k : kinds) s += (s.empty() ? "" : " then ") + std::string(to_string(k));
  return s;
}

}  // namespace

const char* to_string(RingTransferKind k) { return k == RingTransferKind::KV ? "K/V" : "dK/dV partials"; }

RingMeasurement measure_ring(const Timeline& t, const std::string& what) {
  RingMeasurement m;
  m.run = parse_run(t, what);
  const int P = m.run.ranks;
  try {
    m.schedule = ring_schedule(m.run.layout, P, m.run.shape.seq_q, m.run.shape.seq_k, m.run.causal);
  } catch (const InputError& e) {
    throw InputError(what + ": " + e.what());
  }
  const std::uint64_t t0 = t.start_ns();
  const auto sec = [t0](std::uint64_t ns) { return double(ns - t0) * 1e-9; };

  // Sort the spans into (rank, step) cells and check each one's place.
  struct Cell {
    Intervals compute_stream;
    std::uint64_t compute_ns = 0, merge_ns = 0;
    int computes = 0;
    std::vector<const TimelineSpan*> transfers;
  };
  std::vector<std::vector<Cell>> cells(P, std::vector<Cell>(P));  // [step][rank]
  std::vector<Intervals> busy(P);                                 // [rank]: its compute stream, all steps
  for (const TimelineSpan& s : t.spans) {
    const std::string name = to_string(s.event);
    const bool compute_stream = s.event == PipelineEvent::RingCompute || s.event == PipelineEvent::RingMerge;
    if (!compute_stream && s.event != PipelineEvent::RingSendRecv)
      throw InputError(what + ": a ring timeline holds ring_compute, ring_send_recv and ring_merge spans, not " + name);
    if (s.block >= std::uint32_t(P))
      throw InputError(what + ": a " + name + " span is on rank " + std::to_string(s.block) + ", but info \"ranks\" is " +
                       std::to_string(P) + " (ranks 0 to " + std::to_string(P - 1) + ")");
    if (s.step < 0 || s.step >= P)
      throw InputError(what + ": a " + name + " span of rank " + std::to_string(s.block) +
                       (s.step < 0 ? " has no step" : " has step " + std::to_string(s.step)) + "; a ring of " +
                       std::to_string(P) + " ranks has steps 0 to " + std::to_string(P - 1) + " (args.step)");
    const std::uint32_t lane = compute_stream ? 0 : 1;
    if (s.warpgroup != lane)
      throw InputError(what + ": a " + name + " span of rank " + std::to_string(s.block) + " is on stream " +
                       std::to_string(s.warpgroup) + "; compute and merge go on stream 0, send/recv on stream 1");
    Cell& c = cells[std::size_t(s.step)][s.block];
    if (compute_stream) {
      c.compute_stream.emplace_back(s.begin_ns, s.end_ns);
      busy[s.block].emplace_back(s.begin_ns, s.end_ns);
      if (s.event == PipelineEvent::RingCompute) c.compute_ns += s.end_ns - s.begin_ns, ++c.computes;
      else c.merge_ns += s.end_ns - s.begin_ns;
    } else {
      c.transfers.push_back(&s);
    }
  }
  for (Intervals& b : busy) b = merged(std::move(b));

  const RingCost work = ring_cost(m.schedule, m.run.shape, m.run.pass, RingMachine{});
  // What a hop carries is a fact of the schedule and the shape (ring.hpp's kv_share_bytes): K and V of the share
  // in the run's dtype, the dK/dV partials in fp32. The file's hop sizes, written for the largest share, must agree.
  const int kv_bytes = dtype_bytes(m.run.dtype), grad_bytes = RingMachine{}.grad_bytes_per_element;
  const auto share_bytes = [&](int tokens, RingTransferKind kind) {
    return 2 * kv_share_bytes(m.run.shape, tokens, kind == RingTransferKind::KV ? kv_bytes : grad_bytes);
  };
  int largest_share = 0;
  for (int origin = 0; origin < P; ++origin) largest_share = std::max(largest_share, m.schedule.kv_tokens(origin));
  for (const auto& [key, bytes, kind] : {std::tuple{"hop_bytes", m.run.hop_bytes, RingTransferKind::KV},
                                         std::tuple{"partials_bytes", m.run.partials_bytes, RingTransferKind::Partials}})
    if (bytes && *bytes != share_bytes(largest_share, kind))
      throw InputError(what + ": info \"" + key + "\" is " + std::to_string(*bytes) + ", but the " +
                       to_string(kind) + " of its largest share (" + std::to_string(largest_share) +
                       " tokens) are " + std::to_string(share_bytes(largest_share, kind)) +
                       " bytes for the shape and dtype its info names");
  double flops = 0, flop_seconds = 0;
  std::vector<double> bandwidths;
  double hidden_all = 0, transfer_all = 0;
  m.steps.resize(P);
  for (int s = 0; s < P; ++s) {
    MeasuredStep& step = m.steps[s];
    step.ranks.resize(P);
    const std::vector<RingTransferKind> kinds = expected_transfers(m.schedule, m.run.pass, s);
    double hidden = 0, transferring = 0;
    bool stepped = false;  // some rank's compute stream worked at this step
    for (int r = 0; r < P; ++r) {
      Cell& c = cells[s][r];
      // A rank whose pairs the mask skips entirely at a step may launch nothing there (and record nothing).
      if (c.computes == 0 && work.steps[s].flops[r] > 0)
        throw InputError(what + ": rank " + std::to_string(r) + " has no ring_compute span at step " + std::to_string(s) +
                         ", where its schedule has work; a ring timeline has one wherever a rank computes");
      if (c.transfers.size() != kinds.size())
        throw InputError(what + ": rank " + std::to_string(r) + " has " + std::to_string(c.transfers.size()) +
                         " ring_send_recv spans at step " + std::to_string(s) + ", but the " +
                         (m.run.pass == Pass::Forward ? "forward" : "backward") + " ring makes " +
                         std::to_string(kinds.size()) + " there (" + describe(kinds) + ")");
      MeasuredRankStep& rs = step.ranks[r];
      rs.compute_seconds = double(c.compute_ns) * 1e-9;
      rs.merge_seconds = double(c.merge_ns) * 1e-9;
      if (!c.compute_stream.empty()) {
        const Intervals stream = merged(c.compute_stream);
        rs.begin_seconds = sec(stream.front().first);
        rs.end_seconds = sec(stream.back().second);
        if (!stepped || rs.begin_seconds < step.begin_seconds) step.begin_seconds = rs.begin_seconds;
        stepped = true;
      }
      if (r == 0 || rs.compute_seconds > step.slowest_compute_seconds)
        step.slowest_rank = r, step.slowest_compute_seconds = rs.compute_seconds;
      if (work.steps[s].flops[r] > 0) flops += work.steps[s].flops[r], flop_seconds += rs.compute_seconds;

      // The communication stream runs its hops in order: the K/V hop, then (backward) the partials.
      std::sort(c.transfers.begin(), c.transfers.end(),
                [](const TimelineSpan* a, const TimelineSpan* b) { return a->begin_ns < b->begin_ns; });
      const int tokens = m.schedule.kv_tokens(m.schedule.steps[s][r].kv_origin);
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const TimelineSpan& span = *c.transfers[k];
        MeasuredTransfer x{.rank = r, .step = s, .kind = kinds[k], .begin_seconds = sec(span.begin_ns),
                           .end_seconds = sec(span.end_ns)};
        x.bytes = share_bytes(tokens, kinds[k]);
        x.hidden_seconds = double(overlap(busy[r], span.begin_ns, span.end_ns)) * 1e-9;
        hidden += x.hidden_seconds, transferring += x.seconds();
        if (P > 1 && x.seconds() > 0) bandwidths.push_back(x.bytes_per_second());
        rs.transfers.push_back(int(m.transfers.size()));
        m.transfers.push_back(x);
      }
    }
    if (!stepped)
      throw InputError(what + ": no rank has a compute or merge span at step " + std::to_string(s) +
                       ", so the step cannot be placed in time");
    if (!kinds.empty()) step.hidden_fraction = transferring > 0 ? hidden / transferring : 1.0;
    hidden_all += hidden, transfer_all += transferring;
  }
  // The steps tile the run: step 0 from its first stamp, each next one from the first start of its work (never
  // before the previous one's), the last to the run's last stamp.
  m.seconds = double(t.end_ns() - t0) * 1e-9;
  m.steps.front().begin_seconds = 0;
  for (int s = 1; s < P; ++s)
    m.steps[s].begin_seconds = std::max(m.steps[s].begin_seconds, m.steps[s - 1].begin_seconds);
  for (int s = 0; s < P; ++s) m.steps[s].end_seconds = s + 1 < P ? m.steps[s + 1].begin_seconds : m.seconds;
  if (!m.transfers.empty()) m.hidden_fraction = transfer_all > 0 ? hidden_all / transfer_all : 1.0;
  if (!bandwidths.empty()) {
    m.median_bytes_per_second = median(bandwidths);
    m.best_bytes_per_second = *std::max_element(bandwidths.begin(), bandwidths.end());
  }
  m.flops_per_second = flop_seconds > 0 ? flops / flop_seconds : 0.0;
  return m;
}

RingMachine model_machine(const RingRun& run, const RingMachine& base) {
  RingMachine machine = base;
  machine.kv_bytes_per_element = dtype_bytes(run.dtype);
  return machine;
}

RingMachine measured_machine(const RingMeasurement& m, const RingMachine& base) {
  RingMachine machine = model_machine(m.run, base);
  if (m.flops_per_second > 0) machine.flops_per_second = m.flops_per_second;
  if (m.median_bytes_per_second) machine.link_bytes_per_second = *m.median_bytes_per_second;
  return machine;
}

RingCost model_cost(const RingMeasurement& m, const RingMachine& machine) {
  return ring_cost(m.schedule, m.run.shape, m.run.pass, machine);
}

}  // namespace flashlab
