// The GPU level of the traffic model against the DRAM counters Nsight Compute recorded on the GPU
// (bench/results/<gpu>-dram-counters.json, written by scripts/record_dram_counters.sh): for every recorded
// run, the model's kernels must be the kernels that ran (their count, grid and blocks per SM), and its DRAM
// bytes must be within kTolerance of the counters for cuda-fa2 (N >= 2k), cuda-naive and cuda-fa1. The
// other runs (cuda-fa3-ws, N = 1k) are printed beside them, not held to it. So are the model's known misses
// (kKnownMisses), marked as such: each must still miss, so that one the model comes to hold is taken off the
// list and held again. A second test case holds the L2's associativity to the transition files
// (<gpu>-dram-counters_l2-transition*.json). With no counters file for any GPU the suite exits 77, which
// CTest reports as skipped, naming the file that is missing. (The reader's own checks run in every build:
// tests/test_gpu_traffic.cpp.)
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "model/dram_counters.hpp"
#include "model/gpu.hpp"
#include "registry/gpu_models.hpp"

using namespace flashlab;

namespace {

constexpr double kTolerance = 0.20;  // the model's stated tolerance
constexpr double kGoal = 0.10;       // what it aims for
const std::string kResults = FLASHLAB_SOURCE_DIR "/bench/results";

// The counters files present: <gpu>-dram-counters.json for each described GPU (the app plots the same files).
std::vector<std::string> counters_files() {
  std::vector<std::string> files;
  for (const GpuSpec& gpu : gpu_specs())
    if (std::filesystem::exists(dram_counters_path(kResults, gpu))) files.push_back(dram_counters_path(kResults, gpu));
  return files;
}

// Runs of a variant the model is known to miss by more than kTolerance, and why (lesson 04, *What the counters
// say*). They are printed beside the others, marked, not held to it; each must still miss.
struct KnownMiss {
  std::string_view gpu, variant;
  int head_dim, seq;
  CausalAlign causal;
};
constexpr KnownMiss kKnownMisses[] = {
    // cuda-fa1 where the 16 heads' Q and O take 32 MiB, in the middle of the L2's transition: the reads are
    // within 20% (-19%), the writes are not (the model 278 MB, the counters 470; read + written -28%). The
    // transition files show these shapes vary by tens of percent from run to run (d = 64: 349-607 MB read).
    {"h100", "cuda-fa1", 64, 4096, CausalAlign::None},
    {"h100", "cuda-fa1", 128, 2048, CausalAlign::None},
};

bool known_miss(const GpuSpec& gpu, const RecordedRun& r) {
  for (const KnownMiss& m : kKnownMisses)
    if (m.gpu == gpu.id && m.variant == r.variant && m.head_dim == r.shape.head_dim && m.seq == r.shape.seq_q &&
        m.causal == r.causal)
      return true;
  return false;
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
          << "* held to " << kTolerance * 100 << "%, ! a known miss\n"
          << "variant      d  causal     N      read: counters   model  error | written: counters   model (+dirty)\n";
    int held = 0, within_goal = 0, misses = 0;
    for (const RecordedRun& r : c.runs) {
      CAPTURE(r.variant);
      CAPTURE(r.shape.head_dim);
      const std::string causal = to_string(r.causal);
      CAPTURE(causal);
      CAPTURE(r.shape.seq_q);
      Problem p;
      p.shape = r.shape;
      p.options.causal = r.causal;
      const GpuForwardPass pass = gpu_forward_pass(r.variant, p, *gpu);
      const GpuTraffic t = model_gpu_traffic(*gpu, p.shape, pass.kernels);
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
      const bool known = known_miss(*gpu, r);
      char line[240];
      std::snprintf(line, sizeof line, "%-11s %3d  %-9s %6d  %10s %9s %+6.1f%% | %10s %9s (+%s)%s\n", r.variant.c_str(),
                    r.shape.head_dim, to_string(r.causal), r.shape.seq_q, mb(measured_read).c_str(), mb(read).c_str(),
                    100 * read_error, mb(double(r.dram_write_bytes)).c_str(), mb(double(t.dram.total_written())).c_str(),
                    mb(double(t.dirty_at_end)).c_str(), !asserted(r) ? "" : known ? " !" : " *");
      table << line;
      if (!asserted(r)) continue;
      if (known) {  // not held, but it must still miss: one the model holds comes off kKnownMisses
        ++misses;
        CAPTURE(read_error);
        CAPTURE(total_error);
        CHECK_MESSAGE((std::abs(read_error) > kTolerance || std::abs(total_error) > kTolerance),
                      "a known miss is now within " << kTolerance * 100 << "%: take it off kKnownMisses");
        continue;
      }
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
          << "% (reads and read + written); " << misses << " known misses, not held";
    MESSAGE(table.str());
    CHECK(held > 0);
    int listed = 0;  // every known miss of this GPU was recorded: the list names runs, not guesses
    for (const KnownMiss& m : kKnownMisses) listed += m.gpu == gpu->id;
    CHECK(misses == listed);
  }
}

// cuda-fa1 where its Q and O cross the L2's size (bench/results/h100-dram-counters_l2-transition*.json, recorded
// with PLAN=l2-transition, each by one device command): N and H in small steps, Q and O from 16 to 64 MiB. The
// counters move smoothly from no re-reads to a re-read every pass, and in between they vary from run to run (the
// same shape twice in one call read 545 and 349 MB), so these files are not held run by run: they decide the
// L2's associativity, the one number the model takes from counters (model/gpu.cpp). Over all their runs, the
// GPU's ways must give the smallest mean |log(model / counters)| of the reads among an LRU and 8, 16 and 32 ways.
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

TEST_CASE("where cuda-fa1's Q and O cross the L2's size, the GPU's associativity follows the counters best") {
  const std::vector<std::string> files = transition_files();
  REQUIRE(files.size() >= 2);  // two calls at least: the spread between runs is part of the evidence
  const GpuSpec& h100 = find_gpu("h100");
  constexpr int kWays[] = {16, 0, 8, 32};  // the GPU's first
  REQUIRE(h100.l2_ways == kWays[0]);
  double log_error[std::size(kWays)] = {};
  int runs = 0;
  std::ostringstream table;
  table << "cuda-fa1 DRAM reads, MB per pass\n"
        << " B   H    d  causal     N   Q+O MiB  counters   16 ways     LRU   8 ways  32 ways\n";
  for (const std::string& path : files) {
    CAPTURE(path);
    const DramCounters c = read_dram_counters(path);
    REQUIRE(gpu_for_device(c.device) == &h100);
    table << path << " (" << c.date << ")\n";
    for (const RecordedRun& r : c.runs) {
      REQUIRE(r.variant == "cuda-fa1");
      Problem p;
      p.shape = r.shape;
      p.options.causal = r.causal;
      double model[std::size(kWays)];
      for (std::size_t n = 0; n < std::size(kWays); ++n) {
        GpuSpec gpu = h100;
        gpu.l2_ways = kWays[n];
        const GpuTraffic t = model_gpu_traffic(gpu, p.shape, gpu_forward_pass(r.variant, p, gpu).kernels);
        model[n] = double(t.dram.total_read());
        log_error[n] += std::abs(std::log(model[n] / double(r.dram_read_bytes)));
      }
      ++runs;
      const double q_and_o = 2.0 * r.shape.batch * r.shape.heads_q * r.shape.seq_q * r.shape.head_dim * 4;
      char line[200];
      std::snprintf(line, sizeof line, "%2d %3d %4d  %-8s %6d %8.1f %9s %9s %9s %8s %8s\n", r.shape.batch,
                    r.shape.heads_q, r.shape.head_dim, to_string(r.causal), r.shape.seq_q, q_and_o / (1 << 20),
                    mb(double(r.dram_read_bytes)).c_str(), mb(model[0]).c_str(), mb(model[1]).c_str(),
                    mb(model[2]).c_str(), mb(model[3]).c_str());
      table << line;
    }
  }
  table << "mean |log(model / counters)| over " << runs << " runs:";
  for (std::size_t n = 0; n < std::size(kWays); ++n)
    table << " " << (kWays[n] ? std::to_string(kWays[n]) + " ways" : std::string("LRU")) << " "
          << log_error[n] / runs;
  MESSAGE(table.str());
  for (std::size_t n = 1; n < std::size(kWays); ++n) {
    CAPTURE(kWays[n]);
    CHECK(log_error[0] < log_error[n]);
  }
}

int main(int argc, char** argv) {
  if (counters_files().empty()) {
    std::printf("SKIPPED: no DRAM counters recorded: %s is missing; record it on the GPU with "
                "`bash scripts/record_dram_counters.sh` and copy the JSON into bench/results/\n",
                dram_counters_path(kResults, find_gpu("h100")).c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
