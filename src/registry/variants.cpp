#include "registry/variants.hpp"

#include <algorithm>
#include <sstream>

#include "cpu_reference/cpu_variants.hpp"
#ifdef FLASHLAB_HAVE_CUDA
#include "cuda/cuda_variants.hpp"
#include "cuda/device.hpp"
#endif

namespace flashlab {

namespace {

template <std::size_t N>
std::vector<DType> dtypes_of(const DType (&list)[N]) {
  return {list, list + N};
}

constexpr Supports kEverything{.causal = true, .dropout = true, .gqa = true, .backward = true};

}  // namespace

const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = {
      {.name = "cpu-naive", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "standard attention: S and P materialized (Eigen)",
       .algorithm = Algorithm::Standard,
       .forward_fn = cpu_naive_forward, .backward_fn = cpu_naive_backward},
      {.name = "cpu-fa1", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "tiled, online softmax, K/V loop outer (FA1, Algorithm 1/4)",
       .algorithm = Algorithm::FA1,
       .forward_fn = cpu_fa1_forward, .backward_fn = cpu_fa1_backward},
      {.name = "cpu-fa2", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "tiled, online softmax, Q loop outer (FA2)",
       .algorithm = Algorithm::FA2,
       .forward_fn = cpu_fa2_forward, .backward_fn = cpu_fa2_backward},
#ifdef FLASHLAB_HAVE_CUDA
      // The CUDA rows take their dtypes and head dims from the kernels' own data (cuda/constraints.hpp).
      {.name = "cuda-naive", .device = Device::Cuda, .dtypes = dtypes_of(cuda::unfused::kDTypes),
       .supports = kEverything, .head_dims = HeadDims::range(1, cuda::unfused::kMaxHeadDim),
       .summary = "standard attention on the GPU: S and P in HBM, simple GEMM + softmax kernels",
       .algorithm = Algorithm::Standard,
       .forward_fn = cuda_naive_forward, .backward_fn = cuda_naive_backward, .bench_fn = cuda_naive_bench},
      {.name = "cuda-cublas", .device = Device::Cuda, .dtypes = dtypes_of(cuda::unfused::kDTypes),
       .supports = kEverything, .head_dims = HeadDims::range(1, cuda::unfused::kMaxHeadDim),
       .summary = "standard attention with cuBLAS SGEMMs: the fair unfused baseline", .algorithm = Algorithm::Standard,
       .forward_fn = cuda_cublas_forward, .backward_fn = cuda_cublas_backward, .bench_fn = cuda_cublas_bench},
      {.name = "cuda-fa1", .device = Device::Cuda, .dtypes = dtypes_of(cuda::simt::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cuda::simt::kMaxHeadDim),
       .summary = "FlashAttention-1 (Algorithms 2/4), fp32 CUDA cores, one block per (batch, head)",
       .algorithm = Algorithm::FA1,
       .forward_fn = cuda_fa1_forward, .backward_fn = cuda_fa1_backward, .bench_fn = cuda_fa1_bench},
      {.name = "cuda-fa2-simt", .device = Device::Cuda, .dtypes = dtypes_of(cuda::simt::kDTypes),
       .supports = kEverything, .head_dims = HeadDims::range(1, cuda::simt::kMaxHeadDim),
       .summary = "FlashAttention-2 loop order, fp32 CUDA cores, one block per (batch, head, Q block)",
       .algorithm = Algorithm::FA2,
       .forward_fn = cuda_fa2_simt_forward, .backward_fn = cuda_fa2_simt_backward, .bench_fn = cuda_fa2_simt_bench},
      {.name = "cuda-fa2", .device = Device::Cuda, .dtypes = dtypes_of(cuda::fa2::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::listed(cuda::fa2::kHeadDims),
       .summary = "FlashAttention-2 on tensor cores (mma.sync, ldmatrix, cp.async), fp32 accumulation",
       .algorithm = Algorithm::FA2,
       .forward_fn = cuda_fa2_forward, .backward_fn = cuda_fa2_backward, .bench_fn = cuda_fa2_bench},
#endif
  };
  return table;
}

const char* to_string(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

bool HeadDims::contains(int d) const {
  if (!only.empty()) return std::find(only.begin(), only.end(), d) != only.end();
  return d >= min && d <= max;
}

std::string HeadDims::describe() const {
  std::ostringstream os;
  if (only.empty()) {
    os << min << ".." << max;
  } else {
    for (std::size_t n = 0; n < only.size(); ++n) os << (n ? ", " : "") << only[n];
  }
  return os.str();
}

bool Variant::available() const { return device == Device::Cpu || cuda_device_present(); }

bool Variant::supports_dtype(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }

ForwardOut Variant::forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver* observer) const {
  check_supported(*this, p, dtype, false);
  check_dims(p.shape, in);
  return forward_fn(p, dtype, in, observer);
}

Grads Variant::backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd,
                        const HostTensor& dO) const {
  check_supported(*this, p, dtype, true);
  check_dims(p.shape, in, &dO);
  if (fwd.o.dims != q_dims(p.shape) || fwd.lse.dims != lse_dims(p.shape))
    throw InputError("the forward outputs passed to the " + name + " backward have shapes " + fwd.o.dims_string() +
                     " and " + fwd.lse.dims_string() + " but the problem needs O (B, S_q, H_q, D) and LSE (B, H_q, S_q)");
  return backward_fn(p, dtype, in, fwd, dO);
}

BenchResult Variant::bench(const Problem& p, DType dtype, const BenchSettings& settings) const {
  check_supported(*this, p, dtype, settings.backward);
  if (!has_device_timer())
    throw InputError("variant " + name + " has no device timer: flashlab bench times it from the host");
  return bench_fn(p, dtype, settings);
}

const Variant& find_variant(std::string_view name) {
  for (const Variant& v : variants())
    if (v.name == name) return v;
  std::string known;
  for (const Variant& v : variants()) known += (known.empty() ? "" : ", ") + v.name;
  throw InputError("unknown variant '" + std::string(name) + "': known variants are " + known);
}

void check_supported(const Variant& v, const Problem& p, DType dtype, bool backward) {
  validate(p);
  const std::string who = "variant " + v.name;
  if (!v.supports_dtype(dtype)) {
    std::string list;
    for (DType t : v.dtypes) list += (list.empty() ? "" : ", ") + std::string(to_string(t));
    throw InputError(who + " does not compute in " + to_string(dtype) + ": it supports " + list);
  }
  if (!v.head_dims.contains(p.shape.head_dim))
    throw InputError(who + " does not support head_dim " + std::to_string(p.shape.head_dim) +
                     ": it supports head dims " + v.head_dims.describe());
  if (p.options.causal != CausalAlign::None && !v.supports.causal)
    throw InputError(who + " does not support causal masking");
  if (p.options.dropout_p > 0 && !v.supports.dropout) throw InputError(who + " does not support dropout");
  if (p.shape.heads_q != p.shape.heads_kv && !v.supports.gqa)
    throw InputError(who + " needs heads_q == heads_kv (no grouped-query attention)");
  if (backward && !v.has_backward()) throw InputError(who + " has no backward pass");
  if (!v.available())
    throw InputError(who + " needs a CUDA GPU and none is available on this machine");
}

#ifdef FLASHLAB_HAVE_CUDA
bool cuda_device_present() { return cuda::device_present(); }
std::string cuda_device_name() { return cuda::device_name(); }
#else
bool cuda_device_present() { return false; }
std::string cuda_device_name() { return ""; }
#endif

}  // namespace flashlab
