// The visualizer's logic, without a window: replaying the library's event stream gives the right
// tile states at step K, its counters equal the library's TrafficCounter and `flashlab trace`, the
// online-softmax replay matches the library's tiled_forward, and scenario files are parsed with one
// clear sentence for each kind of mistake.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli.hpp"
#include "core/mask.hpp"
#include "logic/bench_results.hpp"
#include "logic/csv.hpp"
#include "logic/fp8_study.hpp"
#include "logic/gpu_sweep.hpp"
#include "model/gpu.hpp"
#include "registry/gpu_models.hpp"
#include "logic/replay.hpp"
#include "logic/softmax_trace.hpp"
#include "logic/sweep.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

Scenario small(Algorithm a, CausalAlign causal = CausalAlign::None, int n = 256) {
  Scenario s;
  s.algorithm = a;
  s.seq_q = s.seq_k = n;
  s.head_dim = 64;
  s.sram_bytes = 16384;  // bf16: Bc = ceil(8192 / 256) = 32, Br = 32 -> 8 x 8 tiles at N = 256
  s.causal = causal;
  return s;
}

// Index of the first event matching the predicate, or -1.
template <class F>
std::int64_t find_event(const Trace& t, F pred) {
  for (const TileEvent& e : t.events)
    if (pred(e)) return e.index;
  return -1;
}

nlohmann::json trace_json(const Scenario& s, Algorithm a) {
  std::ostringstream out, err;
  const std::vector<std::string> args = {"trace", "--algorithm", to_string(a), "--seq-q",
                                         std::to_string(s.seq_q), "--head-dim", std::to_string(s.head_dim),
                                         "--sram-bytes", std::to_string(s.sram_bytes), "--causal",
                                         to_string(s.causal), "--json"};
  REQUIRE_MESSAGE(run_cli(args, out, err) == 0, err.str());
  return nlohmann::json::parse(out.str());
}

