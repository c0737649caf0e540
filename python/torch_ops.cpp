// _flashlab_ops: FlashLab's attention as PyTorch operators, torch.ops.flashlab.*, for the variants that run on a
// caller's stream (Variant::runs_on_caller_stream: cuda-fa3-ws and its ladder, cuda-fa2). flashlab/torch.py loads it
// (torch.ops.load_library) and routes CUDA tensors through it; it is built where the module's Python has PyTorch.
//
// Why C++ operators and not torch.library.custom_op in Python: a call then costs what PyTorch's own operators cost
// on the host. The dispatcher calls straight into the kernels' entry, autograd runs a C++ node, and no Python,
// DLPack capsule or synchronization stands between the model and the kernel. What PyTorch needs of an operator
// follows from that:
//  * the kernels are queued on torch.cuda.current_stream() and the call returns at once (DeviceLaunch of
//    core/device_io.hpp: asynchronous), with its outputs and scratch from PyTorch's caching allocator. Nothing
//    allocates with cudaMalloc or waits, so the calls can be captured in a CUDA graph;
//  * Meta implementations give the outputs' shapes and strides without running anything, for torch.compile (fake
//    tensors) and for CUDA graph trees;
//  * the outputs are laid out in memory as q is (at::empty_like), as SDPA's are. The kernels write (B, S, H, D) rows:
//    where q is a (B, H, S, D) view of such memory (q.view(B, S, H, D).transpose(1, 2), what a transformer's
//    projections give) nothing is copied; other layouts are copied in and, for the outputs, out;
//  * the registry's checks stay the one place bad input is caught: its InputError (one sentence) becomes ValueError.
//
// The operators (schemas below):
//   flashlab::attention              O = attention(q, k, v), differentiable (an Autograd kernel around the two below)
//   flashlab::attention_forward      (O, LSE)
//   flashlab::attention_backward     (dQ, dK, dV) from dO, q, k, v, O, LSE
//   flashlab::fp8_attention_forward  (O, LSE) of the FP8 (e4m3) forward, from q, k, v and their descales
// q (B, H_q, S_q, D), k and v (B, H_kv, S_k, D) in f16 or bf16 (f32 for the fp32 variants), as
// torch.nn.functional.scaled_dot_product_attention takes them; LSE (B, H_q, S_q) float32, natural log.
// fp8_attention_forward (cuda-fa3-ws) takes q, k, v in float8_e4m3fn with FlashAttention-3's descales, float32
// q_descale (B, H_q), k_descale and v_descale (B, H_kv) (value = e4m3 value x descale), and gives O in bfloat16. It
// is not differentiable (there is no FP8 backward), so it has no Autograd kernel and refuses inputs that require grad.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/layout.hpp"
#include "core/problem.hpp"
#include "registry/variants.hpp"

namespace flashlab::torch_ops {
namespace {

using at::Tensor;

// Runs `body`, turning the registry's InputError into PyTorch's ValueError (c10::ValueError), its one sentence kept.
template <class F>
auto sentences_as_value_errors(F&& body) {
  try {
    return body();
  } catch (const InputError& error) {
    TORCH_CHECK_VALUE(false, error.what());
  }
}

// The registry's dtype of a PyTorch one, where it has one.
std::optional<DType> registry_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return DType::F64;
    case at::kFloat: return DType::F32;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kFloat8_e4m3fn: return DType::E4M3;
    default: return std::nullopt;
  }
}

// What an operator's q, k, v may be: the attention operators' f16, bf16 or f32, or the FP8 forward's e4m3 alone.
enum class Computes { Floats, E4m3 };

DType dtype_of(const Tensor& t, const char* name, Computes computes) {
  const std::optional<DType> dtype = registry_dtype(t.scalar_type());
  const std::string is = std::string(name) + " is " + std::string(c10::toString(t.scalar_type()));
  if (computes == Computes::E4m3) {
    if (dtype == DType::E4M3) return *dtype;
    throw InputError(is + ": flashlab::fp8_attention_forward takes float8_e4m3fn CUDA tensors with their descales "
                     "(float16 and bfloat16 go through flashlab::attention)");
  }
  if (dtype == DType::F16 || dtype == DType::BF16 || dtype == DType::F32) return *dtype;
  throw InputError(is + ": FlashLab's operators take float16, bfloat16 or float32 CUDA tensors (float8 goes through "
                   "flashlab.torch.fp8_attention)");
}

std::vector<std::int64_t> dims_of(const Tensor& t) { return std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end()); }

