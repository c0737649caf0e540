#include "cpu_reference/reference.hpp"

#include <algorithm>
#include <utility>

#include "cpu_reference/naive.hpp"

namespace flashlab {

namespace {
bool is_low_precision(DType t) { return t == DType::F16 || t == DType::BF16; }
}  // namespace

Reference make_reference(const Problem& p, DType dtype, const Qkv& inputs64, const HostTensor& d_o64, bool backward) {
  Reference r;
  r.inputs = inputs64;
  round_to(r.inputs.q, dtype);
  round_to(r.inputs.k, dtype);
  round_to(r.inputs.v, dtype);
  r.forward = naive_forward<double>(p, r.inputs);
  if (backward) {
    r.d_o = d_o64;
    round_to(r.d_o, dtype);
    r.grads = naive_backward<double>(p, r.inputs, r.forward, r.d_o);
  }
  if (is_low_precision(dtype)) {
    const ForwardOut f = naive_forward_lowp(p, dtype, r.inputs);
    r.lowp_error["O"] = compare(f.o, r.forward.o);
    r.lowp_error["LSE"] = compare(f.lse, r.forward.lse);
    if (backward) {
      const Grads g = naive_backward_lowp(p, dtype, r.inputs, f, r.d_o);
      r.lowp_error["dQ"] = compare(g.dq, r.grads.dq);
      r.lowp_error["dK"] = compare(g.dk, r.grads.dk);
      r.lowp_error["dV"] = compare(g.dv, r.grads.dv);
    }
  }
  return r;
}

Reference seeded_reference(const Problem& p, DType dtype, bool backward) {
  return make_reference(p, dtype, random_qkv(p.shape, DType::F64, p.options.seed),
                        backward ? random_like_o(p.shape, DType::F64, p.options.seed) : HostTensor(), backward);
}

OutputCheck check_output(const std::string& name, const HostTensor& out, const HostTensor& ref, Quantity quantity,
                         DType dtype, const Reference& r) {
  OutputCheck c;
  c.error = compare(out, ref);
  // A gradient that is exactly zero everywhere (dQ and dK when every row sees one key: P = 1, so dS = P o (dP - D)
  // cancels) leaves the rule nothing to scale by: its own max and norm are 0, and so is the error of naive attention,
  // whose D = rowsum(P o dP) cancels exactly, while a kernel's D = rowsum(dO o O) cancels only to fp32 roundoff. That
  // roundoff is of the size of the terms that cancel, the case's other gradients: it is judged at their scale.
  ErrorStats scaled = c.error;
  if (quantity == Quantity::Gradient && !c.error.has_nan && c.error.ref_max == 0) {
    double grad_max = 0, grad_norm = 0;
    for (const HostTensor* g : {&r.grads.dq, &r.grads.dk, &r.grads.dv}) {
      const ErrorStats size = compare(*g, HostTensor(g->dims));  // |g| against zero: its max, and its norm as rel
      grad_max = std::max(grad_max, size.max_abs);
      grad_norm = std::max(grad_norm, size.rel);
    }
    scaled.ref_max = grad_max;
    if (grad_norm > 0) scaled.rel = c.error.rel / grad_norm;  // ||out - 0|| over the largest gradient's norm
  }
  const auto base = r.lowp_error.find(name);
  c.bound = tolerance(dtype, quantity, scaled, base == r.lowp_error.end() ? nullptr : &base->second);
  c.error.rel = scaled.rel;  // reported as judged
  return c;
}

}  // namespace flashlab
