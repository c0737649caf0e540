// flashlab trace: where the bytes go. Walks an algorithm's loop nest in count-only mode (the same loop
// nest that computes the numbers, cpu_reference/tiled.hpp) and sums its HBM <-> SRAM transfers per
// tensor, beside the paper's asymptotic formula (Theorem 2: standard attention Theta(N d + N^2) HBM
// accesses, FlashAttention Theta(N^2 d^2 / M)).
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cpu_reference/tiled.hpp"
#include "model/gpu.hpp"
#include "model/ring.hpp"
#include "model/ring_measured.hpp"
#include "model/timeline.hpp"
#include "model/traffic.hpp"
#include "registry/gpu_models.hpp"

namespace flashlab::cli {
namespace {

// --events prints one line per event: beyond this it is no longer something to read.
constexpr std::int64_t kMaxPrintedEvents = 100000;
// The ring's schedule holds P^2 steps of ranks; its table lists every rank's numbers up to this many.
constexpr int kMaxRingRanks = 1024;
constexpr int kMaxListedRanks = 8;

int ceil_div(int a, int b) { return (a + b - 1) / b; }

const char* to_string(Direction d) {
  switch (d) {
    case Direction::Load: return "load";
    case Direction::Store: return "store";
    case Direction::Free: return "free";
    case Direction::Compute: return "compute";
  }
  return "?";
}

// Prints the event stream as CSV.
class CsvEvents : public TrafficObserver {
 public:
  explicit CsvEvents(std::ostream& os) : os_(os) {
    os_ << "index,pass,bh,tensor,direction,tile_row,tile_col,rows,cols,bytes,i,j,line,sram_bytes\n";
  }
  void on_event(const TileEvent& e) override {
    os_ << e.index << ',' << (e.pass == Pass::Forward ? "forward" : "backward") << ',' << e.bh << ','
        << flashlab::to_string(e.tensor) << ',' << to_string(e.direction) << ',' << e.tile_row << ',' << e.tile_col
        << ',' << e.rows << ',' << e.cols << ',' << e.bytes << ',' << e.i << ',' << e.j << ',' << e.line << ','
        << e.sram_bytes << '\n';
  }

 private:
  std::ostream& os_;
};

// The paper's closed form, constants dropped, in bytes: standard (S_q + S_k) d + S_q S_k elements,
// FlashAttention S_q S_k d^2 / M elements, M the SRAM size in elements; per (batch, head).
double closed_form_bytes(Algorithm a, const Shape& s, std::int64_t sram_bytes, int bytes_per_element) {
  const double d = s.head_dim, sq = s.seq_q, sk = s.seq_k;
  const double m_elements = double(sram_bytes) / bytes_per_element;
  const double elements = a == Algorithm::Standard ? (sq + sk) * d + sq * sk : sq * sk * d * d / m_elements;
  return elements * bytes_per_element * s.batch * s.heads_q;
}

// "0.5, 1, 1, 1" (each value / unit, 3 significant digits), or "0.5 .. 1 (mean 0.875)" past kMaxListedRanks.
template <class T>
std::string per_rank(const std::vector<T>& values, double unit) {
  auto num = [unit](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x / unit);
    return std::string(buf);
  };
  if (values.size() <= std::size_t(kMaxListedRanks)) {
    std::string s;
    for (const T& v : values) s += (s.empty() ? "" : ", ") + num(double(v));
    return s;
  }
  double lo = double(values[0]), hi = lo, sum = 0;
  for (const T& v : values) lo = std::min(lo, double(v)), hi = std::max(hi, double(v)), sum += double(v);
  return num(lo) + " .. " + num(hi) + " (mean " + num(sum / double(values.size())) + ")";
}

}  // namespace

