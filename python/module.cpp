// _flashlab: the C++ half of `import flashlab` (flashlab/__init__.py is the public half and documents
// the API). Everything here is the library's own: the variant table and its checked entry points
// (registry/variants.hpp), `flashlab check` (registry/check.hpp), the layout and shape checks
// (core/layout.hpp) and the tolerance rule (core/tolerance.hpp). This file only converts:
//  * NumPy arrays are copied in and out (host_buffers.hpp): any variant, CUDA ones through the host path;
//  * DLPack tensors in GPU memory are read and written in place (dlpack_tensors.hpp): CUDA variants.
// Bad input (InputError, one sentence) becomes ValueError; failures of the device become RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iostream>  // with a statically linked libstdc++, pulls in the standard streams' initialization
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/fp8.hpp"
#include "core/layout.hpp"
#include "core/tolerance.hpp"
#include "cpu_reference/fp8.hpp"
#include "dlpack_tensors.hpp"
#include "host_buffers.hpp"
#include "registry/check.hpp"
#include "registry/variants.hpp"
#include "verify/verify.hpp"

namespace flashlab::python {
namespace {

// The options of a call as the Python API names them. is_causal turns the mask on; causal_align says
// which diagonal (top-left as PyTorch's is_causal, bottom-right as FlashAttention >= 2.1). deterministic
// is the backward's (dQ summed in a fixed order); forward calls pass false, since the forward ignores it.
Options options_of(bool is_causal, const std::string& causal_align, std::optional<double> scale, double dropout_p,
                   std::uint64_t seed, bool deterministic) {
  const CausalAlign align = parse_causal(causal_align);
  if (align == CausalAlign::None)
    throw InputError("causal_align is top-left or bottom-right (is_causal=False turns the mask off), not '" +
                     causal_align + "'");
  Options o;
  o.causal = is_causal ? align : CausalAlign::None;
  o.scale = scale_option(scale);
  o.dropout_p = dropout_p;
  o.seed = seed;
  o.deterministic = deterministic;
  return o;
}

// The LSE's dtype in results: f64 for an f64 run, f32 otherwise (as the kernels compute it).
DType lse_dtype(DType compute) { return compute == DType::F64 ? DType::F64 : DType::F32; }

// The one dtype of the arrays a pass computes in (q, k, v and dO); InputError when they disagree.
DType common_dtype(const std::vector<const HostInput*>& arrays) {
  const DType first = arrays.front()->dtype();
  for (const HostInput* a : arrays)
    if (a->dtype() != first)
      throw InputError(arrays.front()->dims().name + " is " + to_string(first) + " but " + a->dims().name + " is " +
                       to_string(a->dtype()) + ": pass them in one dtype, the one to compute in");
  return first;
}

// The dtype a call names (its dtype= argument): none, or parse_dtype's.
std::optional<DType> asked_dtype(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return parse_dtype(*name);
}

// A dtype named beside inputs of another: `how` says what the inputs compute in.
void require_asked_is_inputs(const std::optional<DType>& asked, DType inputs, const std::string& how) {
  if (asked && *asked != inputs)
    throw InputError(std::string("dtype is ") + to_string(*asked) + " but q, k, v are " + to_string(inputs) + ": " + how);
}

const char* const kHostDtypes =
    "NumPy arrays compute in their own dtype (f64, f32 or f16), or in e4m3 with dtype='e4m3', which quantizes them per "
    "head";

// A NumPy array of `values` with `dims` (row-major), copied.
template <class T>
py::array_t<T> numpy_of(const std::vector<T>& values, const std::vector<std::int64_t>& dims) {
  py::array_t<T> a(std::vector<py::ssize_t>(dims.begin(), dims.end()));
  std::copy(values.begin(), values.end(), a.mutable_data());
  return a;
}

// The FP8 forward's inputs as `flashlab run --save-quantized` writes them: q, k, v the e4m3 bytes as uint8
// (B, S, H, D), the descales float32 (B, H_q) and (B, H_kv).
py::dict quantized_arrays(const Shape& s, const E4m3Qkv& in) {
  py::dict d;
  d["q"] = numpy_of(in.q, q_dims(s));
  d["k"] = numpy_of(in.k, kv_dims(s));
  d["v"] = numpy_of(in.v, kv_dims(s));
  d["q_descale"] = numpy_of(in.q_descale, {s.batch, s.heads_q});
  d["k_descale"] = numpy_of(in.k_descale, {s.batch, s.heads_kv});
  d["v_descale"] = numpy_of(in.v_descale, {s.batch, s.heads_kv});
  return d;
}

// The FP8 forward on NumPy values, as `flashlab run --dtype e4m3` runs it: quantized per head (quantize_e4m3_qkv),
// then the row's FP8 forward. O's bf16 values come back as float32 (NumPy has no bfloat16), the LSE as float32.
py::tuple forward_host_e4m3(const Variant& var, Layout layout, const Problem& p, const HostInput& q, const HostInput& k,
                            const HostInput& v, bool return_quantized) {
  for (const HostInput* a : {&q, &k, &v}) a->dtype();  // values in float64, float32 or float16, each
  check_supported(var, p, DType::E4M3, false);      // before quantizing, as flashlab run
  const Qkv in{q.to_host_tensor(layout), k.to_host_tensor(layout), v.to_host_tensor(layout)};
  const E4m3Qkv quantized = quantize_e4m3_qkv(in);  // a NaN or Inf is one sentence: it would be its head's amax
  ForwardOut out;
  {
    py::gil_scoped_release no_gil;
    out = var.forward_e4m3(p, quantized);
  }
  return py::make_tuple(HostArray(out.o, DType::F32, layout), HostArray(out.lse, DType::F32, layout),
                        return_quantized ? py::object(quantized_arrays(p.shape, quantized)) : py::none());
}

// (o, lse, the quantized inputs or None).
py::tuple forward_host(const py::buffer& q_array, const py::buffer& k_array, const py::buffer& v_array,
                       const std::string& variant, const std::string& layout_name, const Options& options,
                       const std::optional<std::string>& dtype_name, bool return_quantized) {
  const Variant& var = find_variant(variant);
  const Layout layout = parse_layout(layout_name);
  const std::optional<DType> asked = asked_dtype(dtype_name);
  const bool e4m3 = asked == DType::E4M3;
  if (return_quantized && !e4m3)
    throw InputError("return_quantized returns the e4m3 inputs of an FP8 forward: pass dtype='e4m3' too");
  const HostInput q(q_array, "q"), k(k_array, "k"), v(v_array, "v");
  Problem p;
  p.shape = shape_of_inputs(layout, q.dims(), k.dims(), v.dims());
  p.options = options;
  if (e4m3) return forward_host_e4m3(var, layout, p, q, k, v, return_quantized);
  const DType dtype = common_dtype({&q, &k, &v});
  require_asked_is_inputs(asked, dtype, kHostDtypes);
  const Qkv in{q.to_host_tensor(layout), k.to_host_tensor(layout), v.to_host_tensor(layout)};
  ForwardOut out;
  {
    py::gil_scoped_release no_gil;
    out = var.forward(p, dtype, in);
  }
  return py::make_tuple(HostArray(out.o, dtype, layout), HostArray(out.lse, lse_dtype(dtype), layout), py::none());
}

py::tuple backward_host(const py::buffer& q_array, const py::buffer& k_array, const py::buffer& v_array,
                        const py::buffer& o_array, const py::buffer& lse_array, const py::buffer& d_o_array,
                        const std::string& variant, const std::string& layout_name, const Options& options,
                        const std::optional<std::string>& dtype_name) {
  const Variant& var = find_variant(variant);
  const Layout layout = parse_layout(layout_name);
  const std::optional<DType> asked = asked_dtype(dtype_name);
  const HostInput q(q_array, "q"), k(k_array, "k"), v(v_array, "v"), o(o_array, "out"), lse(lse_array, "lse"),
      d_o(d_o_array, "grad_out");
  Problem p;
  const InputDims d_o_dims = d_o.dims();
  p.shape = shape_of_inputs(layout, q.dims(), k.dims(), v.dims(), &d_o_dims);
  check_forward_outputs(layout, p.shape, o.dims(), lse.dims());
  p.options = options;
  if (asked == DType::E4M3) {
    check_supported(var, p, DType::E4M3, true);  // the registry's sentence: there is no FP8 backward
    throw std::logic_error("check_supported let an e4m3 backward through");
  }
  const DType dtype = common_dtype({&q, &k, &v, &d_o});
  require_asked_is_inputs(asked, dtype, kHostDtypes);
  const Qkv in{q.to_host_tensor(layout), k.to_host_tensor(layout), v.to_host_tensor(layout)};
  // The forward's outputs are read in whichever float dtype they come.
  const ForwardOut fwd{o.to_host_tensor(layout), lse.to_host_tensor(layout)};
  const HostTensor dO = d_o.to_host_tensor(layout);
  Grads g;
  {
    py::gil_scoped_release no_gil;
    g = var.backward(p, dtype, in, fwd, dO);
  }
  return py::make_tuple(HostArray(g.dq, dtype, layout), HostArray(g.dk, dtype, layout), HostArray(g.dv, dtype, layout));
}

// The device pointers the last device call handed to the kernels: a test compares them with its tensors'
// own (no copy was made).
py::dict& last_device_call() {
  static py::dict* call = new py::dict();  // never destroyed: it outlives the interpreter's teardown order
  return *call;
}

// The results go into the caller's buffers where given (o_out, lse_out), else into new DeviceArrays,
// which are returned (None for a result written into a given buffer).
const char* const kDeviceDtypes =
    "GPU tensors compute in their own dtype, so pass them in the one to compute in (e4m3: torch.float8_e4m3fn, or uint8 "
    "holding e4m3 bytes with dtype='e4m3')";

// The device pointers of a call, by name, into last_device_call().
void record_device_call(const Variant& var, std::initializer_list<std::pair<const char*, const void*>> pointers) {
  py::dict& call = last_device_call();
  call.clear();
  call["variant"] = var.name;
  for (auto [name, data] : pointers) call[name] = reinterpret_cast<std::uintptr_t>(data);
}

// One descale of the FP8 forward, checked: float32 (B, H) row-major, on the inputs' device.
DeviceInput e4m3_descale(const py::capsule& capsule, const char* name, std::vector<std::int64_t> dims,
                         const char* extents, int device) {
  DeviceInput t(capsule, name);
  check_e4m3_descale(name, t.dims().dims, std::string(to_string(t.dtype())), dims, extents);
  if (t.device() != device)
    throw InputError(std::string(name) + " is on CUDA device " + std::to_string(t.device()) +
                     " but q is on CUDA device " + std::to_string(device) + ": pass every tensor on one device");
  t.require_kernel_layout(Layout::BSHD);  // 2-d: row-major as it is
  return t;
}

// The FP8 forward on e4m3 tensors in GPU memory with their checked descales: O bf16, LSE f32.
py::tuple forward_device_e4m3(const Variant& var, Layout layout, const Problem& p, const DeviceInput& tq,
                              const DeviceInput& tk, const DeviceInput& tv, const DeviceInput& dq, const DeviceInput& dk,
                              const DeviceInput& dv, const std::optional<py::capsule>& o_out,
                              const std::optional<py::capsule>& lse_out) {
  const int device = tq.device();
  ResultBuffer o(o_out, "out", tq.dims().dims, layout, DType::BF16, device);
  ResultBuffer lse(lse_out, "lse", lse_dims(p.shape), layout, DType::F32, device);
  o.require_apart_from({&tq, &tk, &tv, &dq, &dk, &dv});
  lse.require_apart_from({&tq, &tk, &tv, &dq, &dk, &dv});
  const DeviceForwardIo io{device, tq.data(), tk.data(), tv.data(), o.data(), static_cast<float*>(lse.data())};
  const DeviceE4m3Descales descales{static_cast<const float*>(dq.data()), static_cast<const float*>(dk.data()),
                                    static_cast<const float*>(dv.data())};
  {
    py::gil_scoped_release no_gil;
    var.forward_e4m3_on_device(p, io, descales);
  }
  record_device_call(var, {{"q", io.q}, {"k", io.k}, {"v", io.v}, {"out", io.o}, {"lse", io.lse},
                           {"q_descale", descales.q}, {"k_descale", descales.k}, {"v_descale", descales.v}});
  return py::make_tuple(o.release(), lse.release());
}

py::tuple forward_device(const py::capsule& q, const py::capsule& k, const py::capsule& v,
                         const std::optional<py::capsule>& q_descale, const std::optional<py::capsule>& k_descale,
                         const std::optional<py::capsule>& v_descale, const std::optional<py::capsule>& o_out,
                         const std::optional<py::capsule>& lse_out, const std::string& variant,
                         const std::string& layout_name, const Options& options,
                         const std::optional<std::string>& dtype_name) {
  const Variant& var = find_variant(variant);
  const Layout layout = parse_layout(layout_name);
  const std::optional<DType> asked = asked_dtype(dtype_name);
  const bool uint8_is_e4m3 = asked == DType::E4M3;
  const DeviceInput tq(q, "q", uint8_is_e4m3), tk(k, "k", uint8_is_e4m3), tv(v, "v", uint8_is_e4m3);
  Problem p;
  p.shape = shape_of_inputs(layout, tq.dims(), tk.dims(), tv.dims());
  p.options = options;
  require_same_dtype_and_device({&tq, &tk, &tv});
  for (const DeviceInput* t : {&tq, &tk, &tv}) t->require_kernel_layout(layout);
  const DType dtype = tq.dtype();
  require_asked_is_inputs(asked, dtype, kDeviceDtypes);
  if (dtype != DType::E4M3 && (q_descale || k_descale || v_descale))
    throw InputError(std::string("q_descale, k_descale and v_descale are the FP8 forward's, but q, k, v are ") +
                     to_string(dtype) + ": pass e4m3 tensors (torch.float8_e4m3fn) with them, or drop them");
  const int device = tq.device();
  // The descales of a row with an FP8 forward are checked before the GPU is asked about (a missing one is the
  // registry's sentence); a row without one is refused by check_device_call, before any descale is read.
  std::optional<DeviceInput> dq, dk, dv;
  if (dtype == DType::E4M3 && var.device == Device::Cuda && var.supports_dtype(DType::E4M3)) {
    const Shape& s = p.shape;
    require_e4m3_descales(var, q_descale.has_value(), k_descale.has_value(), v_descale.has_value());
    dq.emplace(e4m3_descale(*q_descale, "q_descale", {s.batch, s.heads_q}, "(B, H_q)", device));
    dk.emplace(e4m3_descale(*k_descale, "k_descale", {s.batch, s.heads_kv}, "(B, H_kv)", device));
    dv.emplace(e4m3_descale(*v_descale, "v_descale", {s.batch, s.heads_kv}, "(B, H_kv)", device));
  }
  var.check_device_call(p, dtype, device, false);  // before allocating the outputs
  if (dtype == DType::E4M3) return forward_device_e4m3(var, layout, p, tq, tk, tv, *dq, *dk, *dv, o_out, lse_out);
  ResultBuffer o(o_out, "out", tq.dims().dims, layout, dtype, device);
  ResultBuffer lse(lse_out, "lse", lse_dims(p.shape), layout, DType::F32, device);
  o.require_apart_from({&tq, &tk, &tv});
  lse.require_apart_from({&tq, &tk, &tv});
  const DeviceForwardIo io{device, tq.data(), tk.data(), tv.data(), o.data(), static_cast<float*>(lse.data())};
  {
    py::gil_scoped_release no_gil;
    var.forward_on_device(p, dtype, io);
  }
  record_device_call(var, {{"q", io.q}, {"k", io.k}, {"v", io.v}, {"out", io.o}, {"lse", io.lse}});
  return py::make_tuple(o.release(), lse.release());
}

py::tuple backward_device(const py::capsule& q, const py::capsule& k, const py::capsule& v, const py::capsule& o,
                          const py::capsule& lse, const py::capsule& d_o, const std::optional<py::capsule>& dq_out,
                          const std::optional<py::capsule>& dk_out, const std::optional<py::capsule>& dv_out,
                          const std::string& variant, const std::string& layout_name, const Options& options,
                          const std::optional<std::string>& dtype_name) {
  const Variant& var = find_variant(variant);
  const Layout layout = parse_layout(layout_name);
  const std::optional<DType> asked = asked_dtype(dtype_name);
  const bool uint8_is_e4m3 = asked == DType::E4M3;
  const DeviceInput tq(q, "q", uint8_is_e4m3), tk(k, "k", uint8_is_e4m3), tv(v, "v", uint8_is_e4m3), to(o, "out"),
      tlse(lse, "lse"), tdo(d_o, "grad_out");
  Problem p;
  const InputDims d_o_dims = tdo.dims();
  p.shape = shape_of_inputs(layout, tq.dims(), tk.dims(), tv.dims(), &d_o_dims);
  check_forward_outputs(layout, p.shape, to.dims(), tlse.dims());
  p.options = options;
  if (tq.dtype() == DType::E4M3) {  // before the dtypes are compared: O of an FP8 forward is bf16
    check_supported(var, p, DType::E4M3, true);  // the registry's sentence, GPU or not: there is no FP8 backward
    throw std::logic_error("check_supported let an e4m3 backward through");
  }
  require_asked_is_inputs(asked, tq.dtype(), kDeviceDtypes);
  require_same_dtype_and_device({&tq, &tk, &tv, &to, &tdo});
  if (tlse.device() != tq.device())  // lse is f32 whatever q is (checked below)
    throw InputError("q is on CUDA device " + std::to_string(tq.device()) + " but lse is on CUDA device " +
                     std::to_string(tlse.device()) + ": pass every tensor on one device");
  for (const DeviceInput* t : {&tq, &tk, &tv, &to, &tlse, &tdo}) t->require_kernel_layout(layout);
  if (tlse.dtype() != DType::F32)
    throw InputError("lse is " + std::string(to_string(tlse.dtype())) +
                     " but the kernels read the forward's lse as it returns it, f32");
  const DType dtype = tq.dtype();
  const int device = tq.device();
  var.check_device_call(p, dtype, device, true);  // before allocating the outputs
  ResultBuffer dq(dq_out, "dq", tq.dims().dims, layout, dtype, device);
  ResultBuffer dk(dk_out, "dk", tk.dims().dims, layout, dtype, device);
  ResultBuffer dv(dv_out, "dv", tv.dims().dims, layout, dtype, device);
  for (const ResultBuffer* grad : {&dq, &dk, &dv}) grad->require_apart_from({&tq, &tk, &tv, &to, &tlse, &tdo});
  const DeviceBackwardIo io{device,   tq.data(), tk.data(), tv.data(), to.data(), static_cast<const float*>(tlse.data()),
                            tdo.data(), dq.data(), dk.data(), dv.data()};
  {
    py::gil_scoped_release no_gil;
    var.backward_on_device(p, dtype, io);
  }
  record_device_call(var, {{"q", io.q}, {"k", io.k}, {"v", io.v}, {"out", io.o}, {"lse", io.lse}, {"grad_out", io.d_o},
                           {"dq", io.dq}, {"dk", io.dk}, {"dv", io.dv}});
  return py::make_tuple(dq.release(), dk.release(), dv.release());
}

// Every head dim in [1, 256] that dims accepts.
std::vector<int> head_dim_values(const HeadDims& dims) {
  std::vector<int> values;
  for (int d = 1; d <= 256; ++d)
    if (dims.contains(d)) values.push_back(d);
  return values;
}

py::list variant_table() {
  py::list rows;
  for (const Variant& v : variants()) {
    std::vector<std::string> dtypes;
    for (DType t : v.dtypes) dtypes.push_back(to_string(t));
    py::dict row;
    row["name"] = v.name;
    row["device"] = to_string(v.device);
    row["dtypes"] = dtypes;
    row["causal"] = v.supports.causal;
    row["dropout"] = v.supports.dropout;
    row["gqa"] = v.supports.gqa;
    row["backward"] = v.has_backward();
    row["deterministic"] = v.supports.deterministic;
    row["head_dims"] = v.head_dims.describe();
    row["head_dim_values"] = head_dim_values(v.head_dims);
    const HeadDims& backward_head_dims = v.backward_head_dims.value_or(v.head_dims);
    row["backward_head_dims"] = backward_head_dims.describe();
    row["backward_head_dim_values"] = head_dim_values(backward_head_dims);
    // The head dims of its FP8 (e4m3) forward (empty without one).
    row["e4m3_head_dims"] = v.e4m3_head_dims ? v.e4m3_head_dims->describe() : std::string();
    row["e4m3_head_dim_values"] = v.e4m3_head_dims ? head_dim_values(*v.e4m3_head_dims) : std::vector<int>();
    row["available"] = v.available();
    // Whether it runs on a caller's stream without waiting (what flashlab.torch's operators need).
    row["runs_on_caller_stream"] = v.runs_on_caller_stream();
    row["needs_compute_capability"] = v.needs_compute_capability;
    row["summary"] = v.summary;
    rows.append(row);
  }
  return rows;
}

py::list check(int batch, int heads, std::optional<int> heads_kv, int seq_q, std::optional<int> seq_k, int head_dim,
               const std::string& causal, std::optional<double> scale, double dropout_p, std::uint64_t seed,
               std::optional<std::string> dtype, const std::vector<std::string>& variant_names, bool backward,
               bool deterministic) {
  CheckRequest request;
  request.problem.shape = Shape{.batch = batch,
                                .heads_q = heads,
                                .heads_kv = heads_kv.value_or(heads),
                                .seq_q = seq_q,
                                .seq_k = seq_k.value_or(seq_q),
                                .head_dim = head_dim};
  request.problem.options = Options{.causal = parse_causal(causal),
                                    .scale = scale_option(scale),
                                    .dropout_p = dropout_p,
                                    .seed = seed,
                                    .deterministic = deterministic};
  if (dtype) request.dtype = parse_dtype(*dtype);
  for (const std::string& name : variant_names) request.variants.push_back(&find_variant(name));
  request.backward = backward;
  const Check planned(std::move(request));
  CheckReport report;
  {
    py::gil_scoped_release no_gil;
    report = planned.run();
  }
  py::list rows;
  const auto number = [](const std::optional<double>& x) { return x ? py::cast(*x) : py::none(); };
  for (const CheckRow& r : report.rows) {
    py::dict row;
    row["variant"] = r.variant;
    row["device"] = r.device;
    row["dtype"] = r.dtype;
    row["output"] = r.output;
    row["max_abs_error"] = number(r.max_abs_error);
    row["rel_error"] = number(r.rel_error);
    row["bound"] = r.bound.empty() ? py::none() : py::cast(r.bound);
    row["result"] = r.result;
    rows.append(row);
  }
  return rows;
}

Quantity parse_quantity(const std::string& text) {
  if (text == "forward") return Quantity::Forward;
  if (text == "gradient") return Quantity::Gradient;
  throw InputError("unknown quantity '" + text + "': supported are forward (O, LSE) and gradient (dQ, dK, dV)");
}

py::dict within_tolerance(const py::buffer& out, const py::buffer& ref, const std::string& dtype,
                          const std::string& quantity, const std::optional<py::buffer>& lowp) {
  const HostTensor o = HostInput(out, "out").to_host_tensor(Layout::BSHD);
  const HostTensor r = HostInput(ref, "ref").to_host_tensor(Layout::BSHD);
  if (o.dims != r.dims)
    throw InputError("out has shape " + o.dims_string() + " but ref has shape " + r.dims_string());
  const ErrorStats e = compare(o, r);
  std::optional<ErrorStats> baseline;
  if (lowp) {
    const HostTensor l = HostInput(*lowp, "lowp").to_host_tensor(Layout::BSHD);
    if (l.dims != r.dims)
      throw InputError("lowp has shape " + l.dims_string() + " but ref has shape " + r.dims_string());
    baseline = compare(l, r);
  }
  const Bound bound = tolerance(parse_dtype(dtype), parse_quantity(quantity), e, baseline ? &*baseline : nullptr);
  py::dict result;
  result["passes"] = bound.passes(e);
  result["max_abs_error"] = e.max_abs;
  result["rel_error"] = e.rel;
  result["has_nan"] = e.has_nan;
  result["limit"] = bound.limit;
  result["on"] = bound.uses_rel ? "rel_error" : "max_abs_error";
  result["rule"] = bound.rule;
  if (baseline) result["lowp_max_abs_error"] = baseline->max_abs;
  return result;
}

// The rule an FP8 forward is held to (cpu_reference/fp8.hpp, check_fp8_kernel): the CPU emulation of the same
// FP8 arithmetic on q, k, v quantized per head, both it and `out`, `lse` measured against naive attention in double
// on the dequantized inputs.
py::dict within_fp8_rule(const py::buffer& q_array, const py::buffer& k_array, const py::buffer& v_array,
                         const py::buffer& out_array, const py::buffer& lse_array, const std::string& layout_name,
                         const Options& options) {
  const Layout layout = parse_layout(layout_name);
  const HostInput q(q_array, "q"), k(k_array, "k"), v(v_array, "v"), out(out_array, "out"), lse(lse_array, "lse");
  Problem p;
  p.shape = shape_of_inputs(layout, q.dims(), k.dims(), v.dims());
  check_forward_outputs(layout, p.shape, out.dims(), lse.dims());
  p.options = options;
  validate(p);
  const Qkv in{q.to_host_tensor(layout), k.to_host_tensor(layout), v.to_host_tensor(layout)};
  const ForwardOut kernel{out.to_host_tensor(layout), lse.to_host_tensor(layout)};
  Fp8KernelCheck c;
  {
    py::gil_scoped_release no_gil;
    c = check_fp8_kernel(p, fp8_attention_emulated(p, in, fp8_kernel_order(p.shape.head_dim)), kernel);
  }
  py::dict result;
  result["passes"] = c.passes();
  result["o_max_abs_error"] = c.o.max_abs;
  result["o_rmse"] = c.o.rmse;
  result["o_limit"] = c.o_limit;
  result["lse_max_abs_error"] = c.lse.max_abs;
  result["lse_limit"] = c.lse_limit;
  result["emulation_o_max_abs_error"] = c.emulation.o.max_abs;
  result["emulation_o_rmse"] = c.emulation.o.rmse;
  result["emulation_lse_max_abs_error"] = c.emulation.lse.max_abs;
  result["emulation_o_bound"] = c.emulation.bounds.o_max_abs;
  result["emulation_lse_bound"] = c.emulation.bounds.lse_max_abs;
  result["emulation_passes"] = c.emulation.passes();
  return result;
}

// ---- flashlab.verify: the caller's Python functions as the kernel under test ----------------------------------
// The functions get and return float64 NumPy arrays, (B, S, H, D) and (B, H, S_q) for the LSE;
// flashlab/__init__.py casts them to each case's dtype and layout around the caller's own function. A
// NotImplementedError from it is a refusal (the case is listed, not failed); any other exception fails the case.

py::array_t<double> to_numpy(const HostTensor& t) { return py::array_t<double>(t.dims, t.data.data()); }

HostTensor from_numpy(const py::handle& value, const std::string& what) {
  const auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(value);
  if (!a) throw std::runtime_error(what + " is not an array of numbers");
  HostTensor t(std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim()));
  std::copy(a.data(), a.data() + a.size(), t.data.begin());
  return t;
}

// Calls f, turning its NotImplementedError into a KernelRefusal.
template <class F>
auto calling_python(F&& f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_NotImplementedError)) throw KernelRefusal(py::str(e.value()).cast<std::string>());
    throw;
  }
}

