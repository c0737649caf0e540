#pragma once
// The FP8 panel's data: how far emulated FP8 attention lands from exact attention as outlier channels of Q and K
// grow, without and with the Hadamard rotation (tools/fp8_error_study.cpp --sweep writes it to
// bench/results/cpu-fp8-outlier-sweep_<date>.json). Lesson 10's figure is this panel.
#include <string>
#include <vector>

namespace flashlab::viz {

struct Fp8SweepRow {
  int head_dim = 0;
  double outlier_factor = 0;  // the 4 outlier channels' size, before Q and K are scaled to unit rms
  double score_std = 0;       // the spread of the scores tau Q K^T
  double rmse_bf16 = 0, rmse_fp8 = 0, rmse_fp8_rotated = 0;  // RMSE of O against attention in double
  double score_rmse_fp8 = 0, score_rmse_fp8_rotated = 0;     // RMS error of tau Q K^T from the e4m3 Q and K
};

struct Fp8Sweep {
  std::string file;  // bench/results/... as read
  std::string device, date, command;
  std::vector<Fp8SweepRow> rows;
  std::string error;  // one sentence when no file was found or it could not be read
};

// The file name's pattern in bench/results: the newest by name (the date sorts) is read.
inline constexpr const char* kFp8SweepPrefix = "cpu-fp8-outlier-sweep_";

// Parses one sweep file's text; `file` names it in `error` and in `file`.
Fp8Sweep parse_fp8_sweep(const std::string& text, const std::string& file);
// Reads the newest cpu-fp8-outlier-sweep_*.json of `results_dir`; error says why when there is none.
Fp8Sweep read_fp8_sweep(const std::string& results_dir);
// The head dims the sweep holds, ascending.
std::vector<int> fp8_sweep_head_dims(const Fp8Sweep&);
// The head dim to show for a scenario's head dim: itself when the sweep holds it, else the nearest one; 0 when
// the sweep has no rows.
int fp8_sweep_head_dim_for(const Fp8Sweep&, int wanted);

}  // namespace flashlab::viz
