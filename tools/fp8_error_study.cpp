// How far FP8 attention lands from exact attention, beside bf16: the RMSE of O for the emulated e4m3 forward
// (cpu_reference/fp8.hpp), with and without the Hadamard rotation of Q and K, and for the bf16 forward (Q, K,
// V and P rounded to bf16, fp32 accumulation), each against attention in double on the UNQUANTIZED inputs, at
// d = 64, 128, 256 and N = 1024 (B = 1, H = 4). Inputs: standard normal; standard normal with a few outlier
// channels of Q and K (the same channels in both) 10x, 30x, 100x larger, as in real activations, as drawn (the
// scores then spread so wide that softmax is nearly one-hot) and divided by their root mean square (scores of a
// few units, as in trained models); and the FlashAttention-3 paper's outlier entries (N(0,1) + N(0,100) *
// Bernoulli(0.001) in Q, K and V). std(S) in the table is the spread of the scores tau Q K^T.
//
// --sweep instead sweeps the size of the outlier channels (4 channels of Q and K multiplied by 1, 2, 4, ..., 128,
// then Q and K divided by their root mean square) at d = 64, 128, 256: the RMSE of O as above, and the RMS error
// of the scores tau Q K^T that the e4m3 Q and K stand for (their dequantized values), with and without the
// rotation. Lesson 10's figure draws it (flashlab-viz, the "fp8" panel).
//
//   fp8_error_study [--json FILE] [--seed N] [--sweep]
#include <ctime>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cpu_reference/fp8.hpp"
#include "cpu_reference/naive.hpp"

using namespace flashlab;