py::dict verify_python(const py::function& forward, const py::object& backward, const std::string& name,
                       const std::vector<std::string>& dtypes, const std::vector<int>& head_dims,
                       const std::string& suite, std::uint64_t seed) {
  KernelUnderTest kernel;
  kernel.name = name;
  const auto options = [](const Problem& p, DType dtype) {
    return py::make_tuple(to_string(dtype), to_string(p.options.causal), p.softmax_scale());
  };
  kernel.forward = [&](const Problem& p, DType dtype, const Qkv& in) {
    return calling_python([&] {
      const py::tuple result = forward(to_numpy(in.q), to_numpy(in.k), to_numpy(in.v), *options(p, dtype));
      ForwardOut out;
      out.o = from_numpy(result[0], "the output O");
      if (!result[1].is_none()) out.lse = from_numpy(result[1], "the LSE");
      return out;
    });
  };
  if (!backward.is_none())
    kernel.backward = [&](const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& d_o) {
      return calling_python([&] {
        const py::tuple g = backward(to_numpy(in.q), to_numpy(in.k), to_numpy(in.v), to_numpy(fwd.o), to_numpy(fwd.lse),
                                     to_numpy(d_o), *options(p, dtype));
        return Grads{from_numpy(g[0], "dq"), from_numpy(g[1], "dk"), from_numpy(g[2], "dv")};
      });
    };
  VerifyRequest request;
  request.suite = parse_verify_suite(suite);
  request.seed = seed;
  request.dtypes.clear();
  for (const std::string& d : dtypes) {
    const DType t = parse_dtype(d);
    if (t == DType::F64 || t == DType::E4M3)
      throw InputError(std::string("verify tries f32, f16 and bf16, not ") + to_string(t));
    request.dtypes.push_back(t);
  }
  request.head_dims = head_dims;
  const VerifyReport report = verify(kernel, request);

  py::dict out;
  out["kernel"] = report.kernel;
  out["suite"] = suite;
  out["seed"] = report.seed;
  out["passed"] = report.passed;
  out["failed"] = report.failed;
  out["ok"] = report.ok();
  py::list refused;
  for (const Refusal& r : report.refused)
    refused.append(py::dict(py::arg("dtype") = to_string(r.dtype), py::arg("head_dim") = r.head_dim, py::arg("why") = r.why,
                            py::arg("case") = r.case_label.empty() ? py::none() : py::cast(r.case_label)));
  out["refused"] = refused;
  py::list cases;
  for (const VerifyCaseResult& r : report.cases) {
    const Shape& s = r.c.problem.shape;
    py::list outputs;
    for (const VerifyOutput& o : r.outputs)
      outputs.append(py::dict(py::arg("name") = o.name, py::arg("max_abs_error") = o.error.max_abs,
                              py::arg("rel_error") = o.error.rel, py::arg("bound") = o.bound, py::arg("passes") = o.pass));
    cases.append(py::dict(py::arg("case") = describe(r.c), py::arg("dtype") = to_string(r.c.dtype),
                          py::arg("batch") = s.batch, py::arg("heads_q") = s.heads_q, py::arg("heads_kv") = s.heads_kv,
                          py::arg("seq_q") = s.seq_q, py::arg("seq_k") = s.seq_k, py::arg("head_dim") = s.head_dim,
                          py::arg("causal") = to_string(r.c.problem.options.causal), py::arg("passes") = r.pass(),
                          py::arg("error") = r.error.empty() ? py::none() : py::cast(r.error), py::arg("outputs") = outputs));
  }
  out["cases"] = cases;
  out["diagnosis"] = report.diagnosis ? py::object(py::dict(py::arg("id") = report.diagnosis->id,
                                                            py::arg("sentence") = report.diagnosis->sentence))
                                      : py::none();
  if (report.first_failure) {
    const ElementFailure& f = *report.first_failure;
    out["first_failure"] = py::dict(py::arg("case") = f.case_label, py::arg("output") = f.output,
                                    py::arg("index") = f.index, py::arg("ours") = f.ours, py::arg("reference") = f.reference);
  } else {
    out["first_failure"] = py::none();
  }
  out["text"] = verify_report_text(report, "Python");
  return out;
}

}  // namespace
}  // namespace flashlab::python