// The problem q, k, v (and dO) describe in PyTorch's (B, H, S, D) layout: the registry's sentences for bad shapes.
Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* d_o, bool is_causal,
                   bool bottom_right, std::optional<double> scale, double dropout_p, std::int64_t seed,
                   bool deterministic) {
  const double softmax_scale = scale_option(scale);
  const InputDims dq{"query", dims_of(q)}, dk{"key", dims_of(k)}, dv{"value", dims_of(v)};
  std::optional<InputDims> ddo;
  if (d_o != nullptr) ddo = InputDims{"grad_out", dims_of(*d_o)};
  Problem p;
  p.shape = shape_of_inputs(Layout::BHSD, dq, dk, dv, ddo ? &*ddo : nullptr);
  p.options.causal = !is_causal ? CausalAlign::None : bottom_right ? CausalAlign::BottomRight : CausalAlign::TopLeft;
  p.options.scale = softmax_scale;
  p.options.dropout_p = dropout_p;
  p.options.seed = static_cast<std::uint64_t>(seed);
  p.options.deterministic = deterministic;
  return p;
}

// Every tensor on one CUDA device and in one dtype the operator computes in (LSE: float32); returns that dtype.
DType common_dtype(std::initializer_list<std::pair<const Tensor*, const char*>> tensors,
                   Computes computes = Computes::Floats) {
  const auto& [first, first_name] = *tensors.begin();
  const DType dtype = dtype_of(*first, first_name, computes);
  for (const auto& [t, name] : tensors) {
    if (!t->is_cuda())
      throw InputError(std::string(name) + " is on the " + t->device().str() + " but " + first_name +
                       " is on a CUDA device: FlashLab's operators take CUDA tensors on one GPU");
    if (t->device() != first->device())
      throw InputError(std::string(name) + " is on " + t->device().str() + " but " + first_name + " is on " +
                       first->device().str() + ": pass every tensor on one GPU");
    if (dtype_of(*t, name, computes) != dtype)
      throw InputError(std::string(name) + " is " + std::string(c10::toString(t->scalar_type())) + " but " +
                       first_name + " is " + std::string(c10::toString(first->scalar_type())) +
                       ": pass them in one dtype, the one to compute in");
  }
  return dtype;
}

// One descale of the FP8 forward, checked: float32 (B, H) on q's GPU (the shape's and the dtype's sentences are the
// registry's, as flashlab.attention's are). Made contiguous: the kernel reads one float per (batch, head), row-major.
Tensor e4m3_descale(const Tensor& d, const char* name, const Tensor& q, const std::vector<std::int64_t>& dims,
                    const char* extents) {
  const std::optional<DType> dtype = registry_dtype(d.scalar_type());
  check_e4m3_descale(name, dims_of(d), dtype ? to_string(*dtype) : std::string(c10::toString(d.scalar_type())), dims,
                     extents);
  if (!d.is_cuda())
    throw InputError(std::string(name) + " is on the " + d.device().str() + " but query is on " + q.device().str() +
                     ": the kernel reads the descales, so pass them as float32 tensors on query's GPU");
  if (d.device() != q.device())
    throw InputError(std::string(name) + " is on " + d.device().str() + " but query is on " + q.device().str() +
                     ": pass every tensor on one GPU");
  return d.contiguous();
}

// No FP8 backward exists (FlashAttention-3 ships none either), so the FP8 operator has no Autograd kernel, and
// PyTorch's fallback for one would only warn once a backward reached it: inputs that require grad are refused.
void refuse_requires_grad(std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  for (const auto& [t, name] : tensors)
    if (t->requires_grad())
      throw InputError(std::string(name) + " requires grad, but FlashLab has no FP8 backward (FlashAttention-3 ships "
                       "none either): pass " + name + ".detach(), or run in bfloat16 for gradients");
}

// A forward's LSE for q (B, H_q, S_q, D): (B, H_q, S_q) float32, contiguous (symbolic sizes under fake tensors).
Tensor empty_lse(const Tensor& q) {
  return at::empty_symint({q.sym_size(0), q.sym_size(1), q.sym_size(2)}, q.options().dtype(at::kFloat));
}

// x (B, H, S, D) as the kernels read it: its (B, S, H, D) transpose, contiguous (a copy only when it is not already).
Tensor bshd(const Tensor& x) { return x.transpose(1, 2).contiguous(); }

// Where the kernel writes a result laid out as `result` (B, H, S, D): result's own memory when that is (B, S, H, D)
// rows, else a (B, S, H, D) tensor from the allocator, copied into result by deliver().
Tensor bshd_target(const Tensor& result) {
  const Tensor rows = result.transpose(1, 2);
  return rows.is_contiguous() ? rows : at::empty(rows.sizes(), result.options());
}
void deliver(const Tensor& written, const Tensor& result) {
  if (written.data_ptr() != result.data_ptr()) result.copy_(written.transpose(1, 2));
}

