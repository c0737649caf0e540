#include "verify/verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "cpu_reference/naive.hpp"
#include "cpu_reference/reference.hpp"

namespace flashlab {

namespace {

// One shape of the suite: batch, heads, lengths and mask (the head dim and dtype come from the kernel's pairs).
struct SuiteShape {
  int batch, heads_q, heads_kv, seq_q, seq_k;
  CausalAlign causal;
};
constexpr CausalAlign kNone = CausalAlign::None, kTopLeft = CausalAlign::TopLeft, kBottomRight = CausalAlign::BottomRight;

// The quick suite: length 1, lengths under, at and over 64 and 128, seq_q != seq_k both ways, many K/V blocks,
// both causal alignments, GQA and MQA. 192 = 3 x 64 tells a 64-row tail from a 128-row one.
const std::vector<SuiteShape>& quick_shapes() {
  static const std::vector<SuiteShape> shapes = {
      {1, 1, 1, 1, 1, kNone},          {1, 2, 2, 17, 17, kNone},         {1, 2, 2, 64, 64, kNone},
      {1, 2, 2, 64, 256, kNone},       {1, 2, 2, 64, 1024, kNone},       {2, 2, 2, 127, 129, kNone},
      {1, 4, 2, 128, 128, kNone},      {1, 4, 1, 100, 300, kNone},       {1, 2, 2, 64, 192, kNone},
      {1, 2, 2, 128, 128, kTopLeft},   {1, 2, 2, 192, 192, kBottomRight}, {1, 2, 2, 100, 300, kTopLeft},
      {1, 2, 2, 100, 300, kBottomRight}, {1, 2, 2, 300, 100, kTopLeft},  {1, 2, 2, 300, 100, kBottomRight},
      {1, 4, 2, 129, 127, kBottomRight}, {1, 4, 1, 64, 200, kBottomRight}, {2, 2, 2, 1, 200, kBottomRight},
      {1, 2, 2, 200, 1, kNone},        {1, 4, 2, 64, 512, kNone},
  };
  return shapes;
}

// The full suite adds, for each mask, pairs of lengths around the block sizes, and longer keys.
std::vector<SuiteShape> extra_shapes() {
  const std::pair<int, int> lengths[] = {
      {2, 2},     {16, 16},   {31, 33},   {33, 31},   {48, 80},   {63, 63},   {65, 65},   {80, 48},
      {96, 160},  {100, 100}, {127, 127}, {128, 256}, {129, 129}, {160, 96},  {191, 193}, {255, 257},
      {256, 256}, {257, 255}, {33, 500},  {500, 33},  {1, 64},    {64, 1},    {1, 1000},  {1000, 1},
      {200, 200}, {384, 384}, {128, 1000}, {1000, 128}, {333, 777}, {777, 333}, {64, 640},  {640, 64},
      {250, 250}, {320, 192}, {192, 320}, {448, 64},  {64, 448},  {1, 129},   {129, 1},   {511, 513}};
  const std::pair<int, int> heads[] = {{2, 2}, {4, 2}, {4, 1}, {3, 3}};
  std::vector<SuiteShape> shapes;
  int n = 0;
  for (const CausalAlign causal : {kNone, kTopLeft, kBottomRight})
    for (const auto& [sq, sk] : lengths) {
      const auto& [hq, hkv] = heads[n % std::size(heads)];
      shapes.push_back({1 + n % 2, hq, hkv, sq, sk, causal});
      ++n;
    }
  return shapes;
}

VerifyCase make_case(const SuiteShape& s, DType dtype, int head_dim, std::uint64_t seed) {
  VerifyCase c;
  c.problem.shape = Shape{.batch = s.batch, .heads_q = s.heads_q, .heads_kv = s.heads_kv, .seq_q = s.seq_q,
                          .seq_k = s.seq_k, .head_dim = head_dim};
  c.problem.options.causal = s.causal;
  c.problem.options.seed = seed;
  c.dtype = dtype;
  return c;
}

std::string format(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

// ---- the diagnosis ----------------------------------------------------------------------------------------

struct Evidence {  // what the diagnosis may look at beyond pass / fail: one failing case's tensors
  VerifyCase c;
  Reference ref;
  ForwardOut ours;
};

bool causal(const VerifyCase& c) { return c.problem.options.causal != CausalAlign::None; }
int seq_q(const VerifyCase& c) { return c.problem.shape.seq_q; }
int seq_k(const VerifyCase& c) { return c.problem.shape.seq_k; }
int keys_seen(const VerifyCase& c) {  // the most keys one query row sees (top-left: row i sees i + 1)
  return c.problem.options.causal == CausalAlign::TopLeft ? std::min(seq_q(c), seq_k(c)) : seq_k(c);
}
bool has_tail(const VerifyCase& c, int block) {  // a length over the block that is not a multiple of it
  return (seq_q(c) > block && seq_q(c) % block != 0) || (seq_k(c) > block && seq_k(c) % block != 0);
}
std::set<std::string> failing_outputs(const VerifyCaseResult& r) {
  std::set<std::string> names;
  if (!r.error.empty()) names.insert("forward");
  for (const VerifyOutput& o : r.outputs)
    if (!o.pass) names.insert(o.name);
  return names;
}

// The LSE is in base 2 when ours / reference is log2(e) on every finite element of some size.
std::optional<Finding> lse_base(const Evidence& e) {
  const HostTensor &ours = e.ours.lse, &ref = e.ref.forward.lse;
  if (ours.dims != ref.dims) return std::nullopt;
  int counted = 0;
  for (std::size_t n = 0; n < ref.data.size(); ++n) {
    if (!std::isfinite(ref.data[n]) || std::abs(ref.data[n]) < 1e-2) continue;  // the ratio of small values is noise
    if (std::abs(ours.data[n] / ref.data[n] - M_LOG2E) > 2e-3) return std::nullopt;
    ++counted;
  }
  if (counted == 0) return std::nullopt;
  return Finding{"lse-base-2", "The LSE is the reference times log2(e) = 1.4427 on every element (" +
                                   std::to_string(counted) + " compared in " + describe(e.c) +
                                   "): it is a base-2 log. The LSE is the natural log, L_i = m_i + log(l_i); "
                                   "a kernel that works with exp2 multiplies its log2 by ln 2 at the end."};
}

// O matches attention at another softmax scale, or is the reference times a constant.
std::optional<Finding> scale(const Evidence& e) {
  const Problem& p = e.c.problem;
  const double d = p.shape.head_dim, want = p.softmax_scale();
  const std::pair<const char*, double> candidates[] = {
      {"1", 1.0},          {"1/d", 1 / d},                {"1/sqrt(d) x log2(e)", want * M_LOG2E},
      {"1/sqrt(d) x ln 2", want * M_LN2}, {"1/d^2", 1 / (d * d)}, {"2/sqrt(d)", 2 * want},
      {"1/(2 sqrt(d))", want / 2},         {"sqrt(d)", std::sqrt(d)}};
  const OutputCheck own = check_output("O", e.ours.o, e.ref.forward.o, Quantity::Forward, e.c.dtype, e.ref);
  for (const auto& [name, value] : candidates) {
    Problem other = p;
    other.options.scale = value;
    const ForwardOut alt = naive_forward<double>(other, e.ref.inputs);
    const ErrorStats err = compare(e.ours.o, alt.o);
    if (own.bound.uses_rel ? err.rel <= std::max(own.bound.limit, 1e-6) : err.max_abs <= own.bound.limit)
      return Finding{"scale", std::string("O matches attention with the softmax scale ") + name + " = " +
                                  format("%.6g", value) + ", not 1/sqrt(d) = " + format("%.6g", want) + " (" +
                                  describe(e.c) + "): look at the scale the kernel applies to Q K^T."};
  }
  // O = c x reference, c far from 1.
  double dot = 0, ref2 = 0, ours2 = 0;
  const auto& ours = e.ours.o.data;
  const auto& ref = e.ref.forward.o.data;
  if (ours.size() != ref.size()) return std::nullopt;
  for (std::size_t n = 0; n < ref.size(); ++n) dot += ours[n] * ref[n], ref2 += ref[n] * ref[n], ours2 += ours[n] * ours[n];
  if (ref2 <= 0 || ours2 <= 0) return std::nullopt;
  const double c = dot / ref2;
  double resid = 0;
  for (std::size_t n = 0; n < ref.size(); ++n) resid += (ours[n] - c * ref[n]) * (ours[n] - c * ref[n]);
  if (std::abs(c - 1) > 1e-2 && std::sqrt(resid / ours2) < 1e-3)
    return Finding{"scale", "O is the reference times " + format("%.6g", c) + " on every element (" + describe(e.c) +
                                "): a constant factor, such as a missing or doubled normalization by l_i or a scale "
                                "applied to O."};
  return std::nullopt;
}

Finding diagnose(const std::vector<VerifyCaseResult>& cases, const std::optional<Evidence>& o_evidence,
                 const std::optional<Evidence>& lse_evidence) {
  std::vector<const VerifyCaseResult*> failed, passed;
  for (const VerifyCaseResult& r : cases) (r.pass() ? passed : failed).push_back(&r);
  const auto all_failed = [&](auto pred) { return std::all_of(failed.begin(), failed.end(), [&](auto* r) { return pred(*r); }); };
  const auto some_passed = [&](auto pred) { return std::any_of(passed.begin(), passed.end(), [&](auto* r) { return pred(*r); }); };
  const std::string count = std::to_string(failed.size()) + " of " + std::to_string(cases.size()) + " cases fail";

  if (all_failed([](const VerifyCaseResult& r) { return failing_outputs(r) == std::set<std::string>{"LSE"}; }) && lse_evidence)
    if (auto f = lse_base(*lse_evidence)) return *f;
  if (o_evidence)
    if (auto f = scale(*o_evidence)) return *f;
  const auto only_dk_dv = [](const VerifyCaseResult& r) {
    const auto names = failing_outputs(r);
    return !names.empty() && std::all_of(names.begin(), names.end(), [](const std::string& n) { return n == "dK" || n == "dV"; });
  };
  if (all_failed([&](const VerifyCaseResult& r) { return only_dk_dv(r) && r.c.problem.shape.group() > 1; }) &&
      some_passed([](const VerifyCaseResult& r) { return r.c.problem.shape.group() == 1; }))
    return {"group-sum", count + ", each only in dK and dV and only where query heads share a K/V head (GQA, MQA); "
                         "with one query head per K/V head they pass: the gradient of a shared K/V head is the sum over "
                         "the query heads of its group."};
  const auto br_unequal = [](const VerifyCaseResult& r) {
    return r.c.problem.options.causal == CausalAlign::BottomRight && seq_q(r.c) != seq_k(r.c);
  };
  if (all_failed(br_unequal) &&
      some_passed([](const VerifyCaseResult& r) { return causal(r.c) && (seq_q(r.c) == seq_k(r.c) || r.c.problem.options.causal == CausalAlign::TopLeft); }))
    return {"alignment", count + ", all of them causal bottom-right with seq_q != seq_k, while top-left and equal "
                         "lengths pass: the mask's alignment. Bottom-right lets query i see the keys j <= i + seq_k - "
                         "seq_q (the last query sees every key), top-left the keys j <= i."};
  if (all_failed([](const VerifyCaseResult& r) { return causal(r.c); }) &&
      some_passed([](const VerifyCaseResult& r) { return !causal(r.c) && seq_k(r.c) > 1; }))
    return {"mask", count + ", all of them causal, and every unmasked case passes: look at the causal mask."};
  // The tail: the block size whose partial blocks explain the failures best (largest on a tie).
  int best_block = 0;
  double best_share = 0;
  for (const int block : {128, 64, 32, 16}) {
    if (!all_failed([&](const VerifyCaseResult& r) { return has_tail(r.c, block); })) continue;
    if (!some_passed([&](const VerifyCaseResult& r) { return std::max(seq_q(r.c), seq_k(r.c)) > block && !has_tail(r.c, block); })) continue;
    int tails = 0;
    for (const VerifyCaseResult& r : cases) tails += has_tail(r.c, block);
    const double share = double(failed.size()) / tails;
    if (share > best_share) best_share = share, best_block = block;
  }
  if (best_block > 0 && best_share >= 0.5)
    return {"tail", count + ", all of them with a length over " + std::to_string(best_block) + " that is not a multiple of " +
                        std::to_string(best_block) + ", while whole multiples pass: the tail, the last partial block of " +
                        "queries or keys (its bounds check, its masking, or a loop that stops at the last whole block)."};
  // The rescale: rows that see up to some number of keys (one block) are right, and nearly every case whose rows
  // see more fails, whole blocks or not, masked or not (a second block that never moves a row's max hides it).
  int shortest_failing = std::numeric_limits<int>::max();  // the fewest keys a row sees in a failing case
  for (const VerifyCaseResult* r : failed) shortest_failing = std::min(shortest_failing, keys_seen(r->c));
  const auto long_rows = std::count_if(cases.begin(), cases.end(), [&](const VerifyCaseResult& r) {
    return keys_seen(r.c) >= shortest_failing;
  });
  if (shortest_failing > 17 && some_passed([](const VerifyCaseResult& r) { return keys_seen(r.c) >= 17; }) &&
      double(failed.size()) >= 0.8 * double(long_rows) &&
      std::any_of(failed.begin(), failed.end(), [](auto* r) { return !causal(r->c); })) {
    std::map<int, double> worst;  // seq_k -> largest max |error| of O, unmasked cases
    for (const VerifyCaseResult* r : failed)
      if (!causal(r->c))
        for (const VerifyOutput& o : r->outputs)
          if (o.name == "O") worst[seq_k(r->c)] = std::max(worst[seq_k(r->c)], o.error.max_abs);
    std::string errors;
    if (worst.size() >= 2)
      errors = "; O's max |error| " + format("%.3g", worst.begin()->second) + " at seq_k = " + std::to_string(worst.begin()->first) +
               ", " + format("%.3g", worst.rbegin()->second) + " at seq_k = " + std::to_string(worst.rbegin()->first);
    const std::string fewest = std::to_string(shortest_failing - 1);
    return {"rescale", count + ": " + std::to_string(failed.size()) + " of the " + std::to_string(long_rows) +
                       " whose rows see more than " + fewest + " keys, whole blocks or not, while rows that see up to " +
                       fewest + " keys are right" + errors + ". That is the online softmax's rescale: when a row's "
                       "running max moves from m_old to m_new, both l_i and O_i must be multiplied by exp(m_old - m_new)."};
  }
  return {"unknown", count + ", with no pattern FlashLab knows (the mask, its alignment, the tail, the rescale, the LSE's "
                     "base, the GQA sum, the scale): start from the first failing element below."};
}

// The first element of `ours` out of the bound (see ElementFailure), with its index.
ElementFailure first_failing_element(const std::string& label, const std::string& name, const HostTensor& ours,
                                     const HostTensor& ref, const OutputCheck& c) {
  ElementFailure f{label, name, {}, 0, 0};
  if (ours.dims != ref.dims) {
    f.index = ours.dims;
    f.ours = NAN;
    return f;
  }
  const double limit = c.bound.uses_rel ? c.bound.limit * std::max(1.0, c.error.ref_max) : c.bound.limit;
  std::size_t at = ref.data.size(), worst = 0;
  double worst_error = -1;
  for (std::size_t n = 0; n < ref.data.size(); ++n) {
    const double a = ours.data[n], b = ref.data[n];
    const double error = std::isnan(a) || std::isnan(b) ? INFINITY : (a == b ? 0 : std::abs(a - b));
    if (error > worst_error) worst_error = error, worst = n;
    if (error > limit) {
      at = n;
      break;
    }
  }
  if (at == ref.data.size()) at = worst;
  std::size_t rest = at;
  f.index.assign(ref.dims.size(), 0);
  for (std::size_t k = ref.dims.size(); k-- > 0;) {
    f.index[k] = std::int64_t(rest % std::size_t(ref.dims[k]));
    rest /= std::size_t(ref.dims[k]);
  }
  f.ours = ours.data[at];
  f.reference = ref.data[at];
  return f;
}

}  // namespace

KernelUnderTest one_head_kernel(std::string name, int max_head_dim,
                                std::function<ForwardOut(const Problem&, const Qkv&)> one_head) {
  KernelUnderTest k;
  k.name = std::move(name);
  k.refuses = [max_head_dim](const Problem& p, DType dtype) -> std::string {
    if (dtype != DType::F32) return "it computes in f32 only";
    if (p.options.causal != CausalAlign::None) return "it has no causal mask";
    if (p.shape.head_dim > max_head_dim) return "its arrays hold d <= " + std::to_string(max_head_dim);
    return "";
  };
  k.forward = [one_head](const Problem& p, DType, const Qkv& in) {
    const Shape& s = p.shape;
    Problem head = p;
    head.shape.batch = head.shape.heads_q = head.shape.heads_kv = 1;
    ForwardOut out{HostTensor(in.q.dims), HostTensor({s.batch, s.heads_q, s.seq_q})};
    const auto slice = [&](const HostTensor& t, int b, int h, int seq) {  // one (batch, head) as (1, S, 1, D)
      HostTensor one({1, seq, 1, s.head_dim});
      for (int i = 0; i < seq; ++i)
        for (int d = 0; d < s.head_dim; ++d) one.at(0, i, 0, d) = t.at(b, i, h, d);
      return one;
    };
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < s.heads_q; ++h) {
        const int kv = h / s.group();
        const ForwardOut r = one_head(head, Qkv{slice(in.q, b, h, s.seq_q), slice(in.k, b, kv, s.seq_k), slice(in.v, b, kv, s.seq_k)});
        if (r.o.dims != std::vector<std::int64_t>{1, s.seq_q, 1, s.head_dim} || r.lse.numel() != s.seq_q)
          throw std::runtime_error("the one-head kernel returned O " + r.o.dims_string() + " and LSE " + r.lse.dims_string() +
                                   " for a head of " + std::to_string(s.seq_q) + " queries");
        for (int i = 0; i < s.seq_q; ++i) {
          for (int d = 0; d < s.head_dim; ++d) out.o.at(b, i, h, d) = r.o.at(0, i, 0, d);
          out.lse.data[(std::size_t(b) * s.heads_q + h) * s.seq_q + i] = r.lse.data[i];
        }
      }
    return out;
  };
  return k;
}

VerifyReport verify_one_head(const std::string& name, int max_head_dim, std::uint64_t seed,
                             std::function<ForwardOut(const Problem&, const Qkv&)> one_head) {
  VerifyRequest request;
  request.dtypes = {DType::F32};
  request.head_dims.clear();
  for (const int d : {16, 40, 64, 128})
    if (d <= max_head_dim) request.head_dims.push_back(d);
  request.seed = seed;
  request.backward = false;
  return verify(one_head_kernel(name, max_head_dim, std::move(one_head)), request);
}

VerifySuite parse_verify_suite(const std::string& s) {
  if (s == "quick") return VerifySuite::Quick;
  if (s == "full") return VerifySuite::Full;
  throw InputError("unknown suite '" + s + "': verify runs 'quick' (about 20 cases) or 'full' (about 200)");
}

std::string describe(const VerifyCase& c) {
  const Shape& s = c.problem.shape;
  std::ostringstream out;
  out << "B=" << s.batch << " H=" << s.heads_q << "/" << s.heads_kv << " S_q=" << s.seq_q << " S_k=" << s.seq_k
      << " d=" << s.head_dim << " " << to_string(c.problem.options.causal) << " " << to_string(c.dtype);
  return out.str();
}

bool VerifyCaseResult::pass() const {
  return error.empty() && !outputs.empty() &&
         std::all_of(outputs.begin(), outputs.end(), [](const VerifyOutput& o) { return o.pass; });
}

VerifyReport verify(const KernelUnderTest& kernel, const VerifyRequest& request) {
  VerifyReport report;
  report.kernel = kernel.name;
  report.suite = request.suite;
  report.seed = request.seed;
  report.backward = request.backward && static_cast<bool>(kernel.backward);

  // The pairs the kernel runs: asked on a small problem of each.
  std::vector<std::pair<DType, int>> pairs;
  for (const DType dtype : request.dtypes)
    for (const int d : request.head_dims) {
      const std::string why = kernel.refuses ? kernel.refuses(make_case({1, 2, 2, 64, 64, kNone}, dtype, d, 0).problem, dtype) : "";
      if (why.empty()) pairs.emplace_back(dtype, d);
      else report.refused.push_back({dtype, d, why, ""});
    }
  if (pairs.empty()) {
    std::string why;
    for (const Refusal& r : report.refused)
      why += std::string(why.empty() ? "" : "; ") + to_string(r.dtype) + " d=" + std::to_string(r.head_dim) + ": " + r.why;
    throw InputError(kernel.name + " runs none of the dtypes and head dims tried (" + why + ")");
  }

  std::vector<VerifyCase> cases;
  std::uint64_t n = 0;
  const auto& quick = quick_shapes();
  if (request.suite == VerifySuite::Quick) {
    for (std::size_t i = 0; i < quick.size(); ++i, ++n)
      cases.push_back(make_case(quick[i], pairs[i % pairs.size()].first, pairs[i % pairs.size()].second, request.seed + n));
  } else {
    for (const auto& [dtype, d] : pairs)
      for (const SuiteShape& s : quick) cases.push_back(make_case(s, dtype, d, request.seed + n++));
    const std::vector<SuiteShape> extra = extra_shapes();
    for (std::size_t i = 0; i < extra.size(); ++i, ++n)
      cases.push_back(make_case(extra[i], pairs[i % pairs.size()].first, pairs[i % pairs.size()].second, request.seed + n));
  }

  std::optional<Evidence> o_evidence, lse_evidence;
  for (const VerifyCase& c : cases) {
    if (kernel.refuses) {
      const std::string why = kernel.refuses(c.problem, c.dtype);
      if (!why.empty()) {
        report.refused.push_back({c.dtype, c.problem.shape.head_dim, why, describe(c)});
        continue;
      }
    }
    VerifyCaseResult r;
    r.c = c;
    validate(c.problem);
    Reference ref = seeded_reference(c.problem, c.dtype, report.backward);
    ForwardOut ours;
    try {
      ours = kernel.forward(c.problem, c.dtype, ref.inputs);
    } catch (const KernelRefusal& e) {
      report.refused.push_back({c.dtype, c.problem.shape.head_dim, e.what(), describe(c)});
      continue;
    } catch (const std::exception& e) {
      r.error = std::string("forward: ") + e.what();
    }
    std::map<std::string, std::pair<const HostTensor*, const HostTensor*>> tensors;  // name -> (ours, reference)
    Grads grads;
    if (r.error.empty()) {
      tensors["O"] = {&ours.o, &ref.forward.o};
      if (kernel.writes_lse && !ours.lse.dims.empty()) tensors["LSE"] = {&ours.lse, &ref.forward.lse};
      if (report.backward) {
        // The backward gets the reference's O (in the dtype) and LSE, not the kernel's own, so that it is judged on
        // its own arithmetic and a forward bug is not counted twice.
        ForwardOut given = ref.forward;
        round_to(given.o, c.dtype);
        try {
          grads = kernel.backward(c.problem, c.dtype, ref.inputs, given, ref.d_o);
          tensors["dQ"] = {&grads.dq, &ref.grads.dq};
          tensors["dK"] = {&grads.dk, &ref.grads.dk};
          tensors["dV"] = {&grads.dv, &ref.grads.dv};
        } catch (const std::exception& e) {
          r.error = std::string("backward: ") + e.what();
        }
      }
    }
    for (const char* name : {"O", "LSE", "dQ", "dK", "dV"}) {
      const auto t = tensors.find(name);
      if (t == tensors.end()) continue;
      const bool gradient = name[0] == 'd';
      const OutputCheck check = check_output(name, *t->second.first, *t->second.second,
                                             gradient ? Quantity::Gradient : Quantity::Forward, c.dtype, ref);
      const double used = (check.bound.uses_rel ? check.error.rel : check.error.max_abs) / check.bound.limit;
      r.outputs.push_back({name, check.error, check.bound.rule, check.passes(), std::isnan(used) ? INFINITY : used});
      if (!check.passes() && !report.first_failure)
        report.first_failure = first_failing_element(describe(c), name, *t->second.first, *t->second.second, check);
    }
    if (!r.pass() && r.error.empty()) {  // the largest failing case (within reason) is the diagnosis' evidence
      const auto names = failing_outputs(r);
      const auto better = [&](const std::optional<Evidence>& e) {
        return !e || (ours.o.numel() > e->ours.o.numel() && ours.o.numel() <= 100'000);
      };
      if (names.count("O") && better(o_evidence)) o_evidence = Evidence{c, ref, ours};
      if (names.count("LSE") && better(lse_evidence)) lse_evidence = Evidence{c, ref, ours};
    }
    ++(r.pass() ? report.passed : report.failed);
    report.cases.push_back(std::move(r));
  }
  if (report.failed > 0) report.diagnosis = diagnose(report.cases, o_evidence, lse_evidence);
  return report;
}

namespace {

std::string index_string(const std::vector<std::int64_t>& index) {
  std::string s = "[";
  for (std::size_t n = 0; n < index.size(); ++n) s += (n ? ", " : "") + std::to_string(index[n]);
  return s + "]";
}

}  // namespace

std::string verify_report_text(const VerifyReport& report, const std::string& source) {
  std::ostringstream out;
  std::set<std::string> checked;  // the outputs compared in some case
  for (const VerifyCaseResult& r : report.cases)
    for (const VerifyOutput& o : r.outputs) checked.insert(o.name);
  std::string outputs;
  for (const char* name : {"O", "LSE", "dQ", "dK", "dV"})
    if (checked.count(name)) outputs += std::string(outputs.empty() ? "" : ", ") + name;
  out << "flashlab verify: " << report.kernel << " (" << source << "), suite "
      << (report.suite == VerifySuite::Quick ? "quick" : "full") << ", seed " << report.seed << ", outputs checked: "
      << (outputs.empty() ? "none" : outputs) << "\n";
  std::map<std::string, std::pair<std::set<std::string>, int>> refused;  // why -> the pairs, and how many cases
  for (const Refusal& r : report.refused) {
    auto& [pairs, cases] = refused[r.why];
    pairs.insert(std::string(to_string(r.dtype)) + " d=" + std::to_string(r.head_dim));
    cases += !r.case_label.empty();
  }
  for (const auto& [why, what] : refused) {
    std::string pairs;
    for (const std::string& p : what.first) pairs += (pairs.empty() ? "" : ", ") + p;
    out << "refused: " << pairs << (what.second ? " (" + std::to_string(what.second) + " cases)" : "") << ": " << why << "\n";
  }
  out << "\n" << std::left << std::setw(50) << "case" << "result  the output nearest its bound: its error (the bound)\n";
  for (const VerifyCaseResult& r : report.cases) {
    out << std::setw(50) << describe(r.c) << (r.pass() ? "PASS    " : "FAIL    ");
    if (!r.error.empty()) {
      out << r.error << "\n";
      continue;
    }
    const VerifyOutput* worst = nullptr;  // the output nearest its bound, or furthest past it
    for (const VerifyOutput& o : r.outputs)
      if (!worst || o.used > worst->used) worst = &o;
    if (worst)
      out << worst->name << " " << std::setprecision(3)
          << (worst->bound.rfind("rel", 0) == 0 ? worst->error.rel : worst->error.max_abs) << " (" << worst->bound << ")";
    out << "\n";
  }
  out << "\n" << report.cases.size() << " cases: " << report.passed << " pass, " << report.failed << " fail\n";
  if (report.diagnosis) out << "diagnosis (" << report.diagnosis->id << "): " << report.diagnosis->sentence << "\n";
  if (report.first_failure) {
    const ElementFailure& f = *report.first_failure;
    out << "first failing element: " << f.case_label << ", " << f.output << index_string(f.index) << ": ours "
        << std::setprecision(9) << f.ours << ", reference " << f.reference << "\n";
  }
  return out.str();
}

}  // namespace flashlab
