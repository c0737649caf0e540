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

// The kernels' view of a forward's tensors: make_params, and their device pointers.
cuda::fa2::Params forward_params(const Problem& p, const DeviceForwardIo& io) {
  cuda::fa2::Params params = make_params(p);
  params.q = io.q;
  params.k = io.k;
  params.v = io.v;
  params.o = io.o;
  params.lse = io.lse;
  return params;
}

// ... and of a backward's. Params holds o and lse writable (the forward writes them); the backward
// kernels only read them.
cuda::fa2::Params backward_params(const Problem& p, const DeviceBackwardIo& io) {
  cuda::fa2::Params params = make_params(p);
  params.q = io.q;
  params.k = io.k;
  params.v = io.v;
  params.o = const_cast<void*>(io.o);
  params.lse = const_cast<float*>(io.lse);
  params.d_o = io.d_o;
  params.dq = io.dq;
  params.dk = io.dk;
  params.dv = io.dv;
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
BenchResult bench_as(const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  auto t = cuda::DeviceAttention<T>::random(p.shape, settings.backward);
  BackwardScratch scratch(p.shape, settings.backward);
  const cuda::fa2::Params forward = forward_params(p, t.forward_io());
  cuda::fa2::Params backward = backward_params(p, t.backward_io());
  scratch.attach(backward);
  const auto run_forward = [&] { cuda::fa2::launch_forward(dtype, forward); };
  const auto run_backward = [&] {
    // Zeroing dQ_accum is part of every backward pass, so it is timed with it.
    CUDA_CHECK(cudaMemsetAsync(scratch.dq_accum.data(), 0, scratch.dq_accum.bytes()));
    cuda::fa2::launch_backward(dtype, backward);
  };
  return cuda::bench_passes(settings, scope, t, run_forward, run_backward);
}

}  // namespace

// A device call's scratch (core/scratch.hpp): none for the forward; BackwardScratch's two arrays for the backward.
std::size_t cuda_fa2_device_scratch_bytes(const Problem& p, DType, bool backward) {
  ScratchCarver count;
  if (backward) {
    count.take<float>(cuda::numel(lse_dims(p.shape)));
    count.take<float>(cuda::numel(q_dims(p.shape)));
  }
  return count.used();
}

void cuda_fa2_forward_on_device(const Problem& p, DType dtype, const DeviceForwardIo& io) {
  check_grid(p);
  cuda::fa2::launch_forward(dtype, forward_params(p, io), cuda::stream_of(io.launch));
  cuda::finish(io.launch);
}

void cuda_fa2_backward_on_device(const Problem& p, DType dtype, const DeviceBackwardIo& io) {
  check_grid(p);
  cuda::CallScratch scratch(io.launch, cuda_fa2_device_scratch_bytes(p, dtype, true));
  cuda::fa2::Params params = backward_params(p, io);
  params.D_i = scratch.take<float>(cuda::numel(lse_dims(p.shape)));  // written whole by the backward's first kernel
  const std::size_t dq_accum = cuda::numel(q_dims(p.shape));
  params.dq_accum = scratch.take<float>(dq_accum);
  const cudaStream_t stream = cuda::stream_of(io.launch);
  CUDA_CHECK(cudaMemsetAsync(params.dq_accum, 0, dq_accum * sizeof(float), stream));  // the atomics add into it
  cuda::fa2::launch_backward(dtype, params, stream);
  cuda::finish(io.launch);
}

ForwardOut cuda_fa2_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver*) {
  return cuda::forward_from_host(cuda_fa2_forward_on_device, p, dtype, in);
}

Grads cuda_fa2_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return cuda::backward_from_host(cuda_fa2_backward_on_device, cuda::BackwardReads::o_and_lse, p, dtype, in, fwd, dO);
}

BenchResult cuda_fa2_bench(const Problem& p, DType dtype, const BenchSettings& settings) {
  check_grid(p);
  return dtype == DType::F16 ? bench_as<__half>(p, dtype, settings) : bench_as<__nv_bfloat16>(p, dtype, settings);
}

}  // namespace flashlab
