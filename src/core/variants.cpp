#include "variants.hpp"

#include <algorithm>
#include <sstream>

#include "../cpu_reference/cpu_variants.hpp"
#ifdef FLASHLAB_HAVE_CUDA
#include "../cuda/cuda_variants.hpp"
#endif

namespace flashlab {

const std::vector<Variant>& variants() {
  using enum DType;
  static const std::vector<Variant> table = {
      // name, device, dtypes, {causal, dropout, gqa, backward}, head dims, summary, loop nest,
      // forward, backward, bench
      {"cpu-naive", Device::Cpu, {F64, F32}, {true, true, true, true}, {1, 256, {}},
       "standard attention: S and P materialized (Eigen)", Algorithm::Standard,
       cpu_naive_forward, cpu_naive_backward, nullptr},
      {"cpu-fa1", Device::Cpu, {F64, F32}, {true, true, true, true}, {1, 256, {}},
       "tiled, online softmax, K/V loop outer (FA1, Algorithm 1/4)", Algorithm::FA1,
       cpu_fa1_forward, cpu_fa1_backward, nullptr},
      {"cpu-fa2", Device::Cpu, {F64, F32}, {true, true, true, true}, {1, 256, {}},
       "tiled, online softmax, Q loop outer (FA2)", Algorithm::FA2, cpu_fa2_forward, cpu_fa2_backward, nullptr},
#ifdef FLASHLAB_HAVE_CUDA
      // CUDA rows: see src/cuda/cuda_variants.hpp.
      {"cuda-naive", Device::Cuda, {F32}, {true, true, true, true}, {1, 256, {}},
       "standard attention on the GPU: S and P in HBM, simple GEMM + softmax kernels", Algorithm::Standard,
       cuda_naive_forward, cuda_naive_backward, cuda_naive_bench},
      {"cuda-cublas", Device::Cuda, {F32}, {true, true, true, true}, {1, 256, {}},
       "standard attention with cuBLAS SGEMMs: the fair unfused baseline", Algorithm::Standard,
       cuda_cublas_forward, cuda_cublas_backward, cuda_cublas_bench},
      {"cuda-fa1", Device::Cuda, {F32}, {true, true, true, true}, {1, kSimtMaxHeadDim, {}},
       "FlashAttention-1 (Algorithms 2/4), fp32 CUDA cores, one block per (batch, head)", Algorithm::FA1,
       cuda_fa1_forward, cuda_fa1_backward, cuda_fa1_bench},
      {"cuda-fa2-simt", Device::Cuda, {F32}, {true, true, true, true}, {1, kSimtMaxHeadDim, {}},
       "FlashAttention-2 loop order, fp32 CUDA cores, one block per (batch, head, Q block)", Algorithm::FA2,
       cuda_fa2_simt_forward, cuda_fa2_simt_backward, cuda_fa2_simt_bench},
      {"cuda-fa2", Device::Cuda, {F16, BF16}, {true, true, true, true}, cuda_fa2_head_dims(),
       "FlashAttention-2 on tensor cores (mma.sync, ldmatrix, cp.async), fp32 accumulation", Algorithm::FA2,
       cuda_fa2_forward, cuda_fa2_backward, cuda_fa2_bench},
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

const Variant& find_variant(const std::string& name) {
  for (const Variant& v : variants())
    if (v.name == name) return v;
  std::string known;
  for (const Variant& v : variants()) known += (known.empty() ? "" : ", ") + v.name;
  throw InputError("unknown variant '" + name + "': known variants are " + known);
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
  if (backward && (!v.supports.backward || !v.backward)) throw InputError(who + " has no backward pass");
  if (!v.available())
    throw InputError(who + " needs a CUDA GPU and none is available on this machine");
}

#ifndef FLASHLAB_HAVE_CUDA
bool cuda_device_present() { return false; }
std::string cuda_device_name() { return ""; }
#endif

}  // namespace flashlab