void TraceCommand::add_to(CLI::App& app) {
  two_level_flags.push_back(app.add_option("--algorithm", algorithm, "standard, fa1 or fa2")->capture_default_str());
  not_ring_flags.push_back(two_level_flags.back());
  problem_flags.push_back(app.add_option("--batch", batch, "batch size B")->capture_default_str());
  problem_flags.push_back(
      app.add_option("--heads", heads, "heads H (traffic is per head, times B * H)")->capture_default_str());
  problem_flags.push_back(app.add_option("--seq-q", seq_q, "query sequence length N")->capture_default_str());
  problem_flags.push_back(app.add_option("--seq-k", seq_k, "key sequence length (default: seq-q)"));
  problem_flags.push_back(app.add_option("--head-dim", head_dim, "head dimension d")->capture_default_str());
  sram_option = app.add_option("--sram-bytes", sram_bytes,
                               "on-chip SRAM size M in bytes (blocks: Bc = ceil(M/4d), Br = min(Bc, d)); required "
                               "without --variant");
  two_level_flags.push_back(sram_option);
  not_ring_flags.push_back(sram_option);
  problem_flags.push_back(app.add_option("--causal", causal, "none, top-left or bottom-right")->capture_default_str());
  two_level_flags.push_back(app.add_option("--bytes-per-element", bytes_per_element, "bytes per element moved (2: fp16/bf16)")
                                ->capture_default_str());
  problem_flags.push_back(two_level_flags.back());
  two_level_flags.push_back(app.add_flag("--backward", backward, "trace the backward pass instead of the forward"));
  problem_flags.push_back(two_level_flags.back());
  app.add_flag("--json", json, "print the totals as JSON");
  two_level_flags.push_back(app.add_flag("--events", events, "print every event as CSV (small sizes only)"));
  not_ring_flags.push_back(two_level_flags.back());
  not_ring_flags.push_back(app.add_option(
      "--variant", variant,
      "a CUDA variant (" + join(gpu_modeled_variants(), ", ") +
          "): its forward kernels on --gpu, with their own tiling and grid; prints the paper's two-level "
          "count, the L2 model's DRAM traffic and the compulsory traffic side by side"));
  not_ring_flags.push_back(
      app.add_option("--gpu", gpu, "the GPU for --variant: " + known_gpu_ids() + " (SMs, L2 size)"));
  ring_option = app.add_option("--ring", ring,
                               "ring attention over P ranks (sequence parallelism): the schedule step by step, with "
                               "bytes per link, work and idle time per rank and the imbalance; --bytes-per-element "
                               "sizes K and V, --backward traces the backward pass");
  ring_flags.push_back(
      app.add_option("--layout", layout, "--ring: contiguous, zigzag or striped")->capture_default_str());
  problem_flags.push_back(ring_flags.back());
  ring_flags.push_back(app.add_option("--heads-kv", heads_kv, "--ring: key/value heads (GQA; default: --heads)"));
  problem_flags.push_back(ring_flags.back());
  ring_flags.push_back(
      app.add_option("--tflops", tflops, "--ring: the attention rate one rank sustains, TFLOP/s (an assumption)")
          ->capture_default_str());
  ring_flags.push_back(
      app.add_option("--link-gbs", link_gbs, "--ring: one direction of the link to the next rank, GB/s (an assumption)")
          ->capture_default_str());
  ring_flags.push_back(app.add_option(
      "--from-timeline", from_timeline,
      "--ring: a measured ring timeline (Trace Event JSON, e.g. bench/results/<device>-ring-timeline-*.json): its "
      "problem, its measured compute rate and link bandwidth; prints the model's step times on those rates (and on "
      "--tflops / --link-gbs) beside the measured ones"));
}

