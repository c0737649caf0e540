#include "bench_results.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace flashlab::viz {

namespace {

using nlohmann::json;

const json* first_of(const json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (o.contains(k) && !o.at(k).is_null()) return &o.at(k);
  return nullptr;
}

void walk(const json& node, const std::string& file, std::string device, BenchResults& out) {
  if (node.is_array()) {
    for (const json& child : node) walk(child, file, device, out);
    return;
  }
  if (!node.is_object()) return;
  // The device's name; rows may also say only its kind ("cuda"), which names nothing.
  if (const json* d = first_of(node, {"device_name", "gpu", "device"}); d && d->is_string()) {
    const std::string name = d->get<std::string>();
    if (name != "cuda" && name != "cpu") device = name;
  }
  if (const json* status = first_of(node, {"status"}); status && status->is_string() && status->get<std::string>() != "ok")
    return;  // out of memory, unsupported, ...: no time to plot
  const json* seq = first_of(node, {"seq", "seq_q", "seq_len", "N", "n"});
  const json* ms = first_of(node, {"forward_ms", "fwd_ms", "ms", "time_ms"});
  if (seq && ms && seq->is_number() && ms->is_number()) {
    BenchPoint p;
    p.file = file;
    p.device = device.empty() ? "unknown device" : device;
    p.seq = seq->get<int>();
    p.forward_ms = ms->get<double>();
    if (const json* v = first_of(node, {"variant", "name", "backend", "kernel"}); v && v->is_string())
      p.variant = v->get<std::string>();
    if (const json* v = first_of(node, {"dtype"}); v && v->is_string()) p.dtype = v->get<std::string>();
    if (const json* v = first_of(node, {"head_dim", "d"}); v && v->is_number()) p.head_dim = v->get<int>();
    if (const json* v = first_of(node, {"batch"}); v && v->is_number()) p.batch = std::max(1, v->get<int>());
    if (const json* v = first_of(node, {"heads_q", "heads"}); v && v->is_number()) p.heads = std::max(1, v->get<int>());
    if (const json* v = first_of(node, {"modeled_hbm_bytes_forward"}); v && v->is_number()) p.modeled_bytes = v->get<double>();
    if (const json* v = first_of(node, {"causal"})) p.causal = v->is_boolean() ? v->get<bool>() : (v->is_string() && v->get<std::string>() != "none");
    if (const json* v = first_of(node, {"tflops", "forward_tflops", "tflops_fwd"}); v && v->is_number())
      p.tflops = v->get<double>();
    out.points.push_back(p);
  }
  for (const auto& [key, child] : node.items())
    if (child.is_structured()) walk(child, file, device, out);
}

}  // namespace

void parse_bench_json(const std::string& text, const std::string& file, BenchResults& out) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    out.errors.push_back(file + " is not valid JSON (" + e.what() + ")");
    return;
  }
  walk(j, file, "", out);
}

BenchResults read_bench_results(const std::string& directory) {
  BenchResults out;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) return out;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    std::ostringstream text;
    text << in.rdbuf();
    parse_bench_json(text.str(), entry.path().filename().string(), out);
  }
  return out;
}

}  // namespace flashlab::viz
