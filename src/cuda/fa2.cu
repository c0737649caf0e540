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

namespace flashlab {
namespace {

constexpr double kLog2e = 1.4426950408889634;

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
  const Shape& s = p.shape;
  cuda::fa2::Params params;
  params.batch = s.batch;
  params.heads_q = s.heads_q;
  params.heads_kv = s.heads_kv;
  params.seq_q = s.seq_q;
  params.seq_k = s.seq_k;
  params.head_dim = s.head_dim;
  params.align = p.options.causal;
  params.scale = static_cast<float>(p.softmax_scale());
  params.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  params.dropout = p.options.dropout_p > 0;
  params.drop_threshold = dropout_threshold(p.options.dropout_p);
  params.drop_rescale = static_cast<float>(1.0 / (1.0 - p.options.dropout_p));
  params.seed = p.options.seed;
  // The backward's compact tiles are chosen by shared-memory size; this lets a test run them on an H100.
  const char* compact = std::getenv("FLASHLAB_FA2_COMPACT_BACKWARD");
  params.compact_backward = compact != nullptr && std::string(compact) == "1";
  return params;
}

std::size_t numel(const std::vector<std::int64_t>& dims) {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

template <class T>
ForwardOut forward_as(const Problem& p, DType dtype, const Qkv& in) {
  const auto q = cuda::upload<T>(in.q), k = cuda::upload<T>(in.k), v = cuda::upload<T>(in.v);
  cuda::DeviceBuffer<T> o(numel(q_dims(p.shape)));
  cuda::DeviceBuffer<float> lse(numel(lse_dims(p.shape)));
  cuda::poison(o);
  cuda::poison(lse);
  cuda::fa2::Params params = make_params(p);
  params.q = q.data();
  params.k = k.data();
  params.v = v.data();
  params.o = o.data();
  params.lse = lse.data();
  cuda::fa2::launch_forward(dtype, params);
  ForwardOut out;
  out.o = cuda::download(o, q_dims(p.shape));
  out.lse = cuda::download(lse, lse_dims(p.shape));
  return out;
}

template <class T>
Grads backward_as(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  const auto q = cuda::upload<T>(in.q), k = cuda::upload<T>(in.k), v = cuda::upload<T>(in.v);
  const auto o = cuda::upload<T>(fwd.o), d_o = cuda::upload<T>(dO);
  const auto lse = cuda::upload<float>(fwd.lse);
  cuda::DeviceBuffer<float> d_sum(numel(lse_dims(p.shape))), dq_accum(numel(q_dims(p.shape)));
  cuda::DeviceBuffer<T> dq(numel(q_dims(p.shape))), dk(numel(kv_dims(p.shape))), dv(numel(kv_dims(p.shape)));
  cuda::poison(dq);
  cuda::poison(dk);
  cuda::poison(dv);
  cuda::poison(d_sum);
  cuda::zero(dq_accum);
  cuda::fa2::Params params = make_params(p);
  params.q = q.data();
  params.k = k.data();
  params.v = v.data();
  params.o = const_cast<T*>(o.data());  // read-only in the backward
  params.lse = const_cast<float*>(lse.data());
  params.d_o = d_o.data();
  params.d_sum = d_sum.data();
  params.dq_accum = dq_accum.data();
  params.dq = dq.data();
  params.dk = dk.data();
  params.dv = dv.data();
  cuda::fa2::launch_backward(dtype, params);
  Grads g;
  g.dq = cuda::download(dq, q_dims(p.shape));
  g.dk = cuda::download(dk, kv_dims(p.shape));
  g.dv = cuda::download(dv, kv_dims(p.shape));
  return g;
}

template <class T>
BenchResult bench_as(const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  const std::size_t n_q = numel(q_dims(p.shape)), n_kv = numel(kv_dims(p.shape)), n_l = numel(lse_dims(p.shape));
  cuda::DeviceBuffer<T> q(n_q), k(n_kv), v(n_kv), o(n_q);
  cuda::DeviceBuffer<float> lse(n_l);
  cuda::fill_random(q, 1);
  cuda::fill_random(k, 2);
  cuda::fill_random(v, 3);
  cuda::fa2::Params params = make_params(p);
  params.q = q.data();
  params.k = k.data();
  params.v = v.data();
  params.o = o.data();
  params.lse = lse.data();
  std::size_t io_bytes = (2 * n_q + 2 * n_kv) * sizeof(T) + n_l * sizeof(float);

  cuda::DeviceBuffer<T> d_o, dq, dk, dv;
  cuda::DeviceBuffer<float> d_sum, dq_accum;
  if (settings.backward) {
    d_o = cuda::DeviceBuffer<T>(n_q);
    dq = cuda::DeviceBuffer<T>(n_q);
    dk = cuda::DeviceBuffer<T>(n_kv);
    dv = cuda::DeviceBuffer<T>(n_kv);
    d_sum = cuda::DeviceBuffer<float>(n_l);
    dq_accum = cuda::DeviceBuffer<float>(n_q);
    cuda::fill_random(d_o, 4);
    params.d_o = d_o.data();
    params.d_sum = d_sum.data();
    params.dq_accum = dq_accum.data();
    params.dq = dq.data();
    params.dk = dk.data();
    params.dv = dv.data();
    io_bytes += (2 * n_q + 2 * n_kv) * sizeof(T);
  }
  const auto forward = [&] { cuda::fa2::launch_forward(dtype, params); };
  const auto backward = [&] {
    // Zeroing dQ_accum is part of every backward pass, so it is timed with it.
    CUDA_CHECK(cudaMemsetAsync(dq_accum.data(), 0, dq_accum.bytes()));
    cuda::fa2::launch_backward(dtype, params);
  };
  forward();  // O and L for the backward
  return cuda::time_passes(settings, scope, io_bytes, forward, backward);
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
