#include "scenario.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "registry/gpu_models.hpp"

namespace flashlab::viz {

namespace {

using nlohmann::json;

constexpr int kMaxSeq = 1 << 20;        // the count-only loop nest handles this; the app shows one head
constexpr int kMaxWindowSide = 8192;
constexpr int kMinWindowSide = 320;

const std::vector<std::string> kKeys = {"algorithm", "pass", "seq", "seq_q", "seq_k", "head_dim", "sram_bytes",
                                        "br", "bc", "causal", "dtype", "step", "compare", "panels", "size",
                                        "caption", "seed", "timeline", "timeline_compare", "gpu_variant", "gpu",
                                        "ring"};
const std::vector<std::string> kRingKeys = {"ranks", "seq",  "batch", "heads",   "head_dim",
                                            "causal", "pass", "step",  "measured", "timeline"};

std::string key_list() {
  std::string s;
  for (const auto& k : kKeys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// Reads an integer field, with a sentence naming the field when it has the wrong type.
std::int64_t get_int(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  if (!v.is_number_integer())
    throw InputError(where + ": \"" + key + "\" must be an integer, got " + v.dump());
  return v.get<std::int64_t>();
}
std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = j.at(key);
  if (!v.is_string()) throw InputError(where + ": \"" + key + "\" must be a string, got " + v.dump());
  return v.get<std::string>();
}
int to_int_in(std::int64_t v, std::int64_t lo, std::int64_t hi, const char* key, const std::string& where) {
  if (v < lo || v > hi)
    throw InputError(where + ": \"" + key + "\" must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got " + std::to_string(v));
  return static_cast<int>(v);
}

Pass parse_pass(const std::string& s, const std::string& where) {
  if (s == "forward") return Pass::Forward;
  if (s == "backward") return Pass::Backward;
  throw InputError(where + ": unknown pass '" + s + "': supported are forward and backward");
}

// The "ring" object: the Ring panel's problem, each key optional (RingSettings has the defaults).
RingSettings parse_ring(const json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(where + ": \"ring\" must be an object such as {\"ranks\": 4, \"seq\": 16384}");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (std::find(kRingKeys.begin(), kRingKeys.end(), key) == kRingKeys.end()) {
      std::string known;
      for (const auto& k : kRingKeys) known += (known.empty() ? "" : ", ") + k;
      throw InputError(where + ": unknown key \"" + key + "\" in \"ring\"; known keys are " + known);
    }
  }
  RingSettings r;
  if (j.contains("ranks")) r.ranks = to_int_in(get_int(j, "ranks", where), 1, kMaxPanelRanks, "ranks", where);
  if (j.contains("seq")) r.seq = to_int_in(get_int(j, "seq", where), 1, 1 << 30, "seq", where);
  if (j.contains("batch")) r.batch = to_int_in(get_int(j, "batch", where), 1, 1 << 20, "batch", where);
  if (j.contains("heads")) r.heads = to_int_in(get_int(j, "heads", where), 1, 1 << 20, "heads", where);
  if (j.contains("head_dim")) r.head_dim = to_int_in(get_int(j, "head_dim", where), 1, 256, "head_dim", where);
  if (j.contains("causal")) {
    if (!j.at("causal").is_boolean()) throw InputError(where + ": \"causal\" in \"ring\" must be true or false");
    r.causal = j.at("causal").get<bool>();
  }
  if (j.contains("pass")) r.pass = parse_pass(get_string(j, "pass", where), where);
  if (j.contains("step")) r.step = to_int_in(get_int(j, "step", where), -1, kMaxPanelRanks - 1, "step", where);
  if (j.contains("measured")) r.measured = get_string(j, "measured", where);
  if (j.contains("timeline")) r.timeline = get_string(j, "timeline", where);
  if (!r.measured.empty() && !r.timeline.empty())
    throw InputError(where + ": \"ring\" names both a measured-times file and a timeline; give one of them");
  return r;
}

}  // namespace

const GpuPreset& h100() {
  static const GpuPreset preset;
  return preset;
}

const std::vector<std::string>& panel_ids() {
  static const std::vector<std::string> ids = {"controls", "transport", "export", "loop_nest", "tiles",
                                               "memory", "softmax", "compare", "plots", "pipeline", "ring",
                                               "fp8"};
  return ids;
}

Scenario parse_scenario(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(where + " is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) throw InputError(where + " must hold a JSON object such as {\"algorithm\": \"fa2\"}");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (std::find(kKeys.begin(), kKeys.end(), key) == kKeys.end())
      throw InputError(where + ": unknown key \"" + key + "\"; known keys are " + key_list());
  }
  Scenario s;
  try {
    if (j.contains("algorithm")) s.algorithm = parse_algorithm(get_string(j, "algorithm", where));
    if (j.contains("pass")) s.pass = parse_pass(get_string(j, "pass", where), where);
    if (j.contains("seq")) s.seq_q = s.seq_k = to_int_in(get_int(j, "seq", where), 1, kMaxSeq, "seq", where);
    if (j.contains("seq_q")) s.seq_q = to_int_in(get_int(j, "seq_q", where), 1, kMaxSeq, "seq_q", where);
    if (j.contains("seq_k")) s.seq_k = to_int_in(get_int(j, "seq_k", where), 1, kMaxSeq, "seq_k", where);
    if (j.contains("head_dim")) s.head_dim = to_int_in(get_int(j, "head_dim", where), 1, 256, "head_dim", where);
    if (j.contains("sram_bytes")) s.sram_bytes = get_int(j, "sram_bytes", where);
    if (j.contains("br")) s.br = to_int_in(get_int(j, "br", where), 0, kMaxSeq, "br", where);
    if (j.contains("bc")) s.bc = to_int_in(get_int(j, "bc", where), 0, kMaxSeq, "bc", where);
    if (j.contains("causal")) {
      const json& c = j.at("causal");
      if (c.is_boolean()) s.causal = c.get<bool>() ? CausalAlign::TopLeft : CausalAlign::None;
      else s.causal = parse_causal(get_string(j, "causal", where));
    }
    if (j.contains("dtype")) {
      s.dtype = parse_dtype(get_string(j, "dtype", where));
      if (s.dtype == DType::E4M3)  // the loop nest computes its numbers in the scenario's dtype: e4m3 has no such path
        throw InputError(where + ": the app replays the loop nest in f64, f32, f16 or bf16, not e4m3 (the FP8 kernel is "
                                 "cuda-fa3-ws's: flashlab bench --dtype e4m3, and lesson 10)");
    }
    if (j.contains("step")) s.step = get_int(j, "step", where);
    if (j.contains("compare")) s.compare = parse_algorithm(get_string(j, "compare", where));
    if (j.contains("panels")) {
      const json& p = j.at("panels");
      if (!p.is_array()) throw InputError(where + ": \"panels\" must be an array of panel ids");
      for (const json& id : p) {
        const auto& ids = panel_ids();
        if (!id.is_string() || std::find(ids.begin(), ids.end(), id.get<std::string>()) == ids.end()) {
          std::string known;
          for (const auto& k : ids) known += (known.empty() ? "" : ", ") + k;
          throw InputError(where + ": unknown panel " + id.dump() + "; known panels are " + known);
        }
        s.panels.push_back(id.get<std::string>());
      }
    }
    if (j.contains("size")) {
      const json& z = j.at("size");
      if (!z.is_array() || z.size() != 2 || !z[0].is_number_integer() || !z[1].is_number_integer())
        throw InputError(where + ": \"size\" must be [width, height] in pixels");
      s.width = to_int_in(z[0].get<std::int64_t>(), kMinWindowSide, kMaxWindowSide, "size", where);
      s.height = to_int_in(z[1].get<std::int64_t>(), kMinWindowSide, kMaxWindowSide, "size", where);
    }
    if (j.contains("caption")) s.caption = get_string(j, "caption", where);
    if (j.contains("seed")) s.seed = static_cast<std::uint64_t>(get_int(j, "seed", where));
    if (j.contains("timeline")) s.timeline = get_string(j, "timeline", where);
    if (j.contains("timeline_compare")) s.timeline_compare = get_string(j, "timeline_compare", where);
    if (j.contains("gpu_variant")) s.gpu_variant = get_string(j, "gpu_variant", where);
    if (j.contains("gpu")) s.gpu = get_string(j, "gpu", where);
    if (j.contains("ring")) s.ring = parse_ring(j.at("ring"), where);
  } catch (const InputError& e) {
    const std::string msg = e.what();
    if (msg.rfind(where, 0) == 0) throw;
    throw InputError(where + ": " + msg);  // core's parse_* sentences, prefixed with the file
  }
  try {
    validate(s);
  } catch (const InputError& e) {
    throw InputError(where + ": " + e.what());
  }
  return s;
}

Scenario load_scenario_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot read scenario file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  Scenario s = parse_scenario(text.str(), path);
  for (std::string* t : {&s.timeline, &s.timeline_compare, &s.ring.measured, &s.ring.timeline})  // relative to the scenario's folder
    if (!t->empty() && std::filesystem::path(*t).is_relative()) *t = (std::filesystem::path(path).parent_path() / *t).lexically_normal().string();
  return s;
}