// A CUDA call's launch: the current stream, asynchronous, with `bytes` of scratch from the caching allocator (kept
// alive by `hold` until the call's outputs are returned; the allocator orders its reuse after the stream's work).
DeviceLaunch launch_on_current_stream(const Tensor& like, std::size_t bytes, Tensor& hold) {
  DeviceLaunch launch;
  launch.stream = c10::cuda::getCurrentCUDAStream(like.device().index()).stream();
  launch.asynchronous = true;
  if (bytes > 0) {
    hold = at::empty({static_cast<std::int64_t>(bytes)}, like.options().dtype(at::kByte));
    launch.scratch = hold.data_ptr();
    launch.scratch_bytes = bytes;
  }
  return launch;
}

const Variant& caller_stream_variant(c10::string_view name) {
  const Variant& var = find_variant(std::string(name));
  if (!var.runs_on_caller_stream())
    throw InputError("variant " + var.name + " runs on the legacy default stream and waits for its kernels, so it has "
                     "no PyTorch operator; flashlab.torch runs it through flashlab.attention instead");
  return var;
}

// Dropout's seed is a plain argument of each call, drawn on the host: a CUDA graph captured with dropout would replay
// the one seed it was captured with, and drop the same elements every time. flashlab.torch refuses an eager capture
// before it draws the seed; this refuses the rest (a graph that torch.compile's mode="reduce-overhead" records, or a
// backward captured apart from its forward), in the op itself.
void refuse_dropout_in_capture(double dropout_p) {
  if (dropout_p > 0 && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
    throw InputError("dropout inside CUDA graph capture is not supported: FlashLab's dropout seed is drawn on the host "
                     "for each call, so every replay of the graph would drop the same elements; capture with "
                     "dropout_p=0, or make this call outside the graph");
}

std::tuple<Tensor, Tensor> forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, c10::string_view variant,
                                        bool is_causal, bool bottom_right, std::optional<double> scale,
                                        double dropout_p, std::int64_t seed) {
  return sentences_as_value_errors([&] {
    const Variant& var = caller_stream_variant(variant);
    const Problem p = problem_of(q, k, v, nullptr, is_causal, bottom_right, scale, dropout_p, seed, false);
    const DType dtype = common_dtype({{&q, "query"}, {&k, "key"}, {&v, "value"}});
    const c10::cuda::CUDAGuard on(q.device());
    refuse_dropout_in_capture(dropout_p);  // on q's device's current stream
    const int device = q.device().index();
    var.check_device_call(p, dtype, device, false);
    const Tensor q_rows = bshd(q), k_rows = bshd(k), v_rows = bshd(v);
    Tensor out = at::empty_like(q);
    const Tensor out_rows = bshd_target(out);
    Tensor lse = empty_lse(q);
    Tensor scratch;
    DeviceForwardIo io{device, q_rows.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(), out_rows.data_ptr(),
                       lse.data_ptr<float>()};
    io.launch = launch_on_current_stream(q, var.device_scratch_bytes(p, dtype, false), scratch);
    var.forward_on_device(p, dtype, io);
    deliver(out_rows, out);
    return std::make_tuple(out, lse);
  });
}

std::tuple<Tensor, Tensor, Tensor> backward_cuda(const Tensor& d_o, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, c10::string_view variant,
                                                 bool is_causal, bool bottom_right, std::optional<double> scale,
                                                 double dropout_p, std::int64_t seed, bool deterministic) {
  return sentences_as_value_errors([&] {
    const Variant& var = caller_stream_variant(variant);
    const Problem p = problem_of(q, k, v, &d_o, is_causal, bottom_right, scale, dropout_p, seed, deterministic);
    const DType dtype =
        common_dtype({{&q, "query"}, {&k, "key"}, {&v, "value"}, {&out, "out"}, {&d_o, "grad_out"}});
    const std::vector<std::int64_t> lse_dims{q.size(0), q.size(1), q.size(2)};
    if (lse.scalar_type() != at::kFloat || dims_of(lse) != lse_dims || lse.device() != q.device())
      throw InputError("lse must be the forward's: float32 (B, H_q, S_q) = " + dims_string(lse_dims) +
                       " on query's GPU");
    const c10::cuda::CUDAGuard on(q.device());
    refuse_dropout_in_capture(dropout_p);
    const int device = q.device().index();
    var.check_device_call(p, dtype, device, true);
    const Tensor q_rows = bshd(q), k_rows = bshd(k), v_rows = bshd(v), out_rows = bshd(out), d_o_rows = bshd(d_o);
    const Tensor lse_rows = lse.contiguous();
    Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    const Tensor dq_rows = bshd_target(dq), dk_rows = bshd_target(dk), dv_rows = bshd_target(dv);
    Tensor scratch;
    DeviceBackwardIo io{device,           q_rows.data_ptr(),  k_rows.data_ptr(),  v_rows.data_ptr(),
                        out_rows.data_ptr(), lse_rows.data_ptr<float>(), d_o_rows.data_ptr(), dq_rows.data_ptr(),
                        dk_rows.data_ptr(),  dv_rows.data_ptr()};
    io.launch = launch_on_current_stream(q, var.device_scratch_bytes(p, dtype, true), scratch);
    var.backward_on_device(p, dtype, io);
    deliver(dq_rows, dq);
    deliver(dk_rows, dk);
    deliver(dv_rows, dv);
    return std::make_tuple(dq, dk, dv);
  });
}

