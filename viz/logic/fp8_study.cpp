#include "fp8_study.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace flashlab::viz {

Fp8Sweep parse_fp8_sweep(const std::string& text, const std::string& file) {
  using nlohmann::json;
  Fp8Sweep out;
  out.file = file;
  try {
    const json j = json::parse(text);
    const auto text_of = [&j](const char* key) {
      return j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : std::string();
    };
    out.device = text_of("device");
    out.date = text_of("date").substr(0, 10);
    out.command = text_of("command");
    if (!j.contains("rows") || !j.at("rows").is_array()) {
      out.error = file + " has no \"rows\" array: is it a file of fp8_error_study --sweep?";
      return out;
    }
    for (const json& r : j.at("rows")) {
      Fp8SweepRow row;
      row.head_dim = r.at("head_dim").get<int>();
      row.outlier_factor = r.at("outlier_factor").get<double>();
      row.score_std = r.at("score_std").get<double>();
      row.rmse_bf16 = r.at("rmse_bf16").get<double>();
      row.rmse_fp8 = r.at("rmse_fp8").get<double>();
      row.rmse_fp8_rotated = r.at("rmse_fp8_rotated").get<double>();
      row.score_rmse_fp8 = r.at("score_rmse_fp8").get<double>();
      row.score_rmse_fp8_rotated = r.at("score_rmse_fp8_rotated").get<double>();
      out.rows.push_back(row);
    }
  } catch (const json::exception& e) {
    out.rows.clear();
    out.error = file + " cannot be read as an FP8 outlier sweep (" + e.what() + ")";
    return out;
  }
  std::sort(out.rows.begin(), out.rows.end(), [](const Fp8SweepRow& a, const Fp8SweepRow& b) {
    return a.head_dim != b.head_dim ? a.head_dim < b.head_dim : a.outlier_factor < b.outlier_factor;
  });
  if (out.rows.empty()) out.error = file + " holds no rows";
  return out;
}

Fp8Sweep read_fp8_sweep(const std::string& results_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string newest;
  if (fs::is_directory(results_dir, ec))
    for (const auto& entry : fs::directory_iterator(results_dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind(kFp8SweepPrefix, 0) == 0 && entry.path().extension() == ".json" && name > newest) newest = name;
    }
  if (newest.empty()) {
    Fp8Sweep none;
    none.error = "no " + std::string(kFp8SweepPrefix) + "*.json in " + results_dir +
                 ": run build/bin/fp8_error_study --sweep --json bench/results/" + kFp8SweepPrefix + "DATE.json";
    return none;
  }
  std::ifstream in(fs::path(results_dir) / newest);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_fp8_sweep(text.str(), "bench/results/" + newest);
}

std::vector<int> fp8_sweep_head_dims(const Fp8Sweep& s) {
  std::vector<int> dims;
  for (const Fp8SweepRow& r : s.rows)
    if (std::find(dims.begin(), dims.end(), r.head_dim) == dims.end()) dims.push_back(r.head_dim);
  std::sort(dims.begin(), dims.end());
  return dims;
}

int fp8_sweep_head_dim_for(const Fp8Sweep& s, int wanted) {
  int best = 0;
  for (int d : fp8_sweep_head_dims(s))
    if (best == 0 || std::abs(d - wanted) < std::abs(best - wanted)) best = d;
  return best;
}

}  // namespace flashlab::viz