int TraceCommand::run(std::ostream& out, std::ostream& /*err*/) const {
  if (ring_option->count() > 0) return run_ring(out);
  for (const CLI::Option* flag : ring_flags)
    if (flag->count() > 0)
      throw InputError(flag->get_name() + " belongs to the ring's trace: give the number of ranks with --ring P");
  if (!variant.empty() || !gpu.empty()) return run_gpu(out);
  if (sram_option->count() == 0)
    throw InputError("--sram-bytes is required: the SRAM size M sets the paper's tiling (or model a CUDA variant's "
                     "kernels with --variant and --gpu)");
  const Algorithm alg = parse_algorithm(algorithm);
  Problem p;
  p.shape = Shape{batch, heads, heads, seq_q, seq_k != 0 ? seq_k : seq_q, head_dim};
  p.options.causal = parse_causal(causal);
  validate(p);
  if (bytes_per_element != 2 && bytes_per_element != 4 && bytes_per_element != 8)
    throw InputError("--bytes-per-element must be 2 (fp16/bf16), 4 (fp32) or 8 (fp64), got " +
                     std::to_string(bytes_per_element));
  if (sram_bytes < 1) throw InputError("--sram-bytes must be positive, got " + std::to_string(sram_bytes));
  const Tiling tiling = tiling_from_sram(sram_bytes, head_dim, bytes_per_element);
  const Pass pass = backward ? Pass::Backward : Pass::Forward;

  TrafficCounter counter;
  count_traffic(alg, pass, p, tiling, bytes_per_element, counter);
  const TrafficTotals& t = counter.totals();
  if (events) {
    if (t.events > kMaxPrintedEvents)
      throw InputError("--events would print " + std::to_string(t.events) + " events, more than the " +
                       std::to_string(kMaxPrintedEvents) +
                       " it prints: use a shorter --seq-q/--seq-k or a larger --sram-bytes");
    CsvEvents csv(out);
    count_traffic(alg, pass, p, tiling, bytes_per_element, csv);
    return kExitOk;
  }

  const int Tr = ceil_div(p.shape.seq_q, tiling.Br), Tc = ceil_div(p.shape.seq_k, tiling.Bc);
  const bool over = t.peak_sram_bytes > sram_bytes;
  const double formula = closed_form_bytes(alg, p.shape, sram_bytes, bytes_per_element);
  const char* formula_name = alg == Algorithm::Standard ? "Theta(N d + N^2)" : "Theta(N^2 d^2 / M)";

  if (json) {
    nlohmann::ordered_json j;
    j["algorithm"] = flashlab::to_string(alg);
    j["pass"] = backward ? "backward" : "forward";
    j["shape"] = {
        {"batch", batch}, {"heads", heads}, {"seq_q", p.shape.seq_q}, {"seq_k", p.shape.seq_k}, {"head_dim", head_dim}};
    j["causal"] = flashlab::to_string(p.options.causal);
    j["sram_bytes"] = sram_bytes;
    j["bytes_per_element"] = bytes_per_element;
    j["tiling"] = {{"Br", tiling.Br}, {"Bc", tiling.Bc}, {"Tr", Tr}, {"Tc", Tc}};
    nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
    for (int n = 0; n < int(TensorId::Count); ++n)
      if (t.read[n] || t.written[n])
        tensors[flashlab::to_string(TensorId(n))] = {{"read", t.read[n]}, {"written", t.written[n]}};
    j["tensors"] = tensors;
    j["total_read"] = t.total_read();
    j["total_written"] = t.total_written();
    j["total"] = t.total();
    j["events"] = t.events;
    j["peak_sram_bytes"] = t.peak_sram_bytes;
    j["sram_over"] = over;
    j["asymptotic_formula"] = {{"formula", formula_name},
                               {"bytes", formula},
                               {"note", "the paper's asymptotic formula with constants dropped, for comparison only"}};
    out << j.dump(2) << "\n";
    return kExitOk;
  }

  out << "trace: " << flashlab::to_string(alg) << " " << (backward ? "backward" : "forward") << ", "
      << describe(p.shape) << ", causal " << flashlab::to_string(p.options.causal) << "\n";
  out << "SRAM M = " << sram_bytes << " bytes (" << sram_bytes / bytes_per_element << " elements of "
      << bytes_per_element << " bytes): Br = " << tiling.Br << ", Bc = " << tiling.Bc << ", Tr = " << Tr
      << ", Tc = " << Tc << "\n\n";
  Table table({"tensor", "read", "written", "total"});
  for (int n = 0; n < int(TensorId::Count); ++n)
    if (t.read[n] || t.written[n])
      table.add({flashlab::to_string(TensorId(n)), format_bytes(double(t.read[n])), format_bytes(double(t.written[n])),
                 format_bytes(double(t.read[n] + t.written[n]))});
  table.add({"all", format_bytes(double(t.total_read())), format_bytes(double(t.total_written())),
             format_bytes(double(t.total()))});
  table.print(out);
  out << "\nHBM traffic: " << format_bytes(double(t.total())) << " (" << t.total() << " bytes, " << t.events
      << " events)\n";
  out << "peak SRAM: " << format_bytes(double(t.peak_sram_bytes)) << " of M = " << format_bytes(double(sram_bytes))
      << (over ? "  OVER M: these tiles do not fit the SRAM given" : "") << "\n";
  out << "paper's asymptotic formula " << formula_name
      << ", constants dropped (for comparison, not a count): " << format_bytes(formula) << "\n";
  return kExitOk;
}

