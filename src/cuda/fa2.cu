// cuda-fa2: FlashAttention-2 on tensor cores, fp16 and bf16 in, fp32 accumulation, outputs in the
// input dtype, LSE in fp32. This file is the host side: the variant table's forward / backward /
// bench entry points. The kernels, and what each changed from the readable fa2-simt, are in
// fa2_forward.cu (Algorithm 1) and fa2_backward.cu (Algorithm 2); the PTX vocabulary (mma.sync,
// ldmatrix, cp.async) in fa2_mma.cuh; the padded shared-memory tiles in fa2_tile.cuh.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>

#include "core/philox.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_variants.hpp"
#include "cuda/fa2_launch.cuh"
#include "cuda/host_passes.cuh"

namespace flashlab {
namespace {

// The head dim, dtype and options were checked by the registry against cuda/constraints.hpp; what is
// left is this kernel's own launch limit.
void check_grid(const Problem& p) {
  // One row of thread blocks per (batch, head): the grid's y dimension. The kernels also rely on it
  // for 32-bit offsets within a tile (row < 128 times heads_q * head_dim < 2^31).
  constexpr std::int64_t kMaxGridY = 65535;
  const std::int64_t rows = std::int64_t(p.shape.batch) * p.shape.heads_q;
  if (rows > kMaxGridY)
    throw InputError("cuda-fa2 runs one row of thread blocks per (batch, query head), and batch x heads_q = " +
                     std::to_string(rows) + " exceeds the GPU's limit of " + std::to_string(kMaxGridY) + " rows");
}

cuda::fa2::Params make_params(const Problem& p) {
  cuda::fa2::Params params;
  cuda::set_extents(params, p.shape);
  cuda::set_softmax_and_dropout(params, p);
  // The backward's compact tiles are chosen by shared-memory size; this lets a test run them on an H100.
  const char* compact = std::getenv("FLASHLAB_FA2_COMPACT_BACKWARD");
  params.compact_backward = compact != nullptr && std::string(compact) == "1";
  return params;
}

// The kernels' view of `t`: make_params, and the device pointers of the buffers t holds (null for
// those it does not).
template <class T>
cuda::fa2::Params params_for(const Problem& p, cuda::DeviceAttention<T>& t) {
  cuda::fa2::Params params = make_params(p);
  params.q = t.q.data();
  params.k = t.k.data();
  params.v = t.v.data();
  params.o = t.o.data();
  params.lse = t.lse.data();
  params.d_o = t.dO.data();
  params.dq = t.dq.data();
  params.dk = t.dk.data();
  params.dv = t.dv.data();
  return params;
}

// The backward's own scratch: D_i = rowsum(dO_i o O_i), (B, H_q, S_q), and dQ_accum, the fp32 (B, S_q,
// H_q, D) sum that the main kernel's atomics add into (zero before every backward).
struct BackwardScratch {
  cuda::DeviceBuffer<float> D_i, dq_accum;
  BackwardScratch(const Shape& s, bool backward)
      : D_i(backward ? cuda::numel(lse_dims(s)) : 0), dq_accum(backward ? cuda::numel(q_dims(s)) : 0) {}
  void attach(cuda::fa2::Params& params) {
    params.D_i = D_i.data();
    params.dq_accum = dq_accum.data();
  }
};

template <class T>
ForwardOut forward_as(const Problem& p, DType dtype, const Qkv& in) {
  auto t = cuda::DeviceAttention<T>::for_forward(p.shape, in);
  cuda::fa2::launch_forward(dtype, params_for(p, t));
  return t.download_forward(p.shape);
}

template <class T>
Grads backward_as(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  auto t = cuda::DeviceAttention<T>::for_backward(p.shape, in, fwd, dO, cuda::BackwardReads::o_and_lse);
  BackwardScratch scratch(p.shape, true);
  cuda::poison(scratch.D_i);
  cuda::zero(scratch.dq_accum);
  cuda::fa2::Params params = params_for(p, t);
  scratch.attach(params);
  cuda::fa2::launch_backward(dtype, params);
  return t.download_grads(p.shape);
}

template <class T>
BenchResult bench_as(const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  auto t = cuda::DeviceAttention<T>::random(p.shape, settings.backward);
  BackwardScratch scratch(p.shape, settings.backward);
  cuda::fa2::Params params = params_for(p, t);
  scratch.attach(params);
  const auto forward = [&] { cuda::fa2::launch_forward(dtype, params); };
  const auto backward = [&] {
    // Zeroing dQ_accum is part of every backward pass, so it is timed with it.
    CUDA_CHECK(cudaMemsetAsync(scratch.dq_accum.data(), 0, scratch.dq_accum.bytes()));
    cuda::fa2::launch_backward(dtype, params);
  };
  return cuda::bench_passes(settings, scope, t, forward, backward);
}

}  // namespace

ForwardOut cuda_fa2_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver*) {
  check_grid(p);
  return dtype == DType::F16 ? forward_as<__half>(p, dtype, in) : forward_as<__nv_bfloat16>(p, dtype, in);
}

Grads cuda_fa2_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  check_grid(p);
  return dtype == DType::F16 ? backward_as<__half>(p, dtype, in, fwd, dO)
                             : backward_as<__nv_bfloat16>(p, dtype, in, fwd, dO);
}

BenchResult cuda_fa2_bench(const Problem& p, DType dtype, const BenchSettings& settings) {
  check_grid(p);
  return dtype == DType::F16 ? bench_as<__half>(p, dtype, settings) : bench_as<__nv_bfloat16>(p, dtype, settings);
}

}  // namespace flashlab