// The FP8 forward: O in bf16 (laid out as q is, as forward_cuda's), the LSE in float32. The descales are checked after
// the registry's own checks of the call (a variant without an FP8 forward, a head dim it lacks: its sentences first).
std::tuple<Tensor, Tensor> fp8_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_descale,
                                            const Tensor& k_descale, const Tensor& v_descale, c10::string_view variant,
                                            bool is_causal, bool bottom_right, std::optional<double> scale) {
  return sentences_as_value_errors([&] {
    const Variant& var = caller_stream_variant(variant);
    const Problem p = problem_of(q, k, v, nullptr, is_causal, bottom_right, scale, 0.0, 0, false);
    common_dtype({{&q, "query"}, {&k, "key"}, {&v, "value"}}, Computes::E4m3);
    refuse_requires_grad({{&q, "query"}, {&k, "key"}, {&v, "value"}, {&q_descale, "q_descale"},
                          {&k_descale, "k_descale"}, {&v_descale, "v_descale"}});
    const c10::cuda::CUDAGuard on(q.device());
    const int device = q.device().index();
    var.check_device_call(p, DType::E4M3, device, false);
    require_e4m3_descales(var, q_descale.defined(), k_descale.defined(), v_descale.defined());  // C++ callers
    const Shape& s = p.shape;
    const Tensor q_scales = e4m3_descale(q_descale, "q_descale", q, {s.batch, s.heads_q}, "(B, H_q)");  // (B, H_q)
    const Tensor k_scales = e4m3_descale(k_descale, "k_descale", q, {s.batch, s.heads_kv}, "(B, H_kv)");
    const Tensor v_scales = e4m3_descale(v_descale, "v_descale", q, {s.batch, s.heads_kv}, "(B, H_kv)");
    const Tensor q_rows = bshd(q), k_rows = bshd(k), v_rows = bshd(v);
    Tensor out = at::empty_like(q, q.options().dtype(at::kBFloat16));
    const Tensor out_rows = bshd_target(out);
    Tensor lse = empty_lse(q);
    Tensor scratch;  // the FP8 forward's V^T and tile counter
    DeviceForwardIo io{device, q_rows.data_ptr(), k_rows.data_ptr(), v_rows.data_ptr(), out_rows.data_ptr(),
                       lse.data_ptr<float>()};
    io.launch = launch_on_current_stream(q, var.device_scratch_bytes(p, DType::E4M3, false), scratch);
    var.forward_e4m3_on_device(
        p, io, DeviceE4m3Descales{q_scales.data_ptr<float>(), k_scales.data_ptr<float>(), v_scales.data_ptr<float>()});
    deliver(out_rows, out);
    return std::make_tuple(out, lse);
  });
}

// The Meta implementations: the outputs' shapes, dtypes and strides as the CUDA ones make them, nothing run.
std::tuple<Tensor, Tensor> forward_meta(const Tensor& q, const Tensor&, const Tensor&, c10::string_view, bool, bool,
                                        std::optional<double>, double, std::int64_t) {
  return std::make_tuple(at::empty_like(q), empty_lse(q));
}

std::tuple<Tensor, Tensor, Tensor> backward_meta(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor&, const Tensor&, c10::string_view, bool, bool,
                                                 std::optional<double>, double, std::int64_t, bool) {
  return std::make_tuple(at::empty_like(q), at::empty_like(k), at::empty_like(v));
}