// --variant V --gpu G: the kernels of one forward pass of V, replayed at three levels.
int TraceCommand::run_gpu(std::ostream& out) const {
  if (variant.empty()) throw InputError("--gpu models a CUDA variant's kernels: name one with --variant (" +
                                        join(gpu_modeled_variants(), ", ") + ")");
  if (gpu.empty()) throw InputError("--variant models its kernels on a GPU: name it with --gpu (" + known_gpu_ids() + ")");
  for (const CLI::Option* flag : two_level_flags)
    if (flag->count() > 0)
      throw InputError(flag->get_name() + " belongs to the paper's two-level trace; with --variant the kernel's own "
                       "tiling and dtype are used (forward pass only)");
  const GpuSpec& g = find_gpu(gpu);
  Problem p;
  p.shape = Shape{batch, heads, heads, seq_q, seq_k != 0 ? seq_k : seq_q, head_dim};
  p.options.causal = parse_causal(causal);
  validate(p);
  const GpuForwardPass pass = gpu_forward_pass(variant, p, g);
  const GpuTraffic t = model_gpu_traffic(g, p.shape, pass.kernels);
  const TrafficTotals &two = t.two_level, &dram = t.dram, &floor = t.compulsory;
  auto ratio = [](std::int64_t a, std::int64_t b) { return b > 0 ? double(a) / double(b) : 0.0; };

  if (json) {
    nlohmann::ordered_json j;
    j["variant"] = variant;
    j["pass"] = "forward";
    j["gpu"] = {{"id", std::string(g.id)},
                {"device_name", std::string(g.device_name)},
                {"sms", g.sms},
                {"l2_bytes", g.l2_bytes},
                {"l2_partitions", g.l2_partitions},
                {"partition_bytes", g.partition_bytes()}};
    j["shape"] = {{"batch", batch}, {"heads", heads}, {"seq_q", p.shape.seq_q}, {"seq_k", p.shape.seq_k}, {"head_dim", head_dim}};
    j["causal"] = flashlab::to_string(p.options.causal);
    j["dtype"] = flashlab::to_string(pass.dtype);
    j["tiling"] = {{"Br", pass.tiling.Br}, {"Bc", pass.tiling.Bc}, {"note", pass.tiling_note}};
    nlohmann::ordered_json kernels = nlohmann::ordered_json::array();
    for (const KernelTraffic& k : t.kernels)
      kernels.push_back({{"name", k.name},
                         {"units", k.units},
                         {"resident", k.resident},
                         {"rounds", k.rounds},
                         {"accesses", k.accesses},
                         {"dram_read", k.dram.total_read()},
                         {"dram_written", k.dram.total_written()},
                         {"dirty_at_end", k.dirty_at_end}});
    j["kernels"] = kernels;
    nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
    for (int n = 0; n < int(TensorId::Count); ++n)
      if (two.read[n] || two.written[n])
        tensors[flashlab::to_string(TensorId(n))] = {
            {"two_level", {{"read", two.read[n]}, {"written", two.written[n]}}},
            {"l2_model", {{"read", dram.read[n]}, {"written", dram.written[n]}}},
            {"compulsory", {{"read", floor.read[n]}, {"written", floor.written[n]}}}};
    j["tensors"] = tensors;
    auto level = [](const TrafficTotals& x) {
      return nlohmann::ordered_json{{"read", x.total_read()}, {"written", x.total_written()}, {"total", x.total()}};
    };
    j["two_level"] = level(two);
    j["l2_model"] = level(dram);
    j["l2_model"]["dirty_at_end"] = t.dirty_at_end;
    j["l2_model"]["hit_bytes"] = t.hit_bytes;
    j["compulsory"] = level(floor);
    out << j.dump(2) << "\n";
    return kExitOk;
  }

  out << "trace: " << variant << " forward on the " << g.device_name << " (" << g.id << "), " << describe(p.shape)
      << ", causal " << flashlab::to_string(p.options.causal) << ", " << flashlab::to_string(pass.dtype) << "\n";
  out << "GPU: " << g.sms << " SMs, L2 " << format_bytes(double(g.l2_bytes)) << " in " << g.l2_partitions
      << " partitions of " << format_bytes(double(g.partition_bytes()))
      << ", each a cache of " << g.l2_ways << "-way sets holding what the SMs on its side access (a miss there is "
         "served by the other when it holds the tile); a written line enters its set "
      << g.l2_ways * g.l2_store_age << " lines below the newest, on average\n";
  out << "kernel tiling: " << pass.tiling_note << "\n";
  for (const KernelTraffic& k : t.kernels)
    out << "  " << k.name << ": " << k.units << " units, " << k.resident << " resident, " << k.rounds
        << " lock-step rounds\n";
  out << "\n";
  Table table({"tensor", "two-level read", "written", "L2 model: DRAM read", "written", "compulsory read", "written"});
  auto cells = [](const std::string& name, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d,
                  std::int64_t e, std::int64_t f) {
    return std::vector<std::string>{name,
                                    format_bytes(double(a)),
                                    format_bytes(double(b)),
                                    format_bytes(double(c)),
                                    format_bytes(double(d)),
                                    format_bytes(double(e)),
                                    format_bytes(double(f))};
  };
  for (int n = 0; n < int(TensorId::Count); ++n)
    if (two.read[n] || two.written[n])
      table.add(cells(flashlab::to_string(TensorId(n)), two.read[n], two.written[n], dram.read[n], dram.written[n],
                      floor.read[n], floor.written[n]));
  table.add(cells("all", two.total_read(), two.total_written(), dram.total_read(), dram.total_written(),
                  floor.total_read(), floor.total_written()));
  table.print(out);
  char buf[200];
  std::snprintf(buf, sizeof buf, " (%.2fx the compulsory %s); the paper's two-level count: %s (%.1fx the L2 model)",
                ratio(dram.total_read(), floor.total_read()), format_bytes(double(floor.total_read())).c_str(),
                format_bytes(double(two.total_read())).c_str(), ratio(two.total_read(), dram.total_read()));
  out << "\nDRAM reads, L2 model: " << format_bytes(double(dram.total_read())) << buf << "\n";
  out << "still dirty in L2 when the kernels ended: " << format_bytes(double(t.dirty_at_end))
      << " (written back later; Nsight Compute's window of one kernel does not count them)\n";
  return kExitOk;
}