std::string error_of(const std::string& json_text) {
  try {
    parse_scenario(json_text, "test.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("replayed counters equal the library's TrafficCounter and `flashlab trace`") {
  for (Algorithm a : {Algorithm::Standard, Algorithm::FA1, Algorithm::FA2})
    for (CausalAlign c : {CausalAlign::None, CausalAlign::TopLeft}) {
      CAPTURE(to_string(a));
      CAPTURE(to_string(c));
      const Scenario s = small(a, c);
      const Trace t = record_trace(s, a);
      Replay r(t);
      r.seek(r.size());
      TrafficCounter direct;
      count_traffic(a, Pass::Forward, to_problem(s), resolve_tiling(s), 2, direct);
      CHECK(r.totals().read == direct.totals().read);
      CHECK(r.totals().written == direct.totals().written);
      CHECK(r.totals().events == direct.totals().events);
      CHECK(r.totals().peak_sram_bytes == direct.totals().peak_sram_bytes);
      const nlohmann::json j = trace_json(s, a);
      CHECK(j["total_read"].get<std::int64_t>() == r.totals().total_read());
      CHECK(j["total_written"].get<std::int64_t>() == r.totals().total_written());
      CHECK(j["events"].get<std::int64_t>() == r.size());
      for (const auto& [name, v] : j["tensors"].items()) {
        CAPTURE(name);
        int id = -1;
        for (int k = 0; k < int(TensorId::Count); ++k)
          if (name == to_string(TensorId(k))) id = k;
        REQUIRE(id >= 0);
        CHECK(v["read"].get<std::int64_t>() == r.totals().read[std::size_t(id)]);
        CHECK(v["written"].get<std::int64_t>() == r.totals().written[std::size_t(id)]);
      }
    }
}

TEST_CASE("FA2 at step K: the K tile just loaded is in SRAM, the previous one is done") {
  const Scenario s = small(Algorithm::FA2);
  const Trace t = record_trace(s, Algorithm::FA2);
  REQUIRE(t.Tr == 8);
  REQUIRE(t.Tc == 8);
  // Query block 1's load of K_2.
  const std::int64_t k = find_event(t, [](const TileEvent& e) {
    return e.tensor == TensorId::K && e.direction == Direction::Load && e.i == 1 && e.tile_col == 2;
  });
  REQUIRE(k >= 0);
  Replay r(t);
  r.seek(k + 1);
  CHECK(r.tile(TensorId::K, 2) == TileState::InSram);
  CHECK(r.tile(TensorId::K, 1) == TileState::Done);     // freed after (1, 1)
  CHECK(r.tile(TensorId::K, 3) == TileState::Done);     // seen with query block 0, not yet with 1
  CHECK(r.tile(TensorId::Q, 1) == TileState::InSram);   // the outer loop's block stays on chip
  CHECK(r.tile(TensorId::Q, 0) == TileState::Done);
  CHECK(r.tile(TensorId::Q, 2) == TileState::Pending);
  CHECK(r.tile(TensorId::O, 1) == TileState::InSram);   // created on chip, written once at the end
  CHECK(r.tile(TensorId::O, 0) == TileState::Done);
  CHECK(r.score(1, 2) == TileState::InSram);
  CHECK(r.score(1, 1) == TileState::Done);
  CHECK(r.score(0, 7) == TileState::Done);
  CHECK(r.score(1, 3) == TileState::Pending);
  CHECK(r.score(7, 7) == TileState::Pending);
  CHECK(r.reads(TensorId::K, 2) == 2);  // once per query block so far: blocks 0 and 1
  CHECK(r.reads(TensorId::O, 1) == 0);  // FA2 never reads O

  // Going back gives the same state as coming forward.
  r.seek(r.size());
  r.seek(k + 1);
  Replay fresh(t);
  fresh.seek(k + 1);
  for (int b = 0; b < t.Tc; ++b) CHECK(r.tile(TensorId::K, b) == fresh.tile(TensorId::K, b));
  for (int i = 0; i < t.Tr; ++i)
    for (int j = 0; j < t.Tc; ++j) CHECK(r.score(i, j) == fresh.score(i, j));
  CHECK(r.totals().read == fresh.totals().read);

  r.seek(0);
  CHECK(r.current() == nullptr);
  CHECK(r.tile(TensorId::Q, 0) == TileState::Pending);
  CHECK(r.totals().total() == 0);
}

TEST_CASE("the heat map shows FA1 re-reading O_i once per key block; FA2 reads it never") {
  const Scenario s = small(Algorithm::FA1);
  const Trace fa1 = record_trace(s, Algorithm::FA1);
  const Trace fa2 = record_trace(s, Algorithm::FA2);
  Replay r1(fa1), r2(fa2);
  r1.seek(r1.size());
  r2.seek(r2.size());
  for (int i = 0; i < fa1.Tr; ++i) {
    CHECK(r1.reads(TensorId::O, i) == fa1.Tc);
    CHECK(r2.reads(TensorId::O, i) == 0);
    CHECK(r1.writes(TensorId::O, i) == fa1.Tc);
    CHECK(r2.writes(TensorId::O, i) == 1);
  }
  for (int j = 0; j < fa1.Tc; ++j) {
    CHECK(r1.reads(TensorId::K, j) == 1);
    CHECK(r2.reads(TensorId::K, j) == fa2.Tr);
  }
  const auto lines = compare_totals(fa1, fa2);
  bool o_line = false;
  for (const auto& l : lines) o_line |= l.find("FA1 moved 16x more bytes for O") != std::string::npos;
  CHECK_MESSAGE(o_line, "compare lines: " << lines.size());
}

TEST_CASE("causal: exactly the tiles core/mask.hpp calls fully masked are skipped") {
  for (CausalAlign c : {CausalAlign::TopLeft, CausalAlign::BottomRight})
    for (Algorithm a : {Algorithm::FA1, Algorithm::FA2}) {
      Scenario s = small(a, c);
      s.seq_q = 160;  // seq_q < seq_k: the two alignments differ
      const Trace t = record_trace(s, a);
      Replay r(t);
      r.seek(r.size());
      int skipped = 0;
      for (int i = 0; i < t.Tr; ++i)
        for (int j = 0; j < t.Tc; ++j) {
          const int r0 = i * t.tiling.Br, r1 = std::min(s.seq_q, r0 + t.tiling.Br);
          const bool masked = tile_fully_masked(c, r0, r1, j * t.tiling.Bc, s.seq_q, s.seq_k);
          CHECK((r.score(i, j) == TileState::Skipped) == masked);
          CHECK((r.score(i, j) == TileState::Done) == !masked);
          skipped += masked;
        }
      CHECK(skipped > 0);
    }
}

TEST_CASE("the online-softmax replay matches a direct softmax and the library's LSE") {
  for (Algorithm a : {Algorithm::FA1, Algorithm::FA2})
    for (CausalAlign c : {CausalAlign::None, CausalAlign::BottomRight}) {
      Scenario s = small(a, c, 96);
      s.seq_k = 128;
      const Trace t = record_trace(s, a);
      const SoftmaxTrace sm = trace_online_softmax(t, 7);
      REQUIRE(sm.available);
      CHECK(sm.max_err_o < 1e-12);
      CHECK(sm.max_err_lse_library < 1e-12);
      for (int row = 0; row < s.seq_q; ++row) {
        const SoftmaxRow end = row_state(sm, row, t.events.size());
        CHECK(end.m == doctest::Approx(sm.direct_m[std::size_t(row)]).epsilon(1e-12));
        CHECK(end.l == doctest::Approx(sm.direct_l[std::size_t(row)]).epsilon(1e-12));
        CHECK(row_state(sm, row, 0).visits == 0);
      }
    }
  const Trace standard = record_trace(small(Algorithm::Standard), Algorithm::Standard);
  const SoftmaxTrace none = trace_online_softmax(standard, 1);
  CHECK_FALSE(none.available);
  CHECK(none.why_not.find("standard") != std::string::npos);
}

TEST_CASE("the running max only grows and the rescale factor is exp(m_old - m_new)") {
  const Scenario s = small(Algorithm::FA2, CausalAlign::None, 128);
  const Trace t = record_trace(s, Algorithm::FA2);
  const SoftmaxTrace sm = trace_online_softmax(t, 3);
  REQUIRE(sm.available);
  const int row = 40;
  SoftmaxRow prev = row_state(sm, row, 0);
  int updates = 0;
  for (const SoftmaxVisit& v : sm.visits) {
    const SoftmaxRow now = row_state(sm, row, v.event + 1);
    if (now.visits == prev.visits) continue;
    ++updates;
    if (prev.visits > 0) {
      CHECK(now.m >= prev.m);
      CHECK(now.rescale == doctest::Approx(std::exp(prev.m - now.m)));
    }
    prev = now;
  }
  CHECK(updates == t.Tc);
}

TEST_CASE("sweeps count what the library counts, and standard attention's footprint holds S and P") {
  Scenario s = small(Algorithm::FA2);
  for (int n : {256, 1024}) {
    const SweepPoint std_pt = count_point(s, Algorithm::Standard, n);
    const SweepPoint fa2_pt = count_point(s, Algorithm::FA2, n);
    Scenario at = s;
    at.seq_q = at.seq_k = n;
    TrafficCounter c;
    count_traffic(Algorithm::FA2, Pass::Forward, to_problem(at), resolve_tiling(at), 2, c);
    CHECK(fa2_pt.hbm_bytes == double(c.totals().total()));
    const double nd = double(n) * 64 * 2;  // one (N, d) bf16 tensor
    CHECK(std_pt.footprint_bytes >= 4 * nd + 2.0 * n * n * 2);  // Q, K, V, O + S, P
    CHECK(fa2_pt.footprint_bytes >= 4 * nd);
    CHECK(fa2_pt.footprint_bytes < 4 * nd + double(n) * 8 + 1);  // + the LSE
    CHECK(fa2_pt.compulsory_bytes <= fa2_pt.hbm_bytes);
    CHECK(fa2_pt.compulsory_bytes >= 4 * nd);  // Q, K, V read and O written at least once
  }
  CHECK(sweep_lengths(256, 2048) == std::vector<int>{256, 512, 1024, 2048});

  Job job;
  TrafficSweep sweep;
  job.start([&](Job& j) { run_traffic_sweep(j, s, sweep, 1024); });
  job.cancel();  // waits; the sweep may or may not have finished, but must stop cleanly
  Job full;
  full.start([&](Job& j) { run_traffic_sweep(j, s, sweep, 1024); });
  while (full.running()) std::this_thread::yield();
  REQUIRE(sweep.points.size() == 3);
  CHECK(sweep.points[2].size() == 3);
  CHECK(full.progress() == doctest::Approx(1.0));
  const std::string csv = sweep_csv(sweep, CpuTiming{});
  CHECK(csv.find("fa2,1024,") != std::string::npos);
}

TEST_CASE("counters CSV lists each tensor's bytes so far and in the whole run") {
  const Trace t = record_trace(small(Algorithm::FA1), Algorithm::FA1);
  Replay r(t);
  r.seek(r.size() / 2);
  const std::string csv = counters_csv(r);
  std::ostringstream expect;
  expect << "O," << r.totals().read[int(TensorId::O)] << ',' << r.totals().written[int(TensorId::O)] << ','
         << t.totals.read[int(TensorId::O)] << ',' << t.totals.written[int(TensorId::O)];
  CHECK(csv.find(expect.str()) != std::string::npos);
}

TEST_CASE("lock-step maps the same fraction of two streams") {
  CHECK(lockstep(0, 100, 300) == 0);
  CHECK(lockstep(50, 100, 300) == 150);
  CHECK(lockstep(100, 100, 300) == 300);
  CHECK(lockstep(5, 0, 300) == 0);
}

TEST_CASE("scenario files parse, and each mistake gets one sentence naming it") {
  const Scenario s = parse_scenario(R"({"algorithm": "fa1", "seq": 512, "head_dim": 32, "sram_bytes": 32768,
      "causal": "bottom-right", "dtype": "f32", "step": 10, "compare": "fa2", "panels": ["tiles", "memory"],
      "size": [1200, 800], "caption": "x"})");
  CHECK(s.algorithm == Algorithm::FA1);
  CHECK(s.seq_q == 512);
  CHECK(s.seq_k == 512);
  CHECK(s.causal == CausalAlign::BottomRight);
  CHECK(bytes_per_element(s) == 4);
  CHECK(s.compare == Algorithm::FA2);
  CHECK(s.panels == std::vector<std::string>{"tiles", "memory"});
  CHECK(s.width == 1200);
  CHECK(parse_scenario(to_json(s)).seq_q == 512);  // round trip
  CHECK(parse_scenario(R"({"causal": true})").causal == CausalAlign::TopLeft);

  CHECK(error_of("{\"seq\": 256,").find("not valid JSON") != std::string::npos);
  CHECK(error_of("[1, 2]").find("JSON object") != std::string::npos);
  CHECK(error_of(R"({"sequence": 256})").find("unknown key \"sequence\"") != std::string::npos);
  CHECK(error_of(R"({"seq": "long"})").find("\"seq\" must be an integer") != std::string::npos);
  CHECK(error_of(R"({"seq": 0})").find("\"seq\" must be in [1,") != std::string::npos);
  CHECK(error_of(R"({"head_dim": 512})").find("head_dim") != std::string::npos);
  CHECK(error_of(R"({"algorithm": "fa3"})").find("unknown algorithm 'fa3'") != std::string::npos);
  CHECK(error_of(R"({"dtype": "int8"})").find("unknown dtype") != std::string::npos);
  CHECK(error_of(R"({"dtype": "e4m3"})").find("replays the loop nest in f64, f32, f16 or bf16, not e4m3") != std::string::npos);
  CHECK(error_of(R"({"panels": ["tiles", "movie"]})").find("unknown panel \"movie\"") != std::string::npos);
  CHECK(error_of(R"({"size": [10]})").find("[width, height]") != std::string::npos);
  CHECK(error_of(R"({"sram_bytes": 100, "head_dim": 64})").find("SRAM") != std::string::npos);
  CHECK(error_of(R"({"sram_bytes": -5})").find("positive") != std::string::npos);
  CHECK(error_of(R"({"step": -7})").find("step") != std::string::npos);
  const Scenario g = parse_scenario(R"({"gpu_variant": "cuda-fa3-ws", "gpu": "h200"})");
  CHECK(g.gpu_variant == "cuda-fa3-ws");
  CHECK(parse_scenario(to_json(g)).gpu == "h200");
  CHECK(error_of(R"({"gpu": "a100"})").find("unknown GPU 'a100': the model describes h100, h200") != std::string::npos);
  CHECK(error_of(R"({"gpu_variant": "cpu-fa2"})").find("gpu_variant 'cpu-fa2' has no GPU model") != std::string::npos);
  for (const std::string& e : {error_of("{"), error_of(R"({"seq": 0})"), error_of(R"({"sram_bytes": 100})")})
    CHECK(e.rfind("test.json", 0) == 0);  // names the file first
  CHECK_THROWS_AS(load_scenario_file("/nonexistent/scenario.json"), InputError);
}

TEST_CASE("every scenario shipped in viz/scenarios parses and records") {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FLASHLAB_SOURCE_DIR) + "/viz/scenarios")) {
    if (entry.path().extension() != ".json") continue;
    CAPTURE(entry.path().string());
    const Scenario s = load_scenario_file(entry.path().string());
    const Trace t = record_trace(s, s.algorithm);
    CHECK(t.events.size() > 0);
    CHECK(s.step < std::int64_t(t.events.size()) + 1);
    ++files;
  }
  CHECK(files >= 3);
}

