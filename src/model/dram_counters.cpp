// Reading bench/results/<gpu>-dram-counters.json (dram_counters.hpp).
#include "model/dram_counters.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace flashlab {

namespace {

using nlohmann::json;

// The member `key` of `o`, which must be there and of the given kind; else one sentence.
const json& member(const json& o, const char* key, json::value_t kind, const std::string& where) {
  if (!o.is_object() || !o.contains(key))
    throw InputError(where + " has no \"" + key + "\"; record the file with scripts/record_dram_counters.sh");
  const json& v = o.at(key);
  const bool ok = kind == json::value_t::number_integer ? v.is_number_integer() && v.get<std::int64_t>() >= 0
                  : kind == json::value_t::string        ? v.is_string()
                                                         : v.is_array();
  if (!ok)
    throw InputError(where + ": \"" + key + "\" is " + v.dump() + ", not " +
                     (kind == json::value_t::number_integer ? "a non-negative integer"
                      : kind == json::value_t::string      ? "a string"
                                                           : "a list"));
  return v;
}
std::int64_t integer(const json& o, const char* key, const std::string& where) {
  return member(o, key, json::value_t::number_integer, where).get<std::int64_t>();
}
std::string text(const json& o, const char* key, const std::string& where) {
  return member(o, key, json::value_t::string, where).get<std::string>();
}
int small(const json& o, const char* key, const std::string& where) {
  const std::int64_t v = integer(o, key, where);
  if (v > (1 << 30)) throw InputError(where + ": \"" + key + "\" is " + std::to_string(v) + ", out of range");
  return static_cast<int>(v);
}

RecordedRun parse_run(const json& r, const std::string& where) {
  RecordedRun run;
  run.variant = text(r, "variant", where);
  run.dtype = text(r, "dtype", where);
  const int heads = small(r, "heads", where), seq = small(r, "seq", where);
  run.shape = Shape{.batch = small(r, "batch", where), .heads_q = heads, .heads_kv = heads, .seq_q = seq, .seq_k = seq,
                    .head_dim = small(r, "head_dim", where)};
  try {
    run.causal = parse_causal(text(r, "causal", where));
    Problem p;
    p.shape = run.shape;
    validate(p);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
  run.dram_read_bytes = integer(r, "dram_read_bytes", where);
  run.dram_write_bytes = integer(r, "dram_write_bytes", where);
  const json& kernels = member(r, "kernels", json::value_t::array, where);
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const std::string at = where + ", kernel " + std::to_string(k);
    const json& kj = kernels[k];
    RecordedKernel kernel;
    kernel.name = text(kj, "name", at);
    kernel.grid_size = integer(kj, "grid_size", at);
    kernel.dram_read_bytes = integer(kj, "dram_read_bytes", at);
    kernel.dram_write_bytes = integer(kj, "dram_write_bytes", at);
    if (kj.contains("blocks_per_sm") && !kj.at("blocks_per_sm").is_null()) kernel.blocks_per_sm = small(kj, "blocks_per_sm", at);
    if (kj.contains("block_size") && !kj.at("block_size").is_null()) kernel.block_size = small(kj, "block_size", at);
    run.kernels.push_back(kernel);
  }
  if (run.kernels.empty()) throw InputError(where + " lists no kernel");
  return run;
}

}  // namespace

std::string dram_counters_path(std::string_view results_dir, const GpuSpec& gpu) {
  return std::string(results_dir) + "/" + std::string(gpu.id) + "-dram-counters.json";
}

DramCounters parse_dram_counters(const std::string& text_in, const std::string& where) {
  json j;
  try {
    j = json::parse(text_in);
  } catch (const json::parse_error& e) {
    throw InputError(where + " is not valid JSON (" + e.what() + ")");
  }
  DramCounters c;
  c.path = where;
  c.device = text(j, "device", where);
  c.date = j.contains("date") && j["date"].is_string() ? j["date"].get<std::string>() : "";
  c.command = j.contains("command") && j["command"].is_string() ? j["command"].get<std::string>() : "";
  const json& runs = member(j, "runs", json::value_t::array, where);
  for (std::size_t n = 0; n < runs.size(); ++n) c.runs.push_back(parse_run(runs[n], where + ", run " + std::to_string(n)));
  return c;
}

DramCounters read_dram_counters(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot read the DRAM counters file " + path);
  std::ostringstream all;
  all << in.rdbuf();
  return parse_dram_counters(all.str(), path);
}

}  // namespace flashlab