// --ring P: the ring's schedule (model/ring.hpp) costed step by step.
int TraceCommand::run_ring(std::ostream& out) const {
  for (const CLI::Option* flag : not_ring_flags)
    if (flag->count() > 0)
      throw InputError(flag->get_name() + " does not apply to --ring, which traces the ring's schedule (its flags: "
                       "--layout, --heads-kv, --tflops, --link-gbs, --bytes-per-element, --backward, --from-timeline, --json)");
  if (ring > kMaxRingRanks)
    throw InputError("--ring " + std::to_string(ring) + " is more ranks than the trace lists: it takes 1 to " +
                     std::to_string(kMaxRingRanks));
  if (!from_timeline.empty()) return run_ring_timeline(out);
  const RingLayout ring_layout = parse_ring_layout(layout);
  Problem p;
  p.shape = Shape{batch, heads, heads_kv != 0 ? heads_kv : heads, seq_q, seq_k != 0 ? seq_k : seq_q, head_dim};
  p.options.causal = parse_causal(causal);
  validate(p);
  if (bytes_per_element != 2 && bytes_per_element != 4 && bytes_per_element != 8)
    throw InputError("--bytes-per-element must be 2 (fp16/bf16), 4 (fp32) or 8 (fp64), got " +
                     std::to_string(bytes_per_element));
  if (!(tflops > 0) || !(link_gbs > 0))
    throw InputError("--tflops and --link-gbs must be positive rates");
  const RingSchedule schedule = ring_schedule(ring_layout, ring, p.shape.seq_q, p.shape.seq_k, p.options.causal);
  const RingMachine machine{.flops_per_second = tflops * 1e12,
                            .link_bytes_per_second = link_gbs * 1e9,
                            .kv_bytes_per_element = bytes_per_element,
                            .grad_bytes_per_element = 4};
  const Pass pass = backward ? Pass::Backward : Pass::Forward;
  const RingCost cost = ring_cost(schedule, p.shape, pass, machine);

  if (json) {
    nlohmann::ordered_json j;
    j["ring"] = {{"ranks", ring}, {"layout", to_string(ring_layout)}};
    j["pass"] = backward ? "backward" : "forward";
    j["shape"] = {{"batch", batch},
                  {"heads", heads},
                  {"heads_kv", p.shape.heads_kv},
                  {"seq_q", p.shape.seq_q},
                  {"seq_k", p.shape.seq_k},
                  {"head_dim", head_dim}};
    j["causal"] = flashlab::to_string(p.options.causal);
    j["machine"] = {{"flops_per_second", machine.flops_per_second},
                    {"link_bytes_per_second", machine.link_bytes_per_second},
                    {"kv_bytes_per_element", machine.kv_bytes_per_element},
                    {"grad_bytes_per_element", machine.grad_bytes_per_element}};
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (std::size_t s = 0; s < cost.steps.size(); ++s) {
      const RingStepCost& st = cost.steps[s];
      steps.push_back({{"step", s},
                       {"link_bytes", st.link_bytes},
                       {"flops", st.flops},
                       {"idle_seconds", st.idle_seconds},
                       {"seconds", st.seconds},
                       {"imbalance", st.imbalance}});
    }
    j["steps"] = steps;
    j["flops_per_rank"] = cost.flops_per_rank;
    j["total_flops"] = cost.total_flops;
    j["total_link_bytes"] = cost.total_link_bytes;
    j["seconds"] = cost.seconds;
    j["imbalance"] = cost.imbalance;
    out << j.dump(2) << "\n";
    return kExitOk;
  }

  out << "trace: ring attention over " << ring << (ring == 1 ? " rank" : " ranks") << ", " << to_string(ring_layout)
      << " layout, " << (backward ? "backward" : "forward") << ", " << describe(p.shape) << ", causal "
      << flashlab::to_string(p.options.causal) << "\n";
  out << "assumed rates: " << tflops << " TFLOP/s per rank (--tflops), " << link_gbs
      << " GB/s on each link to the next rank (--link-gbs); K and V " << bytes_per_element
      << " bytes per element" << (backward ? ", dK/dV partials 4 (fp32)" : "") << "\n";
  out << "each step, every rank computes on the K/V share in hand while it sends that share on"
      << (backward ? " with its dK/dV partials (the last hop takes them home)" : " (the last step sends nothing)")
      << "; a step lasts as long as its slowest compute or link\n\n";
  const double gflop = 1e9, us = 1e-6;
  Table table({"step", "bytes per link", "work per rank (GFLOP)", "idle per rank (us)", "step time (us)", "imbalance"});
  for (std::size_t s = 0; s < cost.steps.size(); ++s) {
    const RingStepCost& st = cost.steps[s];
    const std::int64_t max_link = *std::max_element(st.link_bytes.begin(), st.link_bytes.end());
    table.add({std::to_string(s), format_bytes(double(max_link)), per_rank(st.flops, gflop),
               per_rank(st.idle_seconds, us), format_fixed(st.seconds / us, 3), format_fixed(st.imbalance, 3)});
  }
  std::vector<double> idle_total(ring, 0.0);
  for (const RingStepCost& st : cost.steps)
    for (int r = 0; r < ring; ++r) idle_total[r] += st.idle_seconds[r];
  table.add({"all", format_bytes(double(cost.total_link_bytes)) + " in all", per_rank(cost.flops_per_rank, gflop),
             per_rank(idle_total, us), format_fixed(cost.seconds / us, 3), format_fixed(cost.imbalance, 3)});
  table.print(out);
  out << "\nimbalance = max work / mean work over the ranks; \"bytes per link\" is the most any one link carries in "
         "the step\n";
  out << "total work " << format_fixed(cost.total_flops / gflop, 3)
      << " GFLOP (what one device computes for the scores the mask leaves); ring time "
      << format_fixed(cost.seconds / us, 3)
      << " us\n";
  return kExitOk;
}

