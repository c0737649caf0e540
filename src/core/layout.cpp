#include "core/layout.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace flashlab {
namespace {

constexpr std::int64_t kMaxExtent = std::int64_t(1) << 30;

// (B, H, S, D) and (B, S, H, D) differ by swapping axes 1 and 2, so one swap serves both directions.
std::vector<std::int64_t> swap_seq_and_heads(std::vector<std::int64_t> dims, Layout layout) {
  if (layout == Layout::BHSD && dims.size() == kInputRank) std::swap(dims[1], dims[2]);
  return dims;
}

void check_rank_and_extents(const InputDims& t, Layout layout) {
  if (t.dims.size() != kInputRank)
    throw InputError(t.name + " has shape " + dims_string(t.dims) + " but inputs must be 4-d, in layout " +
                     axis_names(layout));
  for (std::int64_t d : t.dims)
    if (d < 1 || d > kMaxExtent)
      throw InputError(t.name + " has shape " + dims_string(t.dims) + ": every extent must be between 1 and 2^30");
}

void check_matches(const InputDims& t, const std::vector<std::int64_t>& want_bshd, Layout layout) {
  const std::vector<std::int64_t> want = from_bshd(want_bshd, layout);
  if (t.dims != want)
    throw InputError(t.name + " has shape " + dims_string(t.dims) + " but the problem needs " + dims_string(want) +
                     " in layout " + axis_names(layout));
}

}  // namespace

std::string dims_string(const std::vector<std::int64_t>& dims) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ")";
  return os.str();
}

const char* to_string(Layout layout) { return layout == Layout::BSHD ? "bshd" : "bhsd"; }

const char* axis_names(Layout layout) {
  return layout == Layout::BSHD ? "(batch, seq, heads, head_dim)" : "(batch, heads, seq, head_dim)";
}

Layout parse_layout(const std::string& text) {
  std::string s = text;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "bshd") return Layout::BSHD;
  if (s == "bhsd") return Layout::BHSD;
  throw InputError("unknown layout '" + text + "': supported are bshd (batch, seq, heads, head_dim) and bhsd " +
                   "(batch, heads, seq, head_dim)");
}

std::vector<std::int64_t> to_bshd(const std::vector<std::int64_t>& dims, Layout layout) {
  return swap_seq_and_heads(dims, layout);
}

std::vector<std::int64_t> from_bshd(const std::vector<std::int64_t>& bshd, Layout layout) {
  return swap_seq_and_heads(bshd, layout);
}

Shape shape_of_inputs(Layout layout, const InputDims& q, const InputDims& k, const InputDims& v,
                      const InputDims* dO) {
  for (const InputDims* t : {&q, &k, &v, dO})
    if (t) check_rank_and_extents(*t, layout);
  // The shape comes from q and k; every tensor is then held to it, so the one that disagrees is named.
  const std::vector<std::int64_t> qd = to_bshd(q.dims, layout), kd = to_bshd(k.dims, layout);
  const Shape s{.batch = int(qd[0]),
                .heads_q = int(qd[2]),
                .heads_kv = int(kd[2]),
                .seq_q = int(qd[1]),
                .seq_k = int(kd[1]),
                .head_dim = int(qd[3])};
  const std::vector<std::int64_t> q_want = {s.batch, s.seq_q, s.heads_q, s.head_dim};
  const std::vector<std::int64_t> kv_want = {s.batch, s.seq_k, s.heads_kv, s.head_dim};
  check_matches(k, kv_want, layout);
  check_matches(v, kv_want, layout);
  if (dO) check_matches(*dO, q_want, layout);
  if (s.heads_q % s.heads_kv != 0)
    throw InputError(q.name + " has " + std::to_string(s.heads_q) + " heads and " + k.name + ", " + v.name +
                     " have " + std::to_string(s.heads_kv) +
                     ": the query heads must be a multiple of the key/value heads");
  return s;
}

void check_forward_outputs(Layout layout, const Shape& s, const InputDims& o, const InputDims& lse) {
  check_matches(o, {s.batch, s.seq_q, s.heads_q, s.head_dim}, layout);
  const std::vector<std::int64_t> lse_want = {s.batch, s.heads_q, s.seq_q};
  if (lse.dims != lse_want)
    throw InputError(lse.name + " has shape " + dims_string(lse.dims) + " but the problem needs " +
                     dims_string(lse_want) + ", (batch, heads, seq_q), as the forward returns it");
}

}  // namespace flashlab
