// The GPU level of the traffic model against the DRAM counters Nsight Compute recorded on the GPU
// (bench/results/<gpu>-dram-counters.json, written by scripts/record_dram_counters.sh): for every recorded
// run, the model's kernels must be the kernels that ran (their count, grid and blocks per SM), and its DRAM
// bytes (read, and read + written) must be within kTolerance of the counters for cuda-fa2 (N >= 2k),
// cuda-naive and cuda-fa1. The other runs (cuda-fa3-ws, N = 1k) are printed beside them up to N = 16k, not
// held to it.
// A second test case holds the two numbers the model takes from counters, the L2's ways and the age of a
// written line, to the transition files (<gpu>-dram-counters_l2-transition*.json): those files choose them,
// and the first case checks them against runs they did not choose from. With no counters file for any GPU
// the suite exits 77, which CTest reports as skipped, naming the file that is missing. (The reader's own
// checks run in every build: tests/test_gpu_traffic.cpp.)
//
// `--quick` (the sanitizer build's CTest registration passes it, where a replay runs several times slower)
// holds the runs up to N = 8k, every variant among them, and the GPU's L2 against 16 ways and an LRU only; the
// Release build runs everything.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "model/dram_counters.hpp"
#include "model/gpu.hpp"
#include "registry/gpu_models.hpp"

using namespace flashlab;

namespace {

constexpr double kTolerance = 0.20;  // the model's stated tolerance
constexpr double kGoal = 0.10;       // what it aims for
const std::string kResults = FLASHLAB_SOURCE_DIR "/bench/results";
bool quick = false;                        // --quick: see the top of the file
constexpr int kQuickLongestSequence = 8192;  // the longest N --quick replays
constexpr int kLongestSequence = 1 << 30;    // otherwise every run held to the tolerance
constexpr int kLongestPrinted = 16384;       // and the others, which are only printed, up to this N

// The counters files present: <gpu>-dram-counters.json for each described GPU (the app plots the same files).
std::vector<std::string> counters_files() {
  std::vector<std::string> files;
  for (const GpuSpec& gpu : gpu_specs())
    if (std::filesystem::exists(dram_counters_path(kResults, gpu))) files.push_back(dram_counters_path(kResults, gpu));
  return files;
}

// Whether a run is held to the tolerance (the rest are printed only).
bool asserted(const RecordedRun& r) {
  if (r.variant == "cuda-fa2") return r.shape.seq_q >= 2048;
  return r.variant == "cuda-naive" || r.variant == "cuda-fa1";
}

// h100-dram-counters.json, h100-dram-counters_<note>.json: the file holds that GPU's counters.
bool named_for(const std::string& path, const GpuSpec& gpu) {
  const std::string name = std::filesystem::path(path).filename().string();
  const std::string stem = std::string(gpu.id) + "-dram-counters";
  return name == stem + ".json" || (name.rfind(stem + "_", 0) == 0 && name.ends_with(".json"));
}

// replay(k) for k in 0 .. n - 1 on every core, the costliest first (cost(k): a guess at the replay's time), so the
// cores finish together; the results by k. An exception a replay throws comes back in errors[k].
template <typename Result, typename Replay, typename Cost>
std::vector<Result> replay_on_all_cores(std::size_t n, Replay replay, Cost cost, std::vector<std::exception_ptr>& errors) {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost(a) > cost(b); });
  std::vector<Result> results(n);
  errors.assign(n, nullptr);
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        results[order[i]] = replay(order[i]);
      } catch (...) {
        errors[order[i]] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads(std::max(1u, std::thread::hardware_concurrency()));
  for (std::thread& t : threads) t = std::thread(worker);
  for (std::thread& t : threads) t.join();
  return results;
}

// The work of a run's replay grows with the attention matrix it sweeps.
double replay_cost(const RecordedRun& r) {
  return double(r.shape.batch) * r.shape.heads_q * double(r.shape.seq_q) * double(r.shape.seq_k);
}

double error(double model, double measured) { return measured > 0 ? model / measured - 1 : (model > 0 ? 1e9 : 0); }

std::string mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / 1e6);
  return buf;
}

}  // namespace

