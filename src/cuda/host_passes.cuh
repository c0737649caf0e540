#pragma once
// The host side every kernel generation shares (naive.cu and cublas.cu's unfused pipeline, fa1.cu,
// fa2_simt.cu, fa2.cu, fa3_ws.cu), so that each generation's file says only what is its own: its scratch
// buffers and its launches.
//  * Each generation's entry points run on tensors in device memory (DeviceForwardIo, DeviceBackwardIo of
//    core/device_io.hpp: the caller's own, or a DeviceAttention's) and return when the device has
//    finished (finish_on_device). forward_from_host / backward_from_host make the host entry points
//    from them: upload, the same device entry, download. So every caller runs one code path.
//  * DeviceAttention<T>: the device tensors of one problem, q, k, v, o (element type T) and lse (fp32),
//    and for the backward dO, dq, dk, dv. Made from host tensors (for_forward, for_backward: inputs
//    uploaded, outputs poisoned) or at random (random: benchmarks), downloaded back into ForwardOut or
//    Grads, and io_bytes(): what BenchResult::io_bytes reports; forward_io / backward_io: its pointers.
//  * bench_passes(): one untimed forward (the backward reads its O and L), then time_passes(); or, for
//    Nsight Compute, exactly one pass inside cudaProfilerStart / Stop (BenchSettings::one_pass). On a
//    DeviceAttention, or on any tensors given the bytes of their inputs and outputs (the FP8 forward's).
//  * set_extents(): a Shape's extents into a kernel's parameter struct.
//  * set_softmax_and_dropout(): the causal alignment, the softmax scale (and scale * log2 e for exp2),
//    and the dropout constants, derived once from a Problem for the tensor-core kernels.
// A benchmark opens its PeakScope before making its DeviceAttention and scratch, so peak_bytes counts
// them all.
#include <cuda_profiler_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bench.hpp"
#include "core/device_io.hpp"
#include "core/philox.hpp"
#include "core/problem.hpp"
#include "core/scratch.hpp"
#include "core/tensor.hpp"
#include "cuda/common.cuh"

namespace flashlab::cuda {

// Elements of a tensor of these dims (q_dims, kv_dims, lse_dims of core/tensor.hpp).
inline std::size_t numel(const std::vector<std::int64_t>& dims) {
  std::size_t n = 1;
  for (auto d : dims) n *= static_cast<std::size_t>(d);
  return n;
}

// A pointer of a DeviceForwardIo / DeviceBackwardIo as the element type T its kernels take.
template <class T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
template <class T>
T* as(void* p) {
  return static_cast<T*>(p);
}

// The CUDA device ordinal that is current on this thread.
inline int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// What every device entry point ends with: wait until its launches (all on the legacy default stream)
// have finished, so the caller may read, free or reuse the tensors at once, and an error raised while a
// kernel ran surfaces here, in this call, as std::runtime_error.
inline void finish_on_device() { CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy)); }

// The variants that run on a caller's stream (cuda-fa2, cuda-fa3-ws): the stream a DeviceLaunch names (nullptr: the
// legacy default stream), and what their entry points end with: waiting for that stream unless the call is
// asynchronous (an asynchronous call's errors surface at the caller's next synchronization, as a library's do).
inline cudaStream_t stream_of(const DeviceLaunch& launch) { return static_cast<cudaStream_t>(launch.stream); }
inline void finish(const DeviceLaunch& launch) {
  CUDA_CHECK(cudaGetLastError());
  if (!launch.asynchronous) CUDA_CHECK(cudaStreamSynchronize(launch.stream ? stream_of(launch) : cudaStreamLegacy));
}

// A device call's scratch: the caller's (DeviceLaunch::scratch; the registry checked its size), or, where it brought
// none, `bytes` of this call's own, freed when the call returns (the call then waits for its kernels: an
// asynchronous call always brings its scratch). Carved with ScratchCarver (core/scratch.hpp), in the same order
// the variant's device_scratch_bytes counts.
class CallScratch {
 public:
  CallScratch(const DeviceLaunch& launch, std::size_t bytes)
      : own_(launch.scratch != nullptr ? 0 : bytes),
        carver_(launch.scratch != nullptr ? launch.scratch : own_.data(),
                launch.scratch != nullptr ? launch.scratch_bytes : own_.bytes()) {}
  template <class T>
  T* take(std::size_t count) {
    return carver_.template take<T>(count);
  }
  ScratchCarver& carver() { return carver_; }

 private:
  DeviceBuffer<unsigned char> own_;
  ScratchCarver carver_;
};