std::string to_json(const Scenario& s) {
  json j;
  j["algorithm"] = to_string(s.algorithm);
  j["pass"] = s.pass == Pass::Forward ? "forward" : "backward";
  j["seq_q"] = s.seq_q;
  j["seq_k"] = s.seq_k;
  j["head_dim"] = s.head_dim;
  j["sram_bytes"] = s.sram_bytes;
  j["br"] = s.br;
  j["bc"] = s.bc;
  j["causal"] = to_string(s.causal);
  j["dtype"] = to_string(s.dtype);
  j["step"] = s.step;
  if (s.compare) j["compare"] = to_string(*s.compare);
  if (!s.panels.empty()) j["panels"] = s.panels;
  j["size"] = {s.width, s.height};
  if (!s.caption.empty()) j["caption"] = s.caption;
  j["seed"] = s.seed;
  if (!s.timeline.empty()) j["timeline"] = s.timeline;
  if (!s.timeline_compare.empty()) j["timeline_compare"] = s.timeline_compare;
  if (!s.gpu_variant.empty()) j["gpu_variant"] = s.gpu_variant;
  j["gpu"] = s.gpu;
  if (s.ring != RingSettings{}) {
    const RingSettings& r = s.ring;
    j["ring"] = {{"ranks", r.ranks}, {"seq", r.seq},         {"batch", r.batch},
                 {"heads", r.heads}, {"head_dim", r.head_dim}, {"causal", r.causal},
                 {"pass", r.pass == Pass::Forward ? "forward" : "backward"}, {"step", r.step}};
    if (!r.measured.empty()) j["ring"]["measured"] = r.measured;
    if (!r.timeline.empty()) j["ring"]["timeline"] = r.timeline;
  }
  return j.dump(2);
}