TEST_CASE("an animation too long to hold is refused with a sentence saying how to shrink it") {
  Scenario s = small(Algorithm::FA1);
  try {
    record_trace(s, Algorithm::FA1, 100);
    FAIL("expected an InputError");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("smaller N or a larger SRAM") != std::string::npos);
  }
}

TEST_CASE("the GPU level for the Plots panel: the model's three levels and the counters recorded on that GPU") {
  Scenario s = small(Algorithm::FA2);
  s.head_dim = 64;
  CHECK(gpu_variant_of(s) == "cuda-fa2");  // the algorithm's own kernel, unless the scenario names one
  CHECK(gpu_variant_of(small(Algorithm::Standard)) == "cuda-naive");
  s.gpu_variant = "cuda-fa2";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "flashlab_viz_counters";
  std::filesystem::create_directories(dir);
  const std::string run = R"({"variant": "%V", "dtype": "bf16", "batch": 1, "heads": 16, "seq": %N, "head_dim": %D,
      "causal": "none", "dram_read_bytes": 1000, "dram_write_bytes": 10,
      "kernels": [{"name": "k", "grid_size": 1, "dram_read_bytes": 1000, "dram_write_bytes": 10}]})";
  auto make = [&](const char* v, int n, int d) {
    std::string r = run;
    r.replace(r.find("%V"), 2, v);
    r.replace(r.find("%N"), 2, std::to_string(n));
    r.replace(r.find("%D"), 2, std::to_string(d));
    return r;
  };
  std::ofstream(dir / "h100-dram-counters.json") << R"({"device": "NVIDIA H100 80GB HBM3", "runs": [)" +
                                                        make("cuda-fa2", 2048, 64) + "," + make("cuda-fa2", 4096, 128) +
                                                        "," + make("cuda-fa1", 2048, 64) + "]}";
  GpuSweep measured;
  read_measured(s, dir.string(), measured);
  CHECK(measured.measured_device == "NVIDIA H100 80GB HBM3");
  REQUIRE(measured.measured.size() == 1);  // the variant, head dim and mask of the scenario only
  CHECK(measured.measured[0].n == 2048);
  CHECK(measured.measured[0].dram_read == 1000);
  std::ofstream(dir / "h100-dram-counters.json") << "{\"device\": 3}";
  read_measured(s, dir.string(), measured);
  CHECK(measured.measured_error.find("\"device\" is 3, not a string") != std::string::npos);
  std::filesystem::remove_all(dir);
  read_measured(s, dir.string(), measured);  // nothing recorded: no points, no error
  CHECK(measured.measured.empty());
  CHECK(measured.measured_error.empty());

  // The model points are the GPU level's own numbers (B = 1, H = 16).
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 16, .heads_kv = 16, .seq_q = 2048, .seq_k = 2048, .head_dim = 64};
  const GpuSpec& gpu = find_gpu("h100");
  const GpuTraffic t = model_gpu_traffic(gpu, p.shape, gpu_forward_pass("cuda-fa2", p, gpu).kernels);
  const GpuLevelPoint pt = model_point(s, 2048);
  CHECK(pt.dram_read == double(t.dram.total_read()));
  CHECK(pt.two_level_read == double(t.two_level.total_read()));
  CHECK(pt.compulsory_read == double(t.compulsory.total_read()));
  Job job;
  GpuSweep sweep;
  job.start([&](Job& j) { run_gpu_sweep(j, s, dir.string(), sweep, 4096); });
  job.cancel();  // waits for it
  {
    std::lock_guard lock(job.mutex);
    CHECK(job.error.empty());
    REQUIRE(sweep.points.size() <= 3);
  }
  job.start([&](Job& j) { run_gpu_sweep(j, s, dir.string(), sweep, 4096); });
  while (job.running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(sweep.points.size() == 3);  // 1k, 2k, 4k
  CHECK(sweep.points[1].dram_read == pt.dram_read);
}

