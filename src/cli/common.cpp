#include "cli/common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>

namespace flashlab::cli {

void ShapeFlags::add_to(CLI::App& app) {
  app.add_option("--batch", batch, "batch size B")->capture_default_str();
  app.add_option("--heads", heads, "query heads H_q")->capture_default_str();
  app.add_option("--heads-kv", heads_kv, "key/value heads H_kv; H_q must be a multiple (default: H_q)");
  app.add_option("--seq-q", seq_q, "query sequence length S_q")->capture_default_str();
  app.add_option("--seq-k", seq_k, "key sequence length S_k (default: S_q)");
  app.add_option("--head-dim", head_dim, "head dimension d")->capture_default_str();
}

Shape ShapeFlags::shape() const {
  Shape s;
  s.batch = batch;
  s.heads_q = heads;
  s.heads_kv = heads_kv != 0 ? heads_kv : heads;
  s.seq_q = seq_q;
  s.seq_k = seq_k != 0 ? seq_k : seq_q;
  s.head_dim = head_dim;
  return s;
}

void OptionFlags::add_to(CLI::App& app, const std::string& seed_help) {
  app.add_option("--causal", causal,
                 "causal mask: none, top-left (PyTorch is_causal) or bottom-right (FlashAttention >= 2.1)")
      ->capture_default_str();
  app.add_option("--scale", scale, "softmax scale (default: 1/sqrt(head_dim))");
  app.add_option("--dropout", dropout, "dropout probability p in [0, 1)")->capture_default_str();
  seed_option = app.add_option("--seed", seed, seed_help);
  app.add_flag("--deterministic", deterministic,
               "backward: sum dQ's partial sums in a fixed order, so that repeated runs give bit-identical gradients");
}

Options OptionFlags::options(std::uint64_t fallback_seed) const {
  Options o;
  o.causal = parse_causal(causal);
  o.scale = scale;
  o.dropout_p = dropout;
  o.seed = seed_given() ? seed : fallback_seed;
  o.deterministic = deterministic;
  return o;
}

std::uint64_t fresh_seed() {
  std::random_device rd;
  // Keep it short enough to type back in with --seed.
  return ((std::uint64_t(rd()) << 32) | rd()) % 1000000000ull;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

std::vector<int> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int> values;
  for (const std::string& item : split_list(text)) {
    std::size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1 || v > (1 << 30))
      throw InputError(flag + " takes a comma-separated list of positive integers, and '" + item + "' is not one");
    values.push_back(static_cast<int>(v));
  }
  if (values.empty()) throw InputError(flag + " needs at least one value, e.g. " + flag + " 256,512");
  return values;
}

std::vector<const Variant*> named_variants(const std::string& list) {
  std::vector<const Variant*> out;
  for (const std::string& name : split_list(list)) {
    const Variant* v = &find_variant(name);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  if (out.empty()) throw InputError("--variants needs at least one variant name, e.g. --variants cpu-naive,cpu-fa2");
  return out;
}

std::int64_t warn_non_finite(std::ostream& err, const HostTensor& t, const std::string& name,
                             const std::string& consequence) {
  const NonFinite found = first_non_finite(t);
  if (found.count == 0) return 0;
  std::vector<std::string> index;
  for (std::int64_t i : found.first) index.push_back(std::to_string(i));
  err << "warning: " << name << " holds " << found.count << " non-finite value" << (found.count == 1 ? "" : "s")
      << " (NaN or \u00b1Inf), the first at (" << join(index, ", ") << "); " << consequence << "\n";
  return found.count;
}

std::string format_fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

std::string format_sci(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return "0";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", x);
  return buf;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (std::size_t n = 0; n < items.size(); ++n) out += (n ? sep : "") + items[n];
  return out;
}

std::string describe(const Shape& s) {
  std::ostringstream os;
  os << "batch " << s.batch << ", heads " << s.heads_q << " (kv " << s.heads_kv << "), seq_q " << s.seq_q << ", seq_k "
     << s.seq_k << ", head_dim " << s.head_dim;
  return os.str();
}

void Table::print(std::ostream& os) const {
  std::vector<std::size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    // The last cell of a row may be a long sentence (a SKIP reason): it does not widen the column.
    for (std::size_t c = 0; c + 1 < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  measure(header_);
  for (const auto& row : rows_) measure(row);
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size() && c < width.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << "\n";
  };
  print_row(header_);
  std::size_t rule = 0;
  for (std::size_t c = 0; c < header_.size(); ++c) rule += (c + 1 < header_.size() ? width[c] + 2 : header_[c].size());
  os << std::string(rule, '-') << "\n";
  for (const auto& row : rows_) print_row(row);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : -1; }

// One line, redrawn with \r; the label is padded so a shorter one fully covers a longer one.
void progress(std::ostream& err, int done, int total, const std::string& what) {
  constexpr int kWidth = 30, kLabelWidth = 32;
  const int filled = total ? done * kWidth / total : kWidth;
  std::string label = what;
  if (label.size() < kLabelWidth) label.append(kLabelWidth - label.size(), ' ');
  err << "\rbench [" << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] " << done << "/" << total
      << " " << label << std::flush;
}

}  // namespace flashlab::cli