// Copy a problem's extents into a kernel parameter struct that names them the same way (AttnParams of
// simt_tiles.cuh, fa2::Params of fa2_launch.cuh).
template <class KernelParams>
void set_extents(KernelParams& params, const Shape& s) {
  params.batch = s.batch;
  params.heads_q = s.heads_q;
  params.heads_kv = s.heads_kv;
  params.seq_q = s.seq_q;
  params.seq_k = s.seq_k;
  params.head_dim = s.head_dim;
}

// The options the tensor-core kernels read (cuda-fa2, cuda-fa3-ws): exp(scale * s) = exp2(scale_log2 * s),
// and dropout as core/philox.hpp defines it (kept when the draw >= threshold, scaled by 1 / (1 - p)).
template <class KernelParams>
void set_softmax_and_dropout(KernelParams& params, const Problem& p) {
  constexpr double kLog2e = 1.4426950408889634;
  params.align = p.options.causal;
  params.scale = static_cast<float>(p.softmax_scale());
  params.scale_log2 = static_cast<float>(p.softmax_scale() * kLog2e);
  params.dropout = p.options.dropout_p > 0;
  params.drop_threshold = dropout_threshold(p.options.dropout_p);
  params.drop_rescale = static_cast<float>(1.0 / (1.0 - p.options.dropout_p));
  params.seed = p.options.seed;
}

// What a backward pass reads of the forward's outputs: the unfused pipeline recomputes P from L
// alone; the fused kernels also need O, for D_i = rowsum(dO_i o O_i).
enum class BackwardReads { lse, o_and_lse };

template <class T>
struct DeviceAttention {
  DeviceBuffer<T> q, k, v, o;  // (B, S_q, H_q, D), (B, S_k, H_kv, D) twice, (B, S_q, H_q, D)
  DeviceBuffer<float> lse;     // (B, H_q, S_q), natural log
  DeviceBuffer<T> dO, dq, dk, dv;  // backward only: shaped like o, q, k, v

  // A forward from host inputs: q, k, v uploaded (rounded to T); o and lse allocated and poisoned.
  static DeviceAttention for_forward(const Shape& shape, const Qkv& in) {
    DeviceAttention t;
    t.upload_inputs(in);
    t.o = DeviceBuffer<T>(numel(q_dims(shape)));
    t.lse = DeviceBuffer<float>(numel(lse_dims(shape)));
    poison(t.o);
    poison(t.lse);
    return t;
  }

  // A backward from host tensors: q, k, v, the forward's lse (and o, if `reads` says so) and dO
  // uploaded; dq, dk, dv allocated and poisoned.
  static DeviceAttention for_backward(const Shape& shape, const Qkv& in, const ForwardOut& fwd,
                                      const HostTensor& dO, BackwardReads reads) {
    DeviceAttention t;
    t.upload_inputs(in);
    if (reads == BackwardReads::o_and_lse) t.o = upload<T>(fwd.o);
    t.lse = upload<float>(fwd.lse);
    t.dO = upload<T>(dO);
    t.allocate_grads(shape);
    poison(t.dq);
    poison(t.dk);
    poison(t.dv);
    return t;
  }

  // Benchmark tensors made on the device: q, k, v uniform in (-1, 1) (seeds 1, 2, 3), o and lse
  // allocated; with `backward`, dO too (seed 4) and dq, dk, dv.
  static DeviceAttention random(const Shape& shape, bool backward) {
    DeviceAttention t;
    t.q = DeviceBuffer<T>(numel(q_dims(shape)));
    t.k = DeviceBuffer<T>(numel(kv_dims(shape)));
    t.v = DeviceBuffer<T>(numel(kv_dims(shape)));
    t.o = DeviceBuffer<T>(numel(q_dims(shape)));
    t.lse = DeviceBuffer<float>(numel(lse_dims(shape)));
    fill_random(t.q, 1);
    fill_random(t.k, 2);
    fill_random(t.v, 3);
    if (backward) {
      t.dO = DeviceBuffer<T>(numel(q_dims(shape)));
      fill_random(t.dO, 4);
      t.allocate_grads(shape);
    }
    return t;
  }

  // Bytes of the problem's inputs and outputs (the buffers that exist): q, k, v, o, lse, and dO, dq,
  // dk, dv when the backward is timed.
  std::size_t io_bytes() const {
    return q.bytes() + k.bytes() + v.bytes() + o.bytes() + lse.bytes() + dO.bytes() + dq.bytes() + dk.bytes() +
           dv.bytes();
  }

