#pragma once
// The CUDA layer's face to the registry: each kernel generation's entry points behind the common
// forward / backward / bench signatures, and what each accepts, as data (cuda/constraints.hpp). The
// registry checks a problem against that data once, before calling in; the entry points assume a
// checked problem and run on the legacy default stream of the current device.
//
// Each generation has two kinds of forward / backward: `_on_device` runs on tensors already in device
// memory (core/device_io.hpp: the caller's, with no host copy) and returns when the device has
// finished; the host one (HostTensor in and out) uploads, runs the same `_on_device` entry and
// downloads (cuda/host_passes.cuh). One code path serves both.
#include "core/bench.hpp"
#include "core/device_io.hpp"
#include "core/fp8.hpp"  // E4m3Qkv
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "cuda/constraints.hpp"

namespace flashlab {

class TrafficObserver;  // model/traffic.hpp: the CUDA kernels report no events

// cuda-naive: S = scale Q K^T, P = softmax(S), O = P V with S and P in HBM; three kernels of our own.
void cuda_naive_forward_on_device(const Problem&, DType, const DeviceForwardIo&);
void cuda_naive_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
ForwardOut cuda_naive_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_naive_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_naive_bench(const Problem&, DType, const BenchSettings&);

// cuda-cublas: the same unfused pipeline with cuBLAS strided-batched SGEMMs (the fair baseline).
void cuda_cublas_forward_on_device(const Problem&, DType, const DeviceForwardIo&);
void cuda_cublas_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
ForwardOut cuda_cublas_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_cublas_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_cublas_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa1: FlashAttention-1 (paper Algorithms 2 and 4), one thread block per (batch, head).
void cuda_fa1_forward_on_device(const Problem&, DType, const DeviceForwardIo&);
void cuda_fa1_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
ForwardOut cuda_fa1_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_fa1_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_fa1_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa2-simt: FlashAttention-2 loop order on CUDA cores, one thread block per (batch, head, Q block).
void cuda_fa2_simt_forward_on_device(const Problem&, DType, const DeviceForwardIo&);
void cuda_fa2_simt_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
ForwardOut cuda_fa2_simt_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_fa2_simt_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_fa2_simt_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa2: FlashAttention-2 on tensor cores (mma.sync, ldmatrix, cp.async), fp16/bf16, fp32 accumulation.
// Its device entries run on the stream a call names (DeviceLaunch), with the scratch it brings or their own.
void cuda_fa2_forward_on_device(const Problem&, DType, const DeviceForwardIo&);
void cuda_fa2_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
std::size_t cuda_fa2_device_scratch_bytes(const Problem&, DType, bool backward);
ForwardOut cuda_fa2_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_fa2_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_fa2_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa3-ws: the warp-specialized Hopper forward (TMA, wgmma, producer / consumer warpgroups),
// fp16/bf16, compute capability 9.0 only, and the shipped step's backward (head dims 64 and 128; with
// Options::deterministic, dQ summed in a fixed order). `step` is the ablation ladder's step, 1..7: 1-5 each
// add one idea to the one before (1 one warpgroup, TMA + wgmma; 2 producer / consumer specialization
// with setmaxnreg; 3 ping-pong; 4 intra-warpgroup overlap; 5 persistent scheduling, the shipped kernel); 6 and 7
// are step 5 with one of FlashAttention-4's softmax ideas flipped (6 the lazy rescale off, 7 part of the
// exponentials emulated on the FMA pipes), forward only.
// The bench times the shipped kernel of the step; with settings.record_timeline it then records one run's
// pipeline with the timeline build into that file (Trace Event JSON) and reports it, and that build's
// time, in BenchResult::timeline (no dropout: the registry refuses it first).
//
// Its FP8 forward (the shipped step only: fa3_ws/forward_e4m3.cu, launch_forward_e4m3): e4m3 Q, K, V with a
// descale per (batch, head), O in bf16, LSE in fp32; head dims kE4m3HeadDims, forward only, no dropout.
// cuda_fa3_ws_forward_e4m3_on_device runs it on the caller's device memory: io.q, io.k, io.v e4m3 bytes, io.o bf16,
// io.lse fp32, the descales fp32 (B, H_q), (B, H_kv), (B, H_kv); its V^T (fp8_vt_bytes) and tile counter are in the
// call's scratch (or allocated for the call), and it runs the V^T pre-pass and the kernel on the call's stream. cuda_fa3_ws_forward_e4m3 uploads
// quantized host inputs, runs that same entry, and downloads O (its bf16 values) and the LSE. The bench in DType::E4M3 (step 5, no backward, no timeline) times the same call,
// pre-pass included, on random e4m3 inputs made on the device (uniform in (-1, 1) as the other benches', stored
// as e4m3 under the scale 448 with descale 1/448).
void cuda_fa3_ws_forward_on_device_at(int step, const Problem&, DType, const DeviceForwardIo&);
ForwardOut cuda_fa3_ws_forward_at(int step, const Problem&, DType, const Qkv&);
BenchResult cuda_fa3_ws_bench_at(int step, const Problem&, DType, const BenchSettings&);
ForwardOut cuda_fa3_ws_forward_e4m3(const Problem&, const E4m3Qkv&);
void cuda_fa3_ws_forward_e4m3_on_device(const Problem&, const DeviceForwardIo&, const float* q_descale,
                                        const float* k_descale, const float* v_descale);
void cuda_fa3_ws_backward_on_device(const Problem&, DType, const DeviceBackwardIo&);
// The scratch a device call of any step takes (DeviceLaunch): the forward's tile counter (and an FP8 forward's V^T),
// the backward's row statistics and dQ sums. Its device entries run on the stream the call names.
std::size_t cuda_fa3_ws_device_scratch_bytes(const Problem&, DType, bool backward);
Grads cuda_fa3_ws_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
// The same with `consumers` consumer warpgroups (2, or 3 at d = 64) whatever the plan would choose
// (fa3_ws_params.hpp, backward_plan): for the tests, which hold both kernels to the reference on small problems.
Grads cuda_fa3_ws_backward_with_consumers(int consumers, const Problem&, DType, const Qkv&, const ForwardOut&,
                                          const HostTensor& dO);
// The same on one grid of the caller's (fa3_ws_params.hpp, backward_grid): `consumers`, each group of query heads
// shared among `group_splits` thread blocks, launched K/V block by K/V block or row by row.
Grads cuda_fa3_ws_backward_on_grid(int consumers, int group_splits, bool key_blocks_outer, const Problem&, DType,
                                   const Qkv&, const ForwardOut&, const HostTensor& dO);
// The same behind the common signatures, one instantiation per registry row.
template <int kStep = 5>
ForwardOut cuda_fa3_ws_forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver*) {
  return cuda_fa3_ws_forward_at(kStep, p, dtype, in);
}
template <int kStep = 5>
void cuda_fa3_ws_forward_on_device(const Problem& p, DType dtype, const DeviceForwardIo& io) {
  cuda_fa3_ws_forward_on_device_at(kStep, p, dtype, io);
}
template <int kStep = 5>
BenchResult cuda_fa3_ws_bench(const Problem& p, DType dtype, const BenchSettings& settings) {
  return cuda_fa3_ws_bench_at(kStep, p, dtype, settings);
}

}  // namespace flashlab