std::tuple<Tensor, Tensor> fp8_forward_meta(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, c10::string_view, bool, bool, std::optional<double>) {
  return std::make_tuple(at::empty_like(q, q.options().dtype(at::kBFloat16)), empty_lse(q));
}

// The two operators, called through the dispatcher (so that torch.compile, CUDA graphs and other modes see them).
std::tuple<Tensor, Tensor> call_forward(const Tensor& q, const Tensor& k, const Tensor& v, c10::string_view variant,
                                        bool is_causal, bool bottom_right, std::optional<double> scale,
                                        double dropout_p, std::int64_t seed) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("flashlab::attention_forward", "")
                             .typed<decltype(forward_cuda)>();
  return op.call(q, k, v, variant, is_causal, bottom_right, scale, dropout_p, seed);
}

std::tuple<Tensor, Tensor, Tensor> call_backward(const Tensor& d_o, const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& out, const Tensor& lse, c10::string_view variant,
                                                 bool is_causal, bool bottom_right, std::optional<double> scale,
                                                 double dropout_p, std::int64_t seed, bool deterministic) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("flashlab::attention_backward", "")
                             .typed<decltype(backward_cuda)>();
  return op.call(d_o, q, k, v, out, lse, variant, is_causal, bottom_right, scale, dropout_p, seed, deterministic);
}

// attention's autograd: the forward saves q, k, v, O and the LSE; the backward runs the variant's backward pass (the
// same dropout mask, from the same seed). The options ride along in saved_data.
class Attention : public torch::autograd::Function<Attention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        c10::string_view variant, bool is_causal, bool bottom_right, std::optional<double> scale,
                        double dropout_p, std::int64_t seed, bool deterministic) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = call_forward(q, k, v, variant, is_causal, bottom_right, scale, dropout_p, seed);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["variant"] = std::string(variant);
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["bottom_right"] = bottom_right;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["deterministic"] = deterministic;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& data = ctx->saved_data;
    const std::string variant = data.at("variant").toStringRef();
    auto [dq, dk, dv] = call_backward(grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], variant,
                                      data.at("is_causal").toBool(), data.at("bottom_right").toBool(),
                                      data.at("scale").toOptional<double>(), data.at("dropout_p").toDouble(),
                                      data.at("seed").toInt(), data.at("deterministic").toBool());
    return {dq, dk, dv, Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

Tensor attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v, c10::string_view variant, bool is_causal,
                          bool bottom_right, std::optional<double> scale, double dropout_p, std::int64_t seed,
                          bool deterministic) {
  return Attention::apply(q, k, v, variant, is_causal, bottom_right, scale, dropout_p, seed, deterministic);
}

// attention below autograd (under torch.inference_mode, or once autograd has run): the forward's O.
Tensor attention_no_grad(const Tensor& q, const Tensor& k, const Tensor& v, c10::string_view variant, bool is_causal,
                         bool bottom_right, std::optional<double> scale, double dropout_p, std::int64_t seed, bool) {
  return std::get<0>(call_forward(q, k, v, variant, is_causal, bottom_right, scale, dropout_p, seed));
}

}  // namespace

TORCH_LIBRARY(flashlab, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, str variant, bool is_causal, bool bottom_right, float? scale, "
        "float dropout_p, int seed, bool deterministic) -> Tensor");
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, str variant, bool is_causal, bool bottom_right, "
        "float? scale, float dropout_p, int seed) -> (Tensor, Tensor)");
  m.def("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, str variant, "
        "bool is_causal, bool bottom_right, float? scale, float dropout_p, int seed, bool deterministic) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("fp8_attention_forward(Tensor q, Tensor k, Tensor v, Tensor q_descale, Tensor k_descale, Tensor v_descale, "
        "str variant, bool is_causal, bool bottom_right, float? scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(flashlab, CUDA, m) {
  m.impl("attention_forward", &forward_cuda);
  m.impl("attention_backward", &backward_cuda);
  m.impl("attention", &attention_no_grad);
  m.impl("fp8_attention_forward", &fp8_forward_cuda);
}

TORCH_LIBRARY_IMPL(flashlab, Meta, m) {
  m.impl("attention_forward", &forward_meta);
  m.impl("attention_backward", &backward_meta);
  m.impl("attention", &attention_no_grad);
  m.impl("fp8_attention_forward", &fp8_forward_meta);
}

// fp8_attention_forward has none: it is not differentiable, and its CUDA kernel refuses inputs that require grad.
TORCH_LIBRARY_IMPL(flashlab, Autograd, m) { m.impl("attention", &attention_autograd); }

}  // namespace flashlab::torch_ops
