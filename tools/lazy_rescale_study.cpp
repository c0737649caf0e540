// How often cuda-fa3-ws's forward rescales O, with FlashAttention-4's lazy rule (O rescaled only when a row's max
// rises by more than 2^8, OnlineSoftmax::kMaxLag) and with the exact one (whenever it rises): core/lazy_rescale.hpp
// replayed on the scores the kernel would see, in its own blocks (Bc of cuda/tilings.hpp at N >= 2k: 192, 160 and 64
// keys at d = 64, 128, 256) and warps (16 rows). B = 1, H = 4, N = 4096, unmasked and causal. Inputs:
//   gaussian  Q, K standard normal, scores scaled by 1/sqrt(d): the max settles within a few blocks;
//   drift R   the same plus a drift that raises key j's score by R j / N (log2 units) in every row, so each row's max
//             keeps rising across the whole sequence (R = 16 and 64): the case the lag exists for.
//
//   lazy_rescale_study [--json FILE] [--seed N]
#include <Eigen/Dense>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/lazy_rescale.hpp"
#include "cuda/tilings.hpp"

using namespace flashlab;

namespace {

constexpr int kHeads = 4, kSeq = 4096, kRowsPerWarp = 16;
constexpr float kLazyLag = 8.0f;  // OnlineSoftmax::kMaxLag for 16-bit P
constexpr double kLog2e = 1.4426950408889634;

// One head's scores in log2 units: tau log2(e) Q K^T + R j / N, key j > row masked when causal (top-left).
std::vector<float> head_scores(int d, float drift, bool causal, std::mt19937_64& rng) {
  std::normal_distribution<float> normal;
  Eigen::MatrixXf q(kSeq, d), k(kSeq, d);
  for (int i = 0; i < kSeq; ++i)
    for (int c = 0; c < d; ++c) q(i, c) = normal(rng), k(i, c) = normal(rng);
  const Eigen::MatrixXf s = (q * k.transpose()) * float(kLog2e / std::sqrt(double(d)));
  std::vector<float> out(std::size_t(kSeq) * kSeq);
  for (int i = 0; i < kSeq; ++i)
    for (int j = 0; j < kSeq; ++j)
      out[std::size_t(i) * kSeq + j] = causal && j > i ? -INFINITY : s(i, j) + drift * float(j) / float(kSeq);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::uint64_t seed = 2026;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      char* end = nullptr;
      seed = std::strtoull(argv[++i], &end, 10);
      if (end == nullptr || *end != '\0') {
        std::fprintf(stderr, "lazy_rescale_study: --seed takes a non-negative integer, not '%s'\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--seed N]\n", argv[0]);
      return 2;
    }
  }
  std::mt19937_64 rng(seed);
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%4s %4s %8s %7s | %-22s | %-22s\n", "d", "Bc", "inputs", "causal", "lazy: rows / warps", "exact: rows / warps");
  for (int d : {64, 128, 256}) {
    for (const float drift : {0.0f, 16.0f, 64.0f}) {
      for (const bool causal : {false, true}) {
        const int bc = cuda::fa3_ws::forward_tiling(Shape{.seq_q = kSeq, .seq_k = kSeq, .head_dim = d}, causal, false).Bc;
        RescaleCounts lazy, exact;
        for (int h = 0; h < kHeads; ++h) {
          const std::vector<float> s = head_scores(d, drift, causal, rng);
          const RescaleCounts l = count_rescales(s, kSeq, kSeq, bc, kLazyLag, kRowsPerWarp);
          const RescaleCounts e = count_rescales(s, kSeq, kSeq, bc, 0.0f, kRowsPerWarp);
          for (auto [sum, one] : {std::pair{&lazy, &l}, std::pair{&exact, &e}}) {
            sum->row_blocks += one->row_blocks, sum->row_rescales += one->row_rescales;
            sum->warp_blocks += one->warp_blocks, sum->warp_rescales += one->warp_rescales;
          }
        }
        const std::string inputs = drift == 0.0f ? "gaussian" : "drift " + std::to_string(int(drift));
        std::printf("%4d %4d %8s %7s | %9.4f / %9.4f | %9.4f / %9.4f\n", d, bc, inputs.c_str(), causal ? "yes" : "no",
                    lazy.row_fraction(), lazy.warp_fraction(), exact.row_fraction(), exact.warp_fraction());
        rows.push_back({{"head_dim", d}, {"block_keys", bc}, {"inputs", inputs}, {"drift_log2", drift},
                        {"causal", causal}, {"lazy_row_fraction", lazy.row_fraction()},
                        {"lazy_warp_fraction", lazy.warp_fraction()}, {"exact_row_fraction", exact.row_fraction()},
                        {"exact_warp_fraction", exact.warp_fraction()}, {"row_blocks", lazy.row_blocks},
                        {"warp_blocks", lazy.warp_blocks}});
      }
    }
  }
  if (!json_path.empty()) {
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const nlohmann::json doc = {
        {"what", "the share of (row, K/V block) and (16-row warp, K/V block) pairs, from each row's second block on, "
                 "where cuda-fa3-ws's online softmax rescales O: lazy (lag 2^8) and exact (lag 0)"},
        {"device", "the CPU: core/lazy_rescale.hpp replaying the kernel's rule on its blocks"},
        {"command", "build/bin/lazy_rescale_study --json FILE --seed " + std::to_string(seed)},
        {"date", date},
        {"seed", seed},
        {"settings", {{"heads", kHeads}, {"seq", kSeq}, {"rows_per_warp", kRowsPerWarp}, {"lag_log2", kLazyLag}}},
        {"rows", rows}};
    std::ofstream file(json_path);
    file << doc.dump(1) << "\n";
    if (!file) {
      std::fprintf(stderr, "lazy_rescale_study: cannot write the JSON results to '%s'\n", json_path.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