TEST_CASE("the memory chart's note: the L2 model on the scenario's own problem, or why there is none") {
  Scenario s = small(Algorithm::FA2);
  const std::string note = gpu_note(s);
  CHECK(note.find("cuda-fa2 on the h100") != std::string::npos);
  CHECK(note.find("compulsory") != std::string::npos);
  s.algorithm = Algorithm::Standard;
  CHECK(gpu_note(s).find("cuda-naive") != std::string::npos);
  s.algorithm = Algorithm::FA1;
  s.head_dim = 200;
  CHECK(gpu_note(s).find("does not support head_dim 200") != std::string::npos);
  s.pass = Pass::Backward;
  CHECK(gpu_note(s).find("forward kernels") != std::string::npos);
}

TEST_CASE("bench results: any object with a sequence length and a forward time is a point") {
  BenchResults r;
  parse_bench_json(R"({"device": "NVIDIA H100 80GB HBM3", "results": [
      {"variant": "cuda-fa2", "seq_q": 4096, "head_dim": 128, "forward_ms": 1.5, "causal": true},
      {"variant": "cuda-fa2", "seq_q": 8192, "head_dim": 128, "forward_ms": 5.0, "tflops": 300.0},
      {"note": "no time here", "seq_q": 1}]})",
                   "a.json", r);
  parse_bench_json("{not json", "b.json", r);
  REQUIRE(r.points.size() == 2);
  CHECK(r.points[0].device == "NVIDIA H100 80GB HBM3");
  CHECK(r.points[0].seq == 4096);
  CHECK(r.points[0].causal);
  CHECK(r.points[1].tflops == 300.0);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("b.json") != std::string::npos);
}

