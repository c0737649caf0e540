// flashlab bench --ring P: ring attention of P ranks on this one GPU (the ranks as streams, cuda/ring.hpp)
// beside its block kernel alone on the whole problem (cuda-fa3-ws, or cuda-fa2 with --variants cuda-fa2), at
// each --seq, for each layout. On one GPU the P ranks share the
// device, so the ideal ring takes the one-shot kernel's time: efficiency = one-shot time / ring time is the
// price of splitting the sequence (smaller blocks, the LSE merges, packing, the copies that stand in for the
// links, and the idle time of causal imbalance). With P GPUs the same ratio, times P, is the ring's rate over
// P x one GPU's. Beside it, the model's imbalance (model/ring.hpp: max over ranks of their FLOPs / mean).
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "core/flops.hpp"
#include "model/ring.hpp"
#include "registry/ring.hpp"

namespace flashlab::cli {
namespace {

struct RingRow {
  int seq = 0;
  std::string layout;  // "one-shot" for the kernel alone
  std::string status = "ok", reason;
  BenchResult result;
  double imbalance = 1;  // the model's, for the forward
};

}  // namespace

int BenchCommand::run_ring(std::ostream& out, std::ostream& err) const {
  if (ring < 1) throw InputError("--ring takes the number of ranks P, at least 1, not " + std::to_string(ring));
  if (device_option->count() > 0 && device != "cuda")
    throw InputError("--ring times ring attention on a GPU: it takes --device cuda (or no --device)");
  const std::string blocks = variants_option->count() > 0 ? variants : kRingBlockKernels[0];
  if (blocks != kRingBlockKernels[0] && blocks != kRingBlockKernels[1])
    throw InputError("--ring times the ring on one block kernel, cuda-fa3-ws (the default) or cuda-fa2, beside that "
                     "kernel alone: --variants names one of them, not " + variants);
  if (one_pass || !timeline_path.empty() || deterministic)
    throw InputError("--ring times whole ring passes: it takes none of --one-pass, --timeline, --deterministic");
  if (!csv_path.empty()) throw InputError("--ring writes its results as JSON (--json), not CSV");
  if (warmup < 0 || iters < 1) throw InputError("--warmup must be >= 0 and --iters >= 1");
  if (heads_kv != 0 && heads_kv != (heads > 0 ? heads : 16))
    throw InputError("--ring times multi-head attention (as many K/V heads as query heads): drop --heads-kv, or time "
                     "grouped-query attention without --ring");
  std::vector<RingLayout> chosen;
  for (const std::string& name : split_list(layouts)) chosen.push_back(parse_ring_layout(name));
  if (chosen.empty()) throw InputError("--layouts names no layout: give contiguous, zigzag or striped");
  const std::vector<int> seqs = parse_int_list(seq, "--seq");
  const DType dt = dtype.empty() ? DType::BF16 : parse_dtype(dtype);
  if (dt == DType::E4M3)
    throw InputError("--ring times the ring's f16 or bf16 blocks: the ring has no FP8 (e4m3) path yet");
  if (!cuda_device_present())
    throw InputError("--ring needs a CUDA GPU and " +
                     std::string(cuda_device_name().empty() ? "none is available on this machine" : "it is not usable"));
  const std::string started = utc_now();

  Problem base;
  base.shape = Shape{batch, heads > 0 ? heads : 16, 0, seqs.front(), seqs.front(), head_dim};
  base.shape.heads_kv = base.shape.heads_q;
  base.options.causal = parse_causal(causal);
  base.options.seed = 1;
  validate(base);
  const BenchSettings settings{.warmup = warmup, .iters = iters, .backward = backward};

  std::vector<RingRow> rows;
  const int total = int(seqs.size() * (chosen.size() + 1));
  int done = 0;
  for (int n : seqs) {
    Problem p = base;
    p.shape.seq_q = p.shape.seq_k = n;
    const auto measure = [&](RingRow& row, const auto& bench) {
      try {
        row.result = bench();
      } catch (const InputError& e) {
        row.status = "skipped";
        row.reason = e.what();
      } catch (const std::exception& e) {
        row.status = "error";
        row.reason = e.what();
      }
      rows.push_back(row);
      ++done;
    };
    RingRow one;
    one.seq = n;
    one.layout = "one-shot";
    progress(err, done, total, blocks + " N=" + std::to_string(n));
    measure(one, [&] {
      const Variant& kernel = find_variant(blocks);
      check_supported(kernel, p, dt, backward);
      return kernel.bench(p, dt, settings);
    });
    for (RingLayout layout : chosen) {
      RingRow row;
      row.seq = n;
      row.layout = to_string(layout);
      progress(err, done, total, std::string("ring ") + to_string(layout) + " N=" + std::to_string(n));
      measure(row, [&] {
        const RingSchedule schedule = ring_schedule(layout, ring, n, n, p.options.causal);
        row.imbalance = ring_cost(schedule, p.shape, Pass::Forward, RingMachine{}).imbalance;
        return bench_ring_on_one_gpu(layout, ring, p, dt, settings, blocks);
      });
    }
  }
  progress(err, done, total, "done");
  err << "\n";

  const std::string device_name = cuda_device_name();
  out << "ring attention of " << ring << " ranks on one GPU (" << device_name << "), " << blocks
      << " blocks: batch " << base.shape.batch << ", heads " << base.shape.heads_q << ", head_dim " << head_dim
      << ", causal " << to_string(base.options.causal)
      << ", " << to_string(dt) << ", median of " << iters << " after " << warmup << " warm-up\n"
      << "efficiency: the one-shot kernel's time over the ring's (the ranks share this GPU: 1 means splitting the "
         "sequence costs nothing)\nimbalance: the model's, max over ranks of their FLOPs / mean\n\n";
  std::vector<std::string> header = {"N", "layout", "fwd ms", "fwd TFLOP/s", "fwd efficiency"};
  if (backward) header.insert(header.end(), {"bwd ms", "bwd TFLOP/s", "bwd efficiency"});
  header.insert(header.end(), {"imbalance", "peak memory"});
  Table table(header);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  const RingRow* one_shot = nullptr;
  for (const RingRow& r : rows) {
    if (r.layout == "one-shot") one_shot = &r;
    const bool shot_ok = one_shot != nullptr && one_shot->status == "ok" && one_shot->seq == r.seq;
    Shape s = base.shape;
    s.seq_q = s.seq_k = r.seq;
    nlohmann::ordered_json j{{"seq", r.seq}, {"layout", r.layout}, {"ranks", r.layout == "one-shot" ? 1 : ring},
                             {"status", r.status}};
    std::vector<std::string> cells = {std::to_string(r.seq), r.layout};
    if (r.status != "ok") {
      j["reason"] = r.reason;
      cells.push_back(r.status + ": " + r.reason);
      table.add(cells);
      list.push_back(j);
      continue;
    }
    // A pass's cells and fields: time, TFLOP/s, and the one-shot time over this row's.
    const auto add_pass = [&](const std::string& pass, double ms, double one_shot_ms, double flops) {
      const double rate = tflops(flops, ms), efficiency = shot_ok ? one_shot_ms / ms : -1;
      cells.insert(cells.end(), {format_fixed(ms, 3), format_fixed(rate, 1), format_fixed(efficiency, 3)});
      j[pass + "_ms"] = ms;
      j[pass + "_tflops"] = rate;
      j[pass + "_efficiency"] = efficiency;
    };
    add_pass("forward", r.result.forward_ms, shot_ok ? one_shot->result.forward_ms : -1,
             forward_flops(s, base.options.causal));
    if (backward)
      add_pass("backward", r.result.backward_ms, shot_ok ? one_shot->result.backward_ms : -1,
               backward_flops(s, base.options.causal));
    cells.insert(cells.end(), {format_fixed(r.imbalance, 3), format_bytes(double(r.result.peak_bytes))});
    j["imbalance_model"] = r.imbalance;
    j["peak_bytes"] = r.result.peak_bytes;
    table.add(cells);
    list.push_back(j);
  }
  table.print(out);

  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["device"] = device_name;
    j["device_kind"] = "cuda";
    j["command"] = command_line;
    j["date"] = started;
    j["settings"] = {{"ring_ranks", ring},
                     {"transport", "one GPU: ranks as streams, hops as device-to-device copies"},
                     {"block_kernel", blocks},
                     {"batch", base.shape.batch},
                     {"heads", base.shape.heads_q},
                     {"head_dim", head_dim},
                     {"causal", to_string(base.options.causal)},
                     {"dtype", to_string(dt)},
                     {"backward", backward},
                     {"warmup", warmup},
                     {"iters", iters}};
    j["notes"] = "times: CUDA events around whole passes, median. efficiency: the one-shot kernel's time over the "
                 "ring's at the same N (the ranks share one GPU). imbalance_model: model/ring.hpp's, max over ranks of "
                 "their forward FLOPs / mean";
    j["rows"] = list;
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) throw InputError("cannot write the JSON results to '" + json_path + "'");
    out << "\nwrote " << json_path << "\n";
  }
  return kExitOk;
}

}  // namespace flashlab::cli
