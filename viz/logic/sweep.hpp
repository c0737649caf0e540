#pragma once
// Sweeps against sequence length for the Plots panel: HBM traffic and memory footprint from the
// count-only loop nest (N up to 128k in well under a second), and live CPU timings of the library's
// tiled_forward. Both run on a worker thread (Job) so the window stays interactive.
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scenario.hpp"

namespace flashlab::viz {

// HBM bytes, footprint and SRAM peak of one run of a loop nest, from its events.
class FootprintCounter : public TrafficObserver {
 public:
  FootprintCounter(int Tr, int Tc);
  void on_event(const TileEvent&) override;
  const TrafficTotals& totals() const { return counter_.totals(); }
  std::int64_t footprint_bytes() const { return footprint_; }    // every distinct HBM tile touched
  std::int64_t compulsory_bytes() const { return compulsory_; }  // each distinct tile read once, written once

 private:
  int Tr_, Tc_;
  TrafficCounter counter_;
  // Per tensor, allocated on its first event: per tile, bit 0 touched, bit 1 read, bit 2 written.
  std::vector<std::vector<std::uint8_t>> seen_;
  std::int64_t footprint_ = 0, compulsory_ = 0;
};

struct SweepPoint {
  int n = 0;
  double hbm_bytes = 0;         // the paper's two-level count: every tile transfer
  double compulsory_bytes = 0;  // what DRAM sees when the L2 absorbs every re-read
  double footprint_bytes = 0;   // HBM the run needs: Q, K, V, O, stats (and S, P for standard)
  double peak_sram_bytes = 0;
  double flops = 0;             // core/flops.hpp
  std::int64_t events = 0;
};
struct Series {
  std::string name;
  std::vector<double> x, y;
};

// The longest sequence the app's sweeps walk: the count-only loop nest at N = 128k takes well under a second, and
// its work grows as N^2.
constexpr int kSweepMaxLength = 131072;

// Powers of two from lo to hi.
std::vector<int> sweep_lengths(int lo = 256, int hi = kSweepMaxLength);
class Job;
// What a long walk throws when its job is asked to stop (Job::start's worker takes it as a clean stop).
struct JobStopped {};

// One count-only run at sequence length n (seq_q = seq_k = n) with the scenario's other settings. With a job, the
// walk stops (JobStopped) soon after the job is asked to: at N = 128k it has tens of millions of events.
SweepPoint count_point(const Scenario&, Algorithm, int n, const Job* job = nullptr);

// A background job with progress. The function runs on a worker thread; it reports progress and
// checks stop_requested() between units of work. Results go wherever the function puts them (guard
// them with `mutex`).
class Job {
 public:
  Job() = default;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() { cancel(); }
  void start(std::function<void(Job&)> work);
  void cancel();  // asks the worker to stop and waits for it
  bool running() const { return running_; }
  float progress() const { return total_ > 0 ? float(done_) / float(total_) : 0.f; }
  void set_progress(int done, int total) {
    done_ = done;
    total_ = total;
  }
  // What the work is computing now, in a few words ("cuda-fa2 on the h100 at N = 32k"), for progress bars
  // and the headless screenshot's note on stderr.
  void set_activity(std::string what) {
    std::lock_guard lock(mutex);
    activity_ = std::move(what);
  }
  std::string activity() {
    std::lock_guard lock(mutex);
    return activity_;
  }
  bool stop_requested() const { return stop_; }
  std::mutex mutex;
  std::string error;  // set by the work when it fails (guarded by mutex)

 private:
  std::thread thread_;
  std::atomic<bool> running_{false}, stop_{false};
  std::atomic<int> done_{0}, total_{0};
  std::string activity_;  // guarded by mutex
};

struct TrafficSweep {
  std::vector<Algorithm> algorithms;
  std::vector<std::vector<SweepPoint>> points;  // [algorithm][n]
};
// Fills `out` (under job.mutex) point by point: every algorithm at every n of sweep_lengths().
void run_traffic_sweep(Job&, const Scenario&, TrafficSweep& out, int max_n = kSweepMaxLength);

struct CpuTiming {
  std::vector<Series> series;  // one per algorithm: x = N, y = seconds (median of 3)
};
// Times the library's CPU forward (naive_forward for standard, tiled_forward otherwise; float) from
// N = 128 up, stopping at max_n or when one run takes longer than budget_s.
void run_cpu_timing(Job&, const Scenario&, CpuTiming& out, int max_n = 4096, double budget_s = 1.5);

}  // namespace flashlab::viz