// Internal: the unfused pipeline that cuda-naive and cuda-cublas share (naive.cu), parameterized by
// the GEMM that computes its matrix products.
namespace flashlab::cuda {

// Row-major strided-batched GEMM, for z < batch: C_z = alpha op(A_z) op(B_z) + beta C_z, where
// op(X) = X^T when trans_x, X_z = X + z * stride_x, C_z is (m, n), the inner extent is k, and ld_x is
// the distance between rows of X as stored. beta = 0 never reads C.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  long long lda = 0, stride_a = 0;
  const float* b = nullptr;
  long long ldb = 0, stride_b = 0;
  float beta = 0.0f;
  float* c = nullptr;
  long long ldc = 0, stride_c = 0;
  int batch = 1;
};
using GemmFn = void (*)(const GemmCall&);

void simple_gemm(const GemmCall&);  // naive.cu: one thread per element of C, shared-memory tiles
void cublas_gemm(const GemmCall&);  // cublas.cu: cublasSgemmStridedBatched

void unfused_forward_on_device(const char* variant, GemmFn, const Problem&, DType, const DeviceForwardIo&);
void unfused_backward_on_device(const char* variant, GemmFn, const Problem&, DType, const DeviceBackwardIo&);
BenchResult unfused_bench(const char* variant, GemmFn, const Problem&, DType, const BenchSettings&);

}  // namespace flashlab::cuda