PYBIND11_MODULE(_flashlab, m) {
  namespace py = pybind11;
  using namespace flashlab;
  using namespace flashlab::python;
  m.doc() = "FlashLab's C++ library: see the flashlab package for the API.";

  // InputError derives from std::runtime_error, which pybind11 turns into RuntimeError: bad input is a
  // ValueError instead, with the library's one sentence.
  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  // The forward's options: it ignores deterministic, so its calls do not take it.
  const auto forward_options = [](bool is_causal, const std::string& causal_align, std::optional<double> scale,
                                  double dropout_p, std::uint64_t seed) {
    return options_of(is_causal, causal_align, scale, dropout_p, seed, false);
  };
  m.def(
      "forward_host",
      [forward_options](const py::buffer& q, const py::buffer& k, const py::buffer& v, const std::string& variant,
                        const std::string& layout, bool is_causal, const std::string& causal_align,
                        std::optional<double> scale, double dropout_p, std::uint64_t seed,
                        const std::optional<std::string>& dtype, bool return_quantized) {
        return forward_host(q, k, v, variant, layout, forward_options(is_causal, causal_align, scale, dropout_p, seed),
                            dtype, return_quantized);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("variant"), py::arg("layout"), py::arg("is_causal"),
      py::arg("causal_align"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"), py::arg("dtype"),
      py::arg("return_quantized"),
      "(o, lse, quantized) from arrays q, k, v (buffer protocol): copied in, any variant; o and lse HostArrays. dtype "
      "'e4m3' quantizes them per head and runs the FP8 forward (o: its bf16 values as float32); quantized is then, "
      "with return_quantized, a dict of its inputs (uint8 bytes (B, S, H, D), float32 descales), else None.");
  m.def(
      "backward_host",
      [](const py::buffer& q, const py::buffer& k, const py::buffer& v, const py::buffer& o, const py::buffer& lse,
         const py::buffer& d_o, const std::string& variant, const std::string& layout, bool is_causal,
         const std::string& causal_align, std::optional<double> scale, double dropout_p, std::uint64_t seed,
         bool deterministic, const std::optional<std::string>& dtype) {
        return backward_host(q, k, v, o, lse, d_o, variant, layout,
                             options_of(is_causal, causal_align, scale, dropout_p, seed, deterministic), dtype);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("grad_out"),
      py::arg("variant"), py::arg("layout"), py::arg("is_causal"), py::arg("causal_align"), py::arg("scale"),
      py::arg("dropout_p"), py::arg("seed"), py::arg("deterministic"), py::arg("dtype"),
      "(dq, dk, dv) as HostArrays, from arrays: copied in, any variant with a backward.");
  m.def(
      "forward_device",
      [forward_options](const py::capsule& q, const py::capsule& k, const py::capsule& v,
                        const std::optional<py::capsule>& q_descale, const std::optional<py::capsule>& k_descale,
                        const std::optional<py::capsule>& v_descale, const std::optional<py::capsule>& o,
                        const std::optional<py::capsule>& lse, const std::string& variant, const std::string& layout,
                        bool is_causal, const std::string& causal_align, std::optional<double> scale,
                        double dropout_p, std::uint64_t seed, const std::optional<std::string>& dtype) {
        return forward_device(q, k, v, q_descale, k_descale, v_descale, o, lse, variant, layout,
                              forward_options(is_causal, causal_align, scale, dropout_p, seed), dtype);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_descale"), py::arg("k_descale"), py::arg("v_descale"),
      py::arg("o_out"), py::arg("lse_out"), py::arg("variant"), py::arg("layout"), py::arg("is_causal"),
      py::arg("causal_align"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"), py::arg("dtype"),
      "(o, lse) from DLPack capsules of CUDA tensors read in place: new DeviceArrays, or None for a result "
      "written into the buffer given for it. e4m3 tensors (or uint8 with dtype 'e4m3') run the FP8 forward with "
      "their descales' capsules: o bf16, lse f32.");
  m.def(
      "backward_device",
      [](const py::capsule& q, const py::capsule& k, const py::capsule& v, const py::capsule& o,
         const py::capsule& lse, const py::capsule& d_o, const std::optional<py::capsule>& dq,
         const std::optional<py::capsule>& dk, const std::optional<py::capsule>& dv, const std::string& variant,
         const std::string& layout, bool is_causal, const std::string& causal_align, std::optional<double> scale,
         double dropout_p, std::uint64_t seed, bool deterministic, const std::optional<std::string>& dtype) {
        return backward_device(q, k, v, o, lse, d_o, dq, dk, dv, variant, layout,
                               options_of(is_causal, causal_align, scale, dropout_p, seed, deterministic), dtype);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("grad_out"),
      py::arg("dq_out"), py::arg("dk_out"), py::arg("dv_out"), py::arg("variant"), py::arg("layout"),
      py::arg("is_causal"), py::arg("causal_align"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"),
      py::arg("deterministic"), py::arg("dtype"),
      "(dq, dk, dv) from DLPack capsules read in place: new DeviceArrays, or None where a buffer was given.");
  m.def(
      "within_fp8_rule",
      [forward_options](const py::buffer& q, const py::buffer& k, const py::buffer& v, const py::buffer& out,
                        const py::buffer& lse, const std::string& layout, bool is_causal,
                        const std::string& causal_align, std::optional<double> scale) {
        return within_fp8_rule(q, k, v, out, lse, layout, forward_options(is_causal, causal_align, scale, 0.0, 0));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("layout"),
      py::arg("is_causal"), py::arg("causal_align"), py::arg("scale"),
      "check_fp8_kernel (cpu_reference/fp8.hpp) applied to an FP8 forward's out and lse for the values q, k, v.");
  m.def("last_device_call", [] { return last_device_call().attr("copy")(); },
        "The device pointers the last device call handed to the kernels (for tests).");
  m.def("variants", &variant_table, "The variant table, one dict per row.");
  m.def("check", &check, py::arg("batch"), py::arg("heads"), py::arg("heads_kv"), py::arg("seq_q"), py::arg("seq_k"),
        py::arg("head_dim"), py::arg("causal"), py::arg("scale"), py::arg("dropout_p"), py::arg("seed"),
        py::arg("dtype"), py::arg("variants"), py::arg("backward"), py::arg("deterministic"),
        "flashlab check's rows, one dict each.");
  m.def("within_tolerance", &within_tolerance, py::arg("out"), py::arg("ref"), py::arg("dtype"), py::arg("quantity"),
        py::arg("lowp"), "The tolerance rule of core/tolerance.hpp applied to out against ref.");
  m.def("verify", &verify_python, py::arg("forward"), py::arg("backward"), py::arg("name"), py::arg("dtypes"),
        py::arg("head_dims"), py::arg("suite"), py::arg("seed"),
        "flashlab.verify's engine: forward(q, k, v, dtype, causal, scale) -> (o, lse or None) and backward(q, k, v, "
        "o, lse, do, dtype, causal, scale) -> (dq, dk, dv) on float64 (B, S, H, D) arrays; returns the report as a dict.");
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_device_name", &cuda_device_name);
#ifdef FLASHLAB_HAVE_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  py::class_<HostArray>(m, "HostArray", py::buffer_protocol(),
                        "A result in host memory: np.asarray reads its buffer without a copy.")
      .def_buffer(&HostArray::buffer);

  py::class_<DeviceArray>(m, "DeviceArray",
                          "A result in GPU memory: read it with torch.from_dlpack or cupy.from_dlpack (no copy).")
      .def_property_readonly("shape", [](const DeviceArray& a) { return py::tuple(py::cast(a.shape())); })
      .def_property_readonly("strides", [](const DeviceArray& a) { return py::tuple(py::cast(a.strides())); },
                             "in elements")
      .def_property_readonly("dtype", [](const DeviceArray& a) { return std::string(to_string(a.dtype())); })
      .def_property_readonly("device", &DeviceArray::device, "the CUDA device ordinal")
      .def_property_readonly("data_ptr", [](const DeviceArray& a) { return reinterpret_cast<std::uintptr_t>(a.data()); })
      .def("__dlpack__", &DeviceArray::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &DeviceArray::dlpack_device)
      .def("__repr__", [](const DeviceArray& a) {
        std::string shape;
        for (std::int64_t d : a.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        return "DeviceArray(shape=(" + shape + "), dtype=" + to_string(a.dtype()) + ", device=cuda:" +
               std::to_string(a.device()) + ")";
      });
}
