// flashlab trace: where the bytes go. Walks an algorithm's loop nest in count-only mode (the same loop
// nest that computes the numbers, cpu_reference/tiled.hpp) and sums its HBM <-> SRAM transfers per
// tensor, beside the paper's asymptotic formula (Theorem 2: standard attention Theta(N d + N^2) HBM
// accesses, FlashAttention Theta(N^2 d^2 / M)).
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "cpu_reference/tiled.hpp"
#include "model/traffic.hpp"

namespace flashlab::cli {
namespace {

// --events prints one line per event: beyond this it is no longer something to read.
constexpr std::int64_t kMaxPrintedEvents = 100000;

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

}  // namespace

void TraceCommand::add_to(CLI::App& app) {
  app.add_option("--algorithm", algorithm, "standard, fa1 or fa2")->capture_default_str();
  app.add_option("--batch", batch, "batch size B")->capture_default_str();
  app.add_option("--heads", heads, "heads H (traffic is per head, times B * H)")->capture_default_str();
  app.add_option("--seq-q", seq_q, "query sequence length N")->capture_default_str();
  app.add_option("--seq-k", seq_k, "key sequence length (default: seq-q)");
  app.add_option("--head-dim", head_dim, "head dimension d")->capture_default_str();
  app.add_option("--sram-bytes", sram_bytes, "on-chip SRAM size M in bytes (blocks: Bc = ceil(M/4d), Br = min(Bc, d))")
      ->required();
  app.add_option("--causal", causal, "none, top-left or bottom-right")->capture_default_str();
  app.add_option("--bytes-per-element", bytes_per_element, "bytes per element moved (2: fp16/bf16)")
      ->capture_default_str();
  app.add_flag("--backward", backward, "trace the backward pass instead of the forward");
  app.add_flag("--json", json, "print the totals as JSON");
  app.add_flag("--events", events, "print every event as CSV (small sizes only)");
}

int TraceCommand::run(std::ostream& out, std::ostream& /*err*/) const {
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

}  // namespace flashlab::cli