TEST_CASE("the GPU level predicts the DRAM bytes Nsight Compute recorded") {
  const std::vector<std::string> files = counters_files();
  REQUIRE(!files.empty());
  for (const std::string& path : files) {
    CAPTURE(path);
    const DramCounters c = read_dram_counters(path);
    const GpuSpec* gpu = gpu_for_device(c.device);
    if (!gpu)
      FAIL("the counters in " << path << " were recorded on " << c.device
                              << ", which model/gpu.cpp does not describe: the model cannot be compared with them");
    REQUIRE(named_for(path, *gpu));  // h100-... holds an H100's counters
    REQUIRE(!c.runs.empty());
    std::ostringstream table;
    table << "model against " << path << " (" << c.device << ", " << c.date << "), MB per pass; "
          << "* held to " << kTolerance * 100 << "%\n"
          << "variant      d  causal     N      read: counters   model  error | written: counters   model (+dirty)\n";
    int held = 0, within_goal = 0;
    // The replays first, on every core; then each run's checks, in the file's order.
    auto replayed = [](const RecordedRun& r) {
      return r.shape.seq_q <= (quick ? kQuickLongestSequence : asserted(r) ? kLongestSequence : kLongestPrinted);
    };
    std::vector<std::exception_ptr> errors;
    const auto replays = replay_on_all_cores<std::pair<GpuForwardPass, GpuTraffic>>(
        c.runs.size(),
        [&](std::size_t k) {
          if (!replayed(c.runs[k])) return std::pair<GpuForwardPass, GpuTraffic>{};
          Problem p;
          p.shape = c.runs[k].shape;
          p.options.causal = c.runs[k].causal;
          // The kernel that ran: a one-kernel record with its block size replays that block (cuda-fa3-ws's d = 64
          // records predate its three consumer warpgroups), whatever the variant takes for the problem today.
          const RecordedRun& r = c.runs[k];
          GpuForwardPass pass = r.kernels.size() == 1 && r.kernels[0].block_size > 0
                                    ? gpu_forward_pass_as_run(r.variant, p, *gpu, r.kernels[0].block_size)
                                    : gpu_forward_pass(r.variant, p, *gpu);
          GpuTraffic t = model_gpu_traffic(*gpu, p.shape, pass.kernels);
          return std::pair{std::move(pass), std::move(t)};
        },
        [&](std::size_t k) { return replay_cost(c.runs[k]); }, errors);
    for (std::size_t k = 0; k < c.runs.size(); ++k) {
      const RecordedRun& r = c.runs[k];
      if (!replayed(r)) continue;
      CAPTURE(r.variant);
      CAPTURE(r.shape.head_dim);
      const std::string causal = to_string(r.causal);
      CAPTURE(causal);
      CAPTURE(r.shape.seq_q);
      if (errors[k]) std::rethrow_exception(errors[k]);
      const auto& [pass, t] = replays[k];
      // The kernels that ran are the kernels the model replays.
      REQUIRE(r.kernels.size() == pass.kernels.size());
      for (std::size_t k = 0; k < r.kernels.size(); ++k) {
        CAPTURE(r.kernels[k].name);
        CHECK(r.kernels[k].grid_size == pass.kernels[k].grid_blocks);
        if (r.kernels[k].blocks_per_sm > 0) CHECK(r.kernels[k].blocks_per_sm == pass.kernels[k].blocks_per_sm);
      }
      const double read = double(t.dram.total_read()), measured_read = double(r.dram_read_bytes);
      const double total = read + double(t.dram.total_written());
      const double measured_total = measured_read + double(r.dram_write_bytes);
      const double read_error = error(read, measured_read), total_error = error(total, measured_total);
      // A record whose kernel is not the one the variant runs for the problem today says so, with both blocks.
      Problem today;
      today.shape = r.shape;
      today.options.causal = r.causal;
      const Tiling shipped = gpu_forward_pass(r.variant, today, *gpu).tiling;
      const std::string ran_other =
          shipped.Br == pass.tiling.Br && shipped.Bc == pass.tiling.Bc
              ? ""
              : " (ran " + std::to_string(pass.tiling.Br) + " x " + std::to_string(pass.tiling.Bc) + ", today " +
                    std::to_string(shipped.Br) + " x " + std::to_string(shipped.Bc) + ")";
      char line[240];
      std::snprintf(line, sizeof line, "%-11s %3d  %-9s %6d  %10s %9s %+6.1f%% | %10s %9s (+%s)%s%s\n", r.variant.c_str(),
                    r.shape.head_dim, to_string(r.causal), r.shape.seq_q, mb(measured_read).c_str(), mb(read).c_str(),
                    100 * read_error, mb(double(r.dram_write_bytes)).c_str(), mb(double(t.dram.total_written())).c_str(),
                    mb(double(t.dirty_at_end)).c_str(), asserted(r) ? " *" : "", ran_other.c_str());
      table << line;
      if (!asserted(r)) continue;
      ++held;
      within_goal += std::abs(read_error) <= kGoal && std::abs(total_error) <= kGoal;
      CAPTURE(read);
      CAPTURE(measured_read);
      CHECK(std::abs(read_error) <= kTolerance);
      CAPTURE(total);
      CAPTURE(measured_total);
      CHECK(std::abs(total_error) <= kTolerance);
    }
    table << held << " runs held to " << kTolerance * 100 << "%, " << within_goal << " of them within " << kGoal * 100
          << "% (reads and read + written)";
    MESSAGE(table.str());
    CHECK(held > 0);
  }
}

