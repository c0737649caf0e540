#pragma once
// What the subcommands share: the problem flags, a plain-text table, memory checks and formatting.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "registry/host_memory.hpp"  // require_memory, host_bytes_for_run, format_bytes
#include "registry/variants.hpp"

namespace flashlab::cli {

// Exit codes of every subcommand.
constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;

// --batch --heads --heads-kv --seq-q --seq-k --head-dim: 0 for heads_kv / seq_k means "same as
// heads / seq_q".
struct ShapeFlags {
  int batch = 1, heads = 2, heads_kv = 0, seq_q = 128, seq_k = 0, head_dim = 64;
  void add_to(CLI::App& app);
  Shape shape() const;
};

// --causal --scale --dropout --seed. Without --seed a fresh one is drawn (and printed by the caller).
struct OptionFlags {
  std::string causal = "none";
  double scale = 0.0;
  double dropout = 0.0;
  std::uint64_t seed = 0;
  bool deterministic = false;
  CLI::Option* seed_option = nullptr;
  void add_to(CLI::App& app, const std::string& seed_help);
  bool seed_given() const { return seed_option && seed_option->count() > 0; }
  // Throws InputError for an unknown --causal.
  Options options(std::uint64_t fresh_seed) const;
};

std::uint64_t fresh_seed();  // from std::random_device

// "a,b,,c" -> {"a", "b", "c"}
std::vector<std::string> split_list(const std::string& text);
// "256,512" -> {256, 512}; throws InputError naming `flag` for a non-integer or non-positive item.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag);

// Variants named in a comma list (each looked up: unknown names throw InputError listing the known).
std::vector<const Variant*> named_variants(const std::string& list);

// Inputs from outside (run's .npy files) may hold NaN or +-Inf. Computing goes on, as PyTorch does,
// but when `t` holds any, one sentence goes to `err`: "warning: q holds 3 non-finite values (NaN or
// ±Inf), the first at (0, 17, 1, 5); <consequence>". Returns the count.
std::int64_t warn_non_finite(std::ostream& err, const HostTensor& t, const std::string& name,
                             const std::string& consequence);

std::string utc_now();                   // "2026-11-24T09:30:00Z"
double tflops(double flops, double ms);  // flops / ms in TFLOP/s; -1 when ms <= 0 (not measured)
// A progress bar on one line of `err`, redrawn with \r: done of total, and what runs now.
void progress(std::ostream& err, int done, int total, const std::string& what);
std::string format_fixed(double x, int decimals);  // "3.142" for (3.14159, 3)
std::string format_sci(double x);        // "3.41e-07", "0", "nan", "inf"
std::string join(const std::vector<std::string>& items, const std::string& sep);
std::string describe(const Shape&);  // "batch 1, heads 2 (kv 2), seq_q 128, seq_k 128, head_dim 64"

// Left-aligned columns, two spaces apart, a header row and a rule under it.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace flashlab::cli
