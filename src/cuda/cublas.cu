// cuda-cublas: the unfused pipeline of cuda-naive (naive.cu) with its matrix products done by cuBLAS
// (cublasSgemmStridedBatched, fp32 on CUDA cores), and our softmax kernels between them.
//
// What changed from cuda-naive, and what it buys: only the GEMM. cuBLAS's SGEMM runs near the card's
// fp32 peak, so this is the fair non-fused baseline: S and P still go through HBM (memory O(S_q S_k)
// per head, traffic Theta(N d + N^2)), but every product is as fast as NVIDIA can make it. Whatever
// cuda-fa2-simt gains over this variant is what fusion buys, not what a better GEMM buys.
//
// cuBLAS is column-major and our tensors are row-major. A row-major (m, n) matrix C is the
// column-major (n, m) matrix C^T, and C = op(A) op(B) is C^T = op(B)^T op(A)^T, so each call passes B
// before A and swaps m and n; the transposes carry over unchanged.
#include <cublas_v2.h>

#include <map>
#include <mutex>
#include <string>

#include "cuda/common.cuh"
#include "cuda/cuda_variants.hpp"
#include "cuda/host_passes.cuh"

namespace flashlab {
namespace cuda {
namespace {

void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                           cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
}
#define CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

// One handle per device, made on first use there (a handle belongs to the device that was current when
// it was made). They are destroyed by static destructors, which run before the CUDA runtime's own
// teardown (the runtime was initialized first), so compute-sanitizer's leak check stays clean.
class Handle {
 public:
  Handle() {
    CUBLAS_CHECK(cublasCreate(&handle_));
    // Plain fp32 FMA on CUDA cores, never TF32 tensor cores: the same arithmetic as our kernels.
    CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));
  }
  ~Handle() { cublasDestroy(handle_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

cublasHandle_t handle() {
  const int device = current_device();  // initializes the runtime before the handles below exist
  static std::mutex mutex;
  static std::map<int, Handle> handles;
  const std::lock_guard<std::mutex> lock(mutex);
  return handles.try_emplace(device).first->second.get();
}

cublasOperation_t op(bool transposed) { return transposed ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void cublas_gemm(const GemmCall& g) {
  // Row-major C (m, n) = op(A) op(B)  <=>  column-major C^T (n, m) = op(B)^T op(A)^T.
  CUBLAS_CHECK(cublasSgemmStridedBatched(handle(), op(g.trans_b), op(g.trans_a), g.n, g.m, g.k, &g.alpha, g.b,
                                         static_cast<int>(g.ldb), g.stride_b, g.a, static_cast<int>(g.lda), g.stride_a,
                                         &g.beta, g.c, static_cast<int>(g.ldc), g.stride_c, g.batch));
}

}  // namespace cuda

void cuda_cublas_forward_on_device(const Problem& p, DType t, const DeviceForwardIo& io) {
  cuda::unfused_forward_on_device("cuda-cublas", cuda::cublas_gemm, p, t, io);
}
void cuda_cublas_backward_on_device(const Problem& p, DType t, const DeviceBackwardIo& io) {
  cuda::unfused_backward_on_device("cuda-cublas", cuda::cublas_gemm, p, t, io);
}
ForwardOut cuda_cublas_forward(const Problem& p, DType t, const Qkv& in, TrafficObserver*) {
  return cuda::forward_from_host(cuda_cublas_forward_on_device, p, t, in);
}
Grads cuda_cublas_backward(const Problem& p, DType t, const Qkv& in, const ForwardOut& f, const HostTensor& dO) {
  return cuda::backward_from_host(cuda_cublas_backward_on_device, cuda::BackwardReads::lse, p, t, in, f, dO);
}
BenchResult cuda_cublas_bench(const Problem& p, DType t, const BenchSettings& s) {
  return cuda::unfused_bench("cuda-cublas", cuda::cublas_gemm, p, t, s);
}

}  // namespace flashlab
