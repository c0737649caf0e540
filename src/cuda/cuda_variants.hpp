#pragma once
// The CUDA rows of the variant table (core/variants.cpp): fp32 readable kernels behind the common
// forward / backward / bench signatures of core/variants.hpp. Each function checks the problem with
// check_supported (an InputError before any launch) and runs on the default stream.
#include "../core/variants.hpp"

namespace flashlab {

// Head dims of the fused fp32 kernels (cuda-fa1, cuda-fa2-simt): d is padded up to a multiple of 32 in
// shared memory, and d = 128 is the largest tile that fits with Br = Bc = 64.
inline constexpr int kSimtMaxHeadDim = 128;

// cuda-naive: S = scale Q K^T, P = softmax(S), O = P V with S and P in HBM; three kernels of our own.
ForwardOut cuda_naive_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_naive_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_naive_bench(const Problem&, DType, const BenchSettings&);

// cuda-cublas: the same unfused pipeline with cuBLAS strided-batched SGEMMs (the fair baseline).
ForwardOut cuda_cublas_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_cublas_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_cublas_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa1: FlashAttention-1 (paper Algorithms 2 and 4), one thread block per (batch, head).
ForwardOut cuda_fa1_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_fa1_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_fa1_bench(const Problem&, DType, const BenchSettings&);

// cuda-fa2-simt: FlashAttention-2 loop order on CUDA cores, one thread block per (batch, head, Q block).
ForwardOut cuda_fa2_simt_forward(const Problem&, DType, const Qkv&, TrafficObserver*);
Grads cuda_fa2_simt_backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
BenchResult cuda_fa2_simt_bench(const Problem&, DType, const BenchSettings&);

}  // namespace flashlab