namespace {

constexpr int kOutlierChannels = 4;

struct InputKind {
  std::string name;
  double channel_factor;  // > 1: outlier channels of Q and K
  bool unit_rms;          // then Q and K divided by their root mean square, which keeps the scores' spread moderate
  bool fa3_entries;       // the paper's sparse large entries
};

void divide_by_rms(HostTensor& t) {
  double sum2 = 0;
  for (double x : t.data) sum2 += x * x;
  const double rms = std::sqrt(sum2 / static_cast<double>(t.data.size()));
  for (double& x : t.data) x /= rms;
}

// Draws Q, K, V for one kind of input. The outlier channels are a fixed random set per (seed, d).
Qkv draw_inputs(const Shape& s, const InputKind& kind, std::uint64_t seed) {
  Qkv in = random_qkv(s, DType::F64, seed);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  if (kind.channel_factor > 1) {
    std::vector<int> channels;
    std::uniform_int_distribution<int> pick(0, s.head_dim - 1);
    while (static_cast<int>(channels.size()) < kOutlierChannels) {
      const int c = pick(rng);
      bool seen = false;
      for (int x : channels) seen = seen || x == c;
      if (!seen) channels.push_back(c);
    }
    for (HostTensor* t : {&in.q, &in.k})
      for (std::size_t base = 0; base < t->data.size(); base += static_cast<std::size_t>(s.head_dim))
        for (int c : channels) t->data[base + static_cast<std::size_t>(c)] *= kind.channel_factor;
    if (kind.unit_rms) {
      divide_by_rms(in.q);
      divide_by_rms(in.k);
    }
  }
  if (kind.fa3_entries) {
    std::bernoulli_distribution hit(0.001);
    std::normal_distribution<double> big(0.0, 10.0);
    for (HostTensor* t : {&in.q, &in.k, &in.v})
      for (double& x : t->data)
        if (hit(rng)) x += big(rng);
  }
  return in;
}

// The spread of the scores S = tau Q K^T of head 0 (its standard deviation over the first 64 rows): with
// large outliers softmax turns one-hot, which says what the RMSE of O measures.
double score_std(const Problem& p, const Qkv& in) {
  double sum = 0, sum2 = 0;
  long count = 0;
  for (int i = 0; i < 64 && i < p.shape.seq_q; ++i)
    for (int j = 0; j < p.shape.seq_k; ++j) {
      double dot = 0;
      for (int c = 0; c < p.shape.head_dim; ++c) dot += in.q.at(0, i, 0, c) * in.k.at(0, j, 0, c);
      dot *= p.softmax_scale();
      sum += dot, sum2 += dot * dot, ++count;
    }
  const double mean = sum / count;
  return std::sqrt(std::max(0.0, sum2 / count - mean * mean));
}

// The table of the header: each kind of input at d = 64, 128, 256. One row per (d, kind).
nlohmann::json input_kinds_study(std::uint64_t seed) {
  const std::vector<InputKind> kinds = {{"gaussian", 1, false, false},
                                        {"outlier channels 10x", 10, false, false},
                                        {"outlier channels 30x", 30, false, false},
                                        {"outlier channels 100x", 100, false, false},
                                        {"outlier ch. 10x, unit rms", 10, true, false},
                                        {"outlier ch. 30x, unit rms", 30, true, false},
                                        {"outlier ch. 100x, unit rms", 100, true, false},
                                        {"fa3 outlier entries", 1, false, true}};
  nlohmann::json rows = nlohmann::json::array();
  std::printf("RMSE of O against attention in double on the unquantized inputs (B = 1, H = 4, N = 1024, seed %llu)\n",
              static_cast<unsigned long long>(seed));
  std::printf("%-5s %-27s %9s %11s %11s %15s %9s\n", "d", "inputs", "std(S)", "bf16", "fp8", "fp8+rotation",
              "gain");
  for (const int d : {64, 128, 256}) {
    Problem p;
    p.shape = Shape{.batch = 1, .heads_q = 4, .heads_kv = 4, .seq_q = 1024, .seq_k = 1024, .head_dim = d};
    for (const InputKind& kind : kinds) {
      const Qkv in = draw_inputs(p.shape, kind, seed + static_cast<std::uint64_t>(d));
      const HostTensor ref = naive_forward<double>(p, in).o;
      const double bf16 = error_metrics(bf16_attention_emulated(p, in).out.o, ref).rmse;
      const double fp8 = error_metrics(fp8_attention_emulated(p, in).out.o, ref).rmse;
      const double fp8_rot =
          error_metrics(fp8_attention_emulated(p, in, LowpAttentionOptions{.rotate_qk = true, .rotation_seed = seed}).out.o,
                        ref)
              .rmse;
      const double spread = score_std(p, in);
      std::printf("%-5d %-27s %9.3g %11.3e %11.3e %15.3e %8.2fx\n", d, kind.name.c_str(), spread, bf16, fp8, fp8_rot,
                  fp8 / fp8_rot);
      std::fflush(stdout);
      rows.push_back({{"head_dim", d},
                      {"inputs", kind.name},
                      {"score_std", spread},
                      {"rmse_bf16", bf16},
                      {"rmse_fp8", fp8},
                      {"rmse_fp8_rotated", fp8_rot}});
    }
  }
  return rows;
}

// The RMS error of the scores tau Q K^T of head 0 (its first 64 rows) computed from `approx` (the dequantized,
// possibly rotated, operands) against `exact` (the inputs): the rotation is orthogonal, so both stand for the
// same scores, and the difference is what quantizing Q and K did to them.
double score_rmse(const Problem& p, const Qkv& exact, const Qkv& approx) {
  double sum2 = 0;
  long count = 0;
  for (int i = 0; i < 64 && i < p.shape.seq_q; ++i)
    for (int j = 0; j < p.shape.seq_k; ++j) {
      double a = 0, b = 0;
      for (int c = 0; c < p.shape.head_dim; ++c) {
        a += exact.q.at(0, i, 0, c) * exact.k.at(0, j, 0, c);
        b += approx.q.at(0, i, 0, c) * approx.k.at(0, j, 0, c);
      }
      const double e = p.softmax_scale() * (b - a);
      sum2 += e * e, ++count;
    }
  return std::sqrt(sum2 / count);
}

// The sweep over the outlier channels' size (see the header). One row per (d, factor).
nlohmann::json outlier_sweep(std::uint64_t seed) {
  nlohmann::json rows = nlohmann::json::array();
  std::printf("RMSE of O, and RMS error of the scores from e4m3 Q and K, against the outlier channels' size\n");
  std::printf("(4 channels of Q and K multiplied by the factor, then Q and K scaled to unit root mean square;\n"
              " B = 1, H = 4, N = 1024, seed %llu)\n",
              static_cast<unsigned long long>(seed));
  std::printf("%-5s %7s %8s %11s %11s %13s %13s %15s\n", "d", "factor", "std(S)", "O bf16", "O fp8", "O fp8+rot",
              "S err fp8", "S err fp8+rot");
  for (const int d : {64, 128, 256}) {
    Problem p;
    p.shape = Shape{.batch = 1, .heads_q = 4, .heads_kv = 4, .seq_q = 1024, .seq_k = 1024, .head_dim = d};
    for (const int factor : {1, 2, 4, 8, 16, 32, 64, 128}) {
      const InputKind kind{"outlier channels, unit rms", static_cast<double>(factor), true, false};
      const Qkv in = draw_inputs(p.shape, kind, seed + static_cast<std::uint64_t>(d));
      const HostTensor ref = naive_forward<double>(p, in).o;
      const double bf16 = error_metrics(bf16_attention_emulated(p, in).out.o, ref).rmse;
      const EmulatedForward fp8 = fp8_attention_emulated(p, in);
      const EmulatedForward fp8_rot =
          fp8_attention_emulated(p, in, LowpAttentionOptions{.rotate_qk = true, .rotation_seed = seed});
      const double o_fp8 = error_metrics(fp8.out.o, ref).rmse, o_rot = error_metrics(fp8_rot.out.o, ref).rmse;
      const double s_fp8 = score_rmse(p, in, fp8.dequantized), s_rot = score_rmse(p, in, fp8_rot.dequantized);
      const double spread = score_std(p, in);
      std::printf("%-5d %7d %8.3g %11.3e %11.3e %13.3e %13.3e %15.3e\n", d, factor, spread, bf16, o_fp8, o_rot, s_fp8,
                  s_rot);
      std::fflush(stdout);
      rows.push_back({{"head_dim", d},
                      {"outlier_factor", factor},
                      {"score_std", spread},
                      {"rmse_bf16", bf16},
                      {"rmse_fp8", o_fp8},
                      {"rmse_fp8_rotated", o_rot},
                      {"score_rmse_fp8", s_fp8},
                      {"score_rmse_fp8_rotated", s_rot}});
    }
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  std::uint64_t seed = 2024;
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sweep") {
      sweep = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (a == "--seed" && i + 1 < argc) {
      const char* text = argv[++i];
      char* end = nullptr;
      errno = 0;
      seed = std::strtoull(text, &end, 10);
      if (*text == '\0' || *text == '-' || *end != '\0' || errno != 0) {
        std::fprintf(stderr, "fp8_error_study: --seed takes a non-negative integer, not '%s'\n", text);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--seed N] [--sweep]\n", argv[0]);
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const nlohmann::json rows = sweep ? outlier_sweep(seed) : input_kinds_study(seed);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("(%.1f s)\n", seconds);
  if (!json_path.empty()) {
    std::string command = argv[0];
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    const char* what = sweep ? "RMSE of O vs double attention on unquantized inputs, and RMS error of the scores "
                               "from e4m3 Q and K, against the size of 4 outlier channels (Q and K at unit rms)"
                             : "RMSE of O vs double attention on unquantized inputs";
    const nlohmann::json doc = {{"what", what},
                                {"device", "the CPU: the FP8 and bf16 kernels emulated (cpu_reference/fp8.hpp)"},
                                {"command", command},
                                {"date", date},
                                {"batch", 1},
                                {"heads", 4},
                                {"seq", 1024},
                                {"seed", seed},
                                {"outlier_channels", kOutlierChannels},
                                {"rows", rows}};
    std::ofstream file(json_path);
    file << doc.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "fp8_error_study: cannot write the JSON results to '%s'\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