// cuda-fa1 where its Q and O cross the L2's size (bench/results/h100-dram-counters_l2-transition*.json, recorded
// with PLAN=l2-transition, each by one device command): N and H in small steps, Q and O from 16 to 64 MiB. The
// counters move smoothly from no re-reads to a re-read every pass, and in between they vary from run to run (the
// same shape twice in one call read 545 and 349 MB), so these files are not held run by run: they choose the two
// numbers the model takes from counters (model/gpu.cpp), the L2's ways and how old a written line starts. Over
// all their runs, the GPU's pair must give the smallest error among its neighbours (4 ways fewer or more, a
// written line 1/40 of a partition younger or older), the 16 ways of the earlier fit (which aged nothing) and an
// LRU. The error is the mean |log(model / counters)| of the reads, plus that of the writes over the runs that
// wrote 20 MB or more (below that, what a kernel writes back inside its window is a few stray lines).
std::vector<std::string> transition_files() {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(kResults)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("h100-dram-counters_l2-transition", 0) == 0 && name.ends_with(".json"))
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST_CASE("where cuda-fa1's Q and O cross the L2's size, the GPU's ways and write age follow the counters best") {
  const std::vector<std::string> files = transition_files();
  REQUIRE(files.size() >= 2);  // two calls at least: the spread between runs is part of the evidence
  const GpuSpec& h100 = find_gpu("h100");
  struct L2 {
    int ways;
    double store_age;
  };
  const L2 own{h100.l2_ways, h100.l2_store_age};
  std::vector<L2> l2s = {own,
                         {own.ways - 4, own.store_age},
                         {own.ways + 4, own.store_age},
                         {own.ways, own.store_age - 0.025},
                         {own.ways, own.store_age + 0.025},
                         {16, 0},
                         {0, 0}};
  if (quick) l2s.erase(l2s.begin() + 1, l2s.end() - 2);  // the GPU's L2, 16 ways and an LRU
  REQUIRE(own.ways > 4);
  REQUIRE(own.store_age > 0.025);
  std::vector<RecordedRun> runs;
  std::ostringstream table;
  for (const std::string& path : files) {
    CAPTURE(path);
    const DramCounters c = read_dram_counters(path);
    REQUIRE(gpu_for_device(c.device) == &h100);
    for (const RecordedRun& r : c.runs) {
      REQUIRE(r.variant == "cuda-fa1");
      runs.push_back(r);
    }
  }
  // Each L2 over every run: read and written bytes. The model is deterministic, so a shape recorded more than
  // once (the repeat file records the same plan again) is replayed once, and each shape is walked once for all the
  // L2s (model_gpu_traffic over several GPUs).
  constexpr std::int64_t kWrittenEnough = 20'000'000;
  auto shape_of = [](const RecordedRun& r) {
    const Shape& s = r.shape;
    return std::tuple{r.variant, s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim, r.causal};
  };
  std::vector<std::size_t> replayed;      // the first run of each shape
  std::vector<std::size_t> shape_of_run;  // run k -> its shape's place in `replayed`
  for (std::size_t k = 0; k < runs.size(); ++k) {
    std::size_t u = 0;
    while (u < replayed.size() && shape_of(runs[replayed[u]]) != shape_of(runs[k])) ++u;
    if (u == replayed.size()) replayed.push_back(k);
    shape_of_run.push_back(u);
  }
  std::vector<GpuSpec> gpus;  // the GPU with each L2
  for (const L2& l2 : l2s) {
    GpuSpec gpu = h100;
    gpu.l2_ways = l2.ways;
    gpu.l2_store_age = l2.store_age;
    gpus.push_back(gpu);
  }
  std::vector<std::exception_ptr> errors;
  const auto bytes = replay_on_all_cores<std::vector<std::pair<double, double>>>(  // by shape, then L2
      replayed.size(),
      [&](std::size_t u) {
        const RecordedRun& r = runs[replayed[u]];
        Problem p;
        p.shape = r.shape;
        p.options.causal = r.causal;
        std::vector<std::pair<double, double>> by_l2;
        for (const GpuTraffic& t : model_gpu_traffic(gpus, p.shape, gpu_forward_pass(r.variant, p, h100).kernels))
          by_l2.emplace_back(double(t.dram.total_read()), double(t.dram.total_written()));
        return by_l2;
      },
      [&](std::size_t u) { return replay_cost(runs[replayed[u]]); }, errors);
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  std::vector<std::vector<std::pair<double, double>>> model(l2s.size());
  for (std::size_t n = 0; n < l2s.size(); ++n)
    for (std::size_t k = 0; k < runs.size(); ++k) model[n].push_back(bytes[shape_of_run[k]][n]);
  std::vector<double> error(l2s.size());
  for (std::size_t n = 0; n < l2s.size(); ++n) {
    double read = 0, written = 0;
    int writing = 0;
    for (std::size_t k = 0; k < runs.size(); ++k) {
      read += std::abs(std::log(model[n][k].first / double(runs[k].dram_read_bytes)));
      if (runs[k].dram_write_bytes < kWrittenEnough) continue;
      // (an LRU writes nothing back in some of them: a byte, not zero, keeps its error finite)
      written += std::abs(std::log(std::max(1.0, model[n][k].second) / double(runs[k].dram_write_bytes)));
      ++writing;
    }
    REQUIRE(writing > 0);
    error[n] = read / double(runs.size()) + written / writing;
  }
  table << "cuda-fa1, MB per pass; the model as the GPU is described (" << own.ways << " ways, a written line "
        << own.store_age << " of a partition old), beside 16 ways aging nothing and an LRU\n"
        << " B   H    d  causal     N   Q+O MiB   read: counters     model  16 ways      LRU | written: counters"
           "     model\n";
  const std::size_t sixteen = l2s.size() - 2, lru = l2s.size() - 1;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const RecordedRun& r = runs[k];
    const double q_and_o = 2.0 * r.shape.batch * r.shape.heads_q * r.shape.seq_q * r.shape.head_dim * 4;
    char line[240];
    std::snprintf(line, sizeof line, "%2d %3d %4d  %-8s %6d %8.1f %16s %9s %8s %8s | %17s %9s\n", r.shape.batch,
                  r.shape.heads_q, r.shape.head_dim, to_string(r.causal), r.shape.seq_q, q_and_o / (1 << 20),
                  mb(double(r.dram_read_bytes)).c_str(), mb(model[0][k].first).c_str(),
                  mb(model[sixteen][k].first).c_str(), mb(model[lru][k].first).c_str(),
                  mb(double(r.dram_write_bytes)).c_str(), mb(model[0][k].second).c_str());
    table << line;
  }
  table << "error (mean |log(model / counters)|, reads + writes) over " << runs.size() << " runs:";
  for (std::size_t n = 0; n < l2s.size(); ++n)
    table << "\n  " << (l2s[n].ways ? std::to_string(l2s[n].ways) + " ways" : std::string("LRU")) << ", age "
          << l2s[n].store_age << ": " << error[n];
  MESSAGE(table.str());
  for (std::size_t n = 1; n < l2s.size(); ++n) {
    CAPTURE(l2s[n].ways);
    CAPTURE(l2s[n].store_age);
    CHECK(error[0] < error[n]);
  }
}

int main(int argc, char** argv) {
  // Every replay allocates and frees tables of megabytes on each core. By default glibc hands such memory back to
  // the kernel at once and faults it in again for the next replay, which with two threads also costs TLB
  // shootdowns: on two cores that was a sixth of the second test case's time. Kept in the process, it is reused.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  if (counters_files().empty()) {
    std::printf("SKIPPED: no DRAM counters recorded: %s is missing; record it on the GPU with "
                "`bash scripts/record_dram_counters.sh` and copy the JSON into bench/results/\n",
                dram_counters_path(kResults, find_gpu("h100")).c_str());
    return 77;
  }
  std::vector<char*> args;  // doctest's own options, without --quick
  for (int n = 0; n < argc; ++n) {
    if (std::string_view(argv[n]) == "--quick") quick = true;
    else args.push_back(argv[n]);
  }
  doctest::Context context(int(args.size()), args.data());
  return context.run();
}