// --ring P --from-timeline FILE: a measured ring timeline (model/ring_measured.hpp) beside the model of its problem,
// on the model's assumed rates and on the rates the timeline implies.
int TraceCommand::run_ring_timeline(std::ostream& out) const {
  for (const CLI::Option* flag : problem_flags)
    if (flag->count() > 0)
      throw InputError(flag->get_name() + " does not apply with --from-timeline: the timeline's info fixes the "
                       "problem (ranks, layout, shape, mask, pass, dtype)");
  const Timeline t = read_trace_event_file(from_timeline);
  const RingMeasurement m = measure_ring(t, "timeline " + from_timeline);
  const RingRun& run = m.run;
  if (ring != run.ranks)
    throw InputError("--ring " + std::to_string(ring) + " does not match the timeline, a ring of " +
                     std::to_string(run.ranks) + " ranks (give --ring " + std::to_string(run.ranks) + ")");
  if (!(tflops > 0) || !(link_gbs > 0)) throw InputError("--tflops and --link-gbs must be positive rates");
  const RingMachine assumed = model_machine(run, {.flops_per_second = tflops * 1e12, .link_bytes_per_second = link_gbs * 1e9});
  const RingMachine measured = measured_machine(m, assumed);
  const RingCost model = model_cost(m, assumed), replay = model_cost(m, measured);
  const bool backward_pass = run.pass == Pass::Backward;
  const auto error = [](double model_s, double measured_s) { return measured_s > 0 ? model_s / measured_s - 1 : 0.0; };

  if (json) {
    nlohmann::ordered_json j;
    j["timeline"] = from_timeline;
    j["device"] = t.device;
    j["label"] = t.label;
    j["ring"] = {{"ranks", run.ranks}, {"layout", to_string(run.layout)}};
    j["pass"] = backward_pass ? "backward" : "forward";
    j["shape"] = {{"batch", run.shape.batch},       {"heads", run.shape.heads_q}, {"heads_kv", run.shape.heads_kv},
                  {"seq_q", run.shape.seq_q},       {"seq_k", run.shape.seq_k},   {"head_dim", run.shape.head_dim}};
    j["causal"] = flashlab::to_string(run.causal);
    j["dtype"] = flashlab::to_string(run.dtype);
    j["block_kernel"] = run.block_kernel;
    j["measured_rates"] = {{"flops_per_second", m.flops_per_second},
                           {"median_link_bytes_per_second", m.median_bytes_per_second.value_or(0)},
                           {"best_link_bytes_per_second", m.best_bytes_per_second.value_or(0)},
                           {"transfers", m.transfers.size()}};
    j["assumed_rates"] = {{"flops_per_second", assumed.flops_per_second},
                          {"link_bytes_per_second", assumed.link_bytes_per_second}};
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (int s = 0; s < run.ranks; ++s) {
      const MeasuredStep& ms = m.steps[std::size_t(s)];
      nlohmann::ordered_json row = {{"step", s},
                                    {"model_seconds", model.steps[std::size_t(s)].seconds},
                                    {"model_measured_rates_seconds", replay.steps[std::size_t(s)].seconds},
                                    {"measured_seconds", ms.seconds()},
                                    {"error", error(replay.steps[std::size_t(s)].seconds, ms.seconds())},
                                    {"slowest_rank", ms.slowest_rank},
                                    {"slowest_compute_seconds", ms.slowest_compute_seconds}};
      row["hidden_fraction"] = ms.hidden_fraction ? nlohmann::ordered_json(*ms.hidden_fraction) : nlohmann::ordered_json();
      steps.push_back(row);
    }
    j["steps"] = steps;
    j["model_seconds"] = model.seconds;
    j["model_measured_rates_seconds"] = replay.seconds;
    j["measured_seconds"] = m.seconds;
    j["error"] = error(replay.seconds, m.seconds);
    j["hidden_fraction"] = m.hidden_fraction ? nlohmann::ordered_json(*m.hidden_fraction) : nlohmann::ordered_json();
    out << j.dump(2) << "\n";
    return kExitOk;
  }

  const double us = 1e-6;
  const auto pct = [](double f) { return format_fixed(100 * f, 0) + "%"; };
  const auto signed_pct = [](double f) { return (f >= 0 ? "+" : "") + format_fixed(100 * f, 1) + "%"; };
  out << "trace: ring attention over " << run.ranks << (run.ranks == 1 ? " rank" : " ranks") << " from the timeline "
      << from_timeline << "\n";
  out << "run: " << (t.label.empty() ? "(no label)" : t.label) << " on " << (t.device.empty() ? "(no device)" : t.device)
      << "\n";
  out << "problem: " << to_string(run.layout) << " layout, " << (backward_pass ? "backward" : "forward") << ", "
      << describe(run.shape) << ", causal " << flashlab::to_string(run.causal) << ", " << flashlab::to_string(run.dtype)
      << ", " << run.block_kernel << " blocks\n";
  out << "measured rates: " << format_fixed(m.flops_per_second / 1e12, 1)
      << " TFLOP/s per rank (the schedule's FLOPs / the ranks' compute time); link ";
  if (m.median_bytes_per_second)
    out << format_fixed(*m.median_bytes_per_second / 1e9, 1) << " GB/s median, "
        << format_fixed(*m.best_bytes_per_second / 1e9, 1) << " GB/s best over " << m.transfers.size()
        << " transfers (bytes / span; a span includes waiting for the peer)\n";
  else
    out << "not measured (one rank has none): the assumed " << link_gbs << " GB/s\n";
  out << "assumed rates: " << tflops << " TFLOP/s per rank (--tflops), " << link_gbs << " GB/s per link (--link-gbs)\n";
  out << "a measured step runs from the first rank's start of its work to the first start of the next step's (the last "
         "step to the run's end), so it holds the waits for the slowest rank and for the hop it sends, as the model's "
         "step does; hidden = the part of each transfer during which its rank's compute stream was busy\n\n";
  Table table({"step", "model, assumed (us)", "model, measured rates (us)", "measured (us)", "error",
               "slowest compute (us, rank)", "hidden"});
  for (int s = 0; s < run.ranks; ++s) {
    const MeasuredStep& ms = m.steps[std::size_t(s)];
    const double replay_s = replay.steps[std::size_t(s)].seconds;
    table.add({std::to_string(s), format_fixed(model.steps[std::size_t(s)].seconds / us, 3), format_fixed(replay_s / us, 3),
               format_fixed(ms.seconds() / us, 3), signed_pct(error(replay_s, ms.seconds())),
               format_fixed(ms.slowest_compute_seconds / us, 3) + " (r" + std::to_string(ms.slowest_rank) + ")",
               ms.hidden_fraction ? pct(*ms.hidden_fraction) : "no transfer"});
  }
  table.add({"ring", format_fixed(model.seconds / us, 3), format_fixed(replay.seconds / us, 3),
             format_fixed(m.seconds / us, 3), signed_pct(error(replay.seconds, m.seconds)), "",
             m.hidden_fraction ? pct(*m.hidden_fraction) : "-"});
  table.print(out);
  out << "\nerror = model at the measured rates / measured - 1; the measured steps add up to the ring's time, from "
         "its first stamp to its last\n";
  return kExitOk;
}

}  // namespace flashlab::cli