TEST_CASE("the FP8 panel reads the newest outlier sweep of bench/results, and says why when it cannot") {
  const Fp8Sweep sweep = read_fp8_sweep(std::string(FLASHLAB_SOURCE_DIR) + "/bench/results");
  REQUIRE_MESSAGE(sweep.error.empty(), sweep.error);
  CHECK(sweep.file.rfind(std::string("bench/results/") + kFp8SweepPrefix, 0) == 0);
  CHECK(fp8_sweep_head_dims(sweep) == std::vector<int>{64, 128, 256});
  CHECK(fp8_sweep_head_dim_for(sweep, 128) == 128);
  CHECK(fp8_sweep_head_dim_for(sweep, 100) == 128);
  CHECK(fp8_sweep_head_dim_for(sweep, 32) == 64);
  for (const Fp8SweepRow& r : sweep.rows) {  // what the panel plots is there, on log axes
    CHECK(r.outlier_factor >= 1);
    CHECK(r.score_rmse_fp8 > 0);
    CHECK(r.score_rmse_fp8_rotated > 0);
    CHECK(r.rmse_fp8_rotated > 0);
  }

  const Fp8Sweep bad = parse_fp8_sweep(R"({"rows": [{"head_dim": 64}]})", "x.json");
  CHECK(bad.rows.empty());
  CHECK(bad.error.find("x.json") != std::string::npos);
  CHECK(parse_fp8_sweep("{", "y.json").error.find("y.json") != std::string::npos);
  CHECK(read_fp8_sweep("/nonexistent").error.find("fp8_error_study --sweep") != std::string::npos);
}

TEST_CASE("live CPU timing runs the library's forward passes and reports a time per length") {
  Scenario s = small(Algorithm::FA2);
  s.head_dim = 32;
  Job job;
  CpuTiming timing;
  job.start([&](Job& j) { run_cpu_timing(j, s, timing, 256, 5.0); });
  while (job.running()) std::this_thread::yield();
  CHECK(job.error.empty());
  REQUIRE(timing.series.size() == 3);
  for (const Series& ser : timing.series) {
    CAPTURE(ser.name);
    CHECK(ser.x == std::vector<double>{128, 256});
    REQUIRE(ser.y.size() == 2);
    CHECK(ser.y[0] > 0);
    CHECK(ser.y[1] > 0);
  }
  CHECK(timing.series[0].name == "cpu standard");
  CHECK(job.progress() == doctest::Approx(1.0));
}
