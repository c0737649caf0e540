#include "sweep.hpp"

#include <algorithm>
#include <chrono>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/flops.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/naive.hpp"
#include "format.hpp"
#include "replay.hpp"

namespace flashlab::viz {

namespace {
constexpr int kWorkerNice = 10;  // a worker's priority below the window's (Linux's nice: 0 normal, 19 lowest)
constexpr int kTensorCount = static_cast<int>(TensorId::Count);
constexpr std::uint8_t kTouched = 1, kRead = 2, kWritten = 4;
int ceil_div(int a, int b) { return (a + b - 1) / b; }
}  // namespace

FootprintCounter::FootprintCounter(int Tr, int Tc) : Tr_(Tr), Tc_(Tc), seen_(kTensorCount) {}

void FootprintCounter::on_event(const TileEvent& e) {
  counter_.on_event(e);
  if (e.direction != Direction::Load && e.direction != Direction::Store) return;
  const Axis axis = axis_of(e.tensor);
  std::vector<std::uint8_t>& seen = seen_[static_cast<int>(e.tensor)];
  if (seen.empty())
    seen.assign(axis == Axis::Score ? std::size_t(Tr_) * Tc_ : std::size_t(std::max(Tr_, Tc_)), 0);
  std::size_t tile = 0;
  switch (axis) {
    case Axis::Query: tile = std::size_t(e.tile_row); break;
    case Axis::Key: tile = std::size_t(e.tile_col); break;
    case Axis::Score: tile = std::size_t(e.tile_row) * Tc_ + e.tile_col; break;
  }
  if (tile >= seen.size()) return;  // a tile outside the grid: counted in totals, not in the footprint
  std::uint8_t& s = seen[tile];
  if (!(s & kTouched)) footprint_ += e.bytes;
  const std::uint8_t bit = e.direction == Direction::Load ? kRead : kWritten;
  if (!(s & bit)) compulsory_ += e.bytes;
  s |= kTouched | bit;
}

std::vector<int> sweep_lengths(int lo, int hi) {
  std::vector<int> n;
  for (int v = lo; v <= hi; v *= 2) n.push_back(v);
  return n;
}

namespace {
// Passes the events on, and stops the walk once its job is asked to stop (looking every 64k events).
class StoppableObserver : public TrafficObserver {
 public:
  StoppableObserver(TrafficObserver& inner, const Job* job) : inner_(inner), job_(job) {}
  void on_event(const TileEvent& e) override {
    if (job_ && (++events_ & 0xffff) == 0 && job_->stop_requested()) throw JobStopped{};
    inner_.on_event(e);
  }

 private:
  TrafficObserver& inner_;
  const Job* job_;
  std::int64_t events_ = 0;
};
}  // namespace

SweepPoint count_point(const Scenario& base, Algorithm algorithm, int n, const Job* job) {
  Scenario s = base;
  s.seq_q = s.seq_k = n;
  const Problem p = to_problem(s);
  const Tiling t = resolve_tiling(s);
  FootprintCounter fc(ceil_div(n, t.Br), ceil_div(n, t.Bc));
  StoppableObserver walk(fc, job);
  count_traffic(algorithm, s.pass, p, t, bytes_per_element(s), walk);
  SweepPoint pt;
  pt.n = n;
  pt.hbm_bytes = double(fc.totals().total());
  pt.compulsory_bytes = double(fc.compulsory_bytes());
  pt.footprint_bytes = double(fc.footprint_bytes());
  pt.peak_sram_bytes = double(fc.totals().peak_sram_bytes);
  pt.events = fc.totals().events;
  pt.flops = s.pass == Pass::Forward ? forward_flops(p.shape, p.options.causal) : backward_flops(p.shape, p.options.causal);
  return pt;
}

void Job::start(std::function<void(Job&)> work) {
  cancel();
  stop_ = false;
  done_ = 0;
  total_ = 0;
  {
    std::lock_guard lock(mutex);
    error.clear();
    activity_.clear();
  }
  running_ = true;
  thread_ = std::thread([this, work = std::move(work)] {
#ifdef __linux__
    // Below the window's thread: on a machine of few cores (and a software renderer) the frames come first,
    // the model takes what is left.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kWorkerNice);
#endif
    try {
      work(*this);
    } catch (const JobStopped&) {
      // asked to stop in the middle of a walk: nothing to report
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      error = e.what();
    }
    running_ = false;
  });
}

void Job::cancel() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  running_ = false;
}

void run_traffic_sweep(Job& job, const Scenario& s, TrafficSweep& out, int max_n) {
  const std::vector<Algorithm> algs = {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2};
  const std::vector<int> ns = sweep_lengths(256, max_n);
  {
    std::lock_guard lock(job.mutex);
    out.algorithms = algs;
    out.points.assign(algs.size(), {});
  }
  const int total = int(algs.size() * ns.size());
  int done = 0;
  // Short lengths first for every algorithm, so all three curves grow together.
  for (int n : ns) {
    for (std::size_t a = 0; a < algs.size(); ++a) {
      if (job.stop_requested()) return;
      job.set_activity("counting " + std::string(to_string(algs[a])) + "'s traffic at N = " + format_length(n));
      const SweepPoint pt = count_point(s, algs[a], n, &job);
      std::lock_guard lock(job.mutex);
      out.points[a].push_back(pt);
      job.set_progress(++done, total);
    }
  }
}

void run_cpu_timing(Job& job, const Scenario& base, CpuTiming& out, int max_n, double budget_s) {
  const std::vector<Algorithm> algs = {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2};
  const std::vector<int> ns = sweep_lengths(128, max_n);
  {
    std::lock_guard lock(job.mutex);
    out.series.assign(algs.size(), {});
    for (std::size_t a = 0; a < algs.size(); ++a) out.series[a].name = std::string("cpu ") + to_string(algs[a]);
  }
  std::vector<bool> over_budget(algs.size(), false);
  const int total = int(algs.size() * ns.size());
  int done = 0;
  constexpr int kRepeats = 3;  // median of three
  for (int n : ns) {
    for (std::size_t a = 0; a < algs.size(); ++a) {
      if (job.stop_requested()) return;
      job.set_progress(++done, total);
      if (over_budget[a]) continue;
      Scenario s = base;
      s.seq_q = s.seq_k = n;
      const Problem p = to_problem(s);
      const Tiling t = resolve_tiling(s);
      const Qkv x = random_qkv(p.shape, DType::F32, s.seed);
      std::vector<double> secs;
      for (int r = 0; r < kRepeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        if (algs[a] == Algorithm::Standard) naive_forward<float>(p, x);
        else tiled_forward<float>(algs[a], p, x, t);
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (secs.back() > budget_s) break;
      }
      std::sort(secs.begin(), secs.end());
      const double median = secs[secs.size() / 2];
      if (median > budget_s) over_budget[a] = true;
      std::lock_guard lock(job.mutex);
      out.series[a].x.push_back(n);
      out.series[a].y.push_back(median);
    }
  }
  job.set_progress(total, total);
}

}  // namespace flashlab::viz