int bytes_per_element(const Scenario& s) { return dtype_bytes(s.dtype); }

std::int64_t start_event(const Scenario& s, std::int64_t events) {
  if (s.step >= 0) return s.step;
  if (s.ring.step >= 0) return event_of_ring_step(s.ring.step, events, s.ring.ranks);
  return events;
}

std::string gpu_variant_of(const Scenario& s) {
  if (!s.gpu_variant.empty()) return s.gpu_variant;
  return s.algorithm == Algorithm::Standard ? "cuda-naive" : s.algorithm == Algorithm::FA1 ? "cuda-fa1" : "cuda-fa2";
}

Problem to_problem(const Scenario& s) {
  Problem p;
  p.shape.seq_q = s.seq_q;
  p.shape.seq_k = s.seq_k;
  p.shape.head_dim = s.head_dim;
  p.options.causal = s.causal;
  validate(p);
  return p;
}

Tiling resolve_tiling(const Scenario& s) {
  if (s.sram_bytes <= 0)
    throw InputError("SRAM size must be positive, got " + std::to_string(s.sram_bytes) + " bytes");
  Tiling t = tiling_from_sram(s.sram_bytes, s.head_dim, bytes_per_element(s));
  if (s.br > 0) t.Br = s.br;
  if (s.bc > 0) t.Bc = s.bc;
  return t;
}

void validate(const Scenario& s) {
  to_problem(s);
  resolve_tiling(s);
  find_gpu(s.gpu);
  const std::vector<std::string> modeled = gpu_modeled_variants();
  if (!s.gpu_variant.empty() && std::find(modeled.begin(), modeled.end(), s.gpu_variant) == modeled.end()) {
    std::string known;
    for (const auto& v : modeled) known += (known.empty() ? "" : ", ") + v;
    throw InputError("gpu_variant '" + s.gpu_variant + "' has no GPU model: the modeled variants are " + known);
  }
  if (s.step < -1) throw InputError("step must be -1 (the end) or a count of events, got " + std::to_string(s.step));
  ring_shape(s.ring);
  if (s.ring.step >= s.ring.ranks)
    throw InputError("the ring's step " + std::to_string(s.ring.step) + " does not exist: P = " +
                     std::to_string(s.ring.ranks) + " ranks take steps 0 to " + std::to_string(s.ring.ranks - 1));
}

}  // namespace flashlab::viz