  // The device entry points' view of these buffers (null where t holds none).
  DeviceForwardIo forward_io() {
    return DeviceForwardIo{current_device(), q.data(), k.data(), v.data(), o.data(), lse.data()};
  }
  DeviceBackwardIo backward_io() {
    return DeviceBackwardIo{current_device(), q.data(),  k.data(),  v.data(),  o.data(),
                            lse.data(),       dO.data(), dq.data(), dk.data(), dv.data()};
  }

  ForwardOut download_forward(const Shape& shape) const {
    return ForwardOut{download(o, q_dims(shape)), download(lse, lse_dims(shape))};
  }
  Grads download_grads(const Shape& shape) const {
    return Grads{download(dq, q_dims(shape)), download(dk, kv_dims(shape)), download(dv, kv_dims(shape))};
  }

 private:
  void upload_inputs(const Qkv& in) {
    q = upload<T>(in.q);
    k = upload<T>(in.k);
    v = upload<T>(in.v);
  }
  void allocate_grads(const Shape& shape) {
    dq = DeviceBuffer<T>(numel(q_dims(shape)));
    dk = DeviceBuffer<T>(numel(kv_dims(shape)));
    dv = DeviceBuffer<T>(numel(kv_dims(shape)));
  }
};

// Calls f.template operator()<T>() with T the element type a dtype is held in on the device: float for
// f32, __half for f16, __nv_bfloat16 for bf16 (no kernel computes in f64; the registry refuses it). e4m3 is
// not one element type for every tensor (e4m3 inputs with descales, O in bf16): the FP8 forward has its own
// host path (cuda_fa3_ws_forward_e4m3), so it is refused here too.
template <class F>
decltype(auto) with_element_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: return f.template operator()<float>();
    case DType::F16: return f.template operator()<__half>();
    case DType::BF16: return f.template operator()<__nv_bfloat16>();
    case DType::F64: break;
    case DType::E4M3:
      throw std::logic_error("e4m3 tensors have no DeviceAttention: the FP8 forward runs through "
                             "cuda_fa3_ws_forward_e4m3 (the registry should have sent it there)");
  }
  throw std::logic_error(std::string("no CUDA kernel computes in ") + to_string(dtype) +
                         " (the registry should have refused it)");
}

// A host entry point from a device one: q, k, v uploaded in the dtype's element type, o and lse
// poisoned; `run_on_device(p, dtype, io)` on them; o and lse downloaded.
template <class RunOnDevice>
ForwardOut forward_from_host(RunOnDevice run_on_device, const Problem& p, DType dtype, const Qkv& in) {
  return with_element_type(dtype, [&]<class T>() {
    auto t = DeviceAttention<T>::for_forward(p.shape, in);
    run_on_device(p, dtype, t.forward_io());
    return t.download_forward(p.shape);
  });
}

// The same for a backward: q, k, v, dO, the forward's lse (and o, when `reads` says so) uploaded; dq,
// dk, dv poisoned, computed by `run_on_device` and downloaded.
template <class RunOnDevice>
Grads backward_from_host(RunOnDevice run_on_device, BackwardReads reads, const Problem& p, DType dtype,
                         const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return with_element_type(dtype, [&]<class T>() {
    auto t = DeviceAttention<T>::for_backward(p.shape, in, fwd, dO, reads);
    run_on_device(p, dtype, t.backward_io());
    return t.download_grads(p.shape);
  });
}

// Benchmark one generation on `t` (made by DeviceAttention::random inside `scope`): one untimed
// forward, so that the backward reads a real O and L, then time_passes. With settings.one_pass: one
// forward (and backward) only, inside a profiler range (BenchSettings::one_pass).
// The same for tensors that are not a DeviceAttention (the FP8 forward's: e4m3 inputs and their descales, O in
// bf16), given the bytes of their inputs and outputs.
inline BenchResult bench_passes(const BenchSettings& settings, const PeakScope& scope, std::size_t io_bytes,
                                const std::function<void()>& forward, const std::function<void()>& backward) {
  if (settings.one_pass) {
    CUDA_CHECK(cudaDeviceSynchronize());  // the inputs are made: nothing before the range runs inside it
    CUDA_CHECK(cudaProfilerStart());
    BenchResult r = time_passes(BenchSettings{.warmup = 0, .iters = 1, .backward = settings.backward}, scope,
                                io_bytes, forward, backward);
    CUDA_CHECK(cudaProfilerStop());
    return r;
  }
  forward();
  return time_passes(settings, scope, io_bytes, forward, backward);
}

template <class T>
BenchResult bench_passes(const BenchSettings& settings, const PeakScope& scope, const DeviceAttention<T>& t,
                         const std::function<void()>& forward, const std::function<void()>& backward) {
  return bench_passes(settings, scope, t.io_bytes(), forward, backward);
}

}  // namespace flashlab::cuda
