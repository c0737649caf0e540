#pragma once
// The plumbing every CUDA kernel file shares, and nothing else (keep it small and stable):
//  * CUDA_CHECK(call) and CUDA_CHECK_LAUNCH(): every runtime call and every launch is checked; a
//    failure throws std::runtime_error naming file:line, the call and CUDA's error string.
//  * DeviceBuffer<T>: an owning device array. All of them together count current and peak bytes
//    (PeakScope), which is what BenchResult::peak_bytes reports.
//  * upload / download: HostTensor (double) <-> float, __half or __nv_bfloat16 device buffers.
//  * poison(): fill an output with NaN before a run, so an element nobody writes fails the check.
//  * fill_random(): random inputs made on the device (benchmarks; never zeros).
//  * time_passes(): CUDA-event timing (warm-up, iterations, median) of a forward and a backward.
// Everything runs on the default stream: the kernels here are timed one at a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "core/philox.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "core/bench.hpp"
#include "cuda/gpu_facts.hpp"

namespace flashlab::cuda {

// ---------------------------------------------------------------------------------------------
// Error checks.

inline void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace flashlab::cuda

// Check a CUDA runtime call: CUDA_CHECK(cudaMemcpy(...));
#define CUDA_CHECK(call) ::flashlab::cuda::check_cuda((call), #call, __FILE__, __LINE__)
// Check the launch just made (bad configuration, too much shared memory, ...). Errors raised while
// the kernel runs surface at the next checked call that synchronizes (a copy, an event).
#define CUDA_CHECK_LAUNCH() ::flashlab::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

namespace flashlab::cuda {

// ---------------------------------------------------------------------------------------------
// Device memory, counted.

// Bytes held by all live DeviceBuffers, and the most held since the last PeakScope began.
struct MemoryCounter {
  static inline std::atomic<std::size_t> current{0};
  static inline std::atomic<std::size_t> peak{0};
  static void add(std::size_t bytes) {
    const std::size_t now = current += bytes;
    std::size_t old = peak.load();
    while (now > old && !peak.compare_exchange_weak(old, now)) {
    }
  }
  static void sub(std::size_t bytes) { current -= bytes; }
};

// Peak bytes allocated through DeviceBuffer while this scope lives, beyond what was live when it began.
class PeakScope {
 public:
  PeakScope() : base_(MemoryCounter::current.load()) { MemoryCounter::peak = base_; }
  std::size_t peak_bytes() const { return MemoryCounter::peak.load() - base_; }

 private:
  std::size_t base_;
};

// Free and total device memory (cudaMemGetInfo).
inline std::pair<std::size_t, std::size_t> device_memory_info() {
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return {free_bytes, total_bytes};
}

inline std::string mebibytes(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The shared memory one block may opt in to on the current GPU: 227 KiB on sm_90, 163 KiB on sm_80,
// 99 KiB on sm_86/89.
inline std::size_t shared_memory_per_block() {
  return static_cast<std::size_t>(current_gpu().shared_memory_per_block);
}

// Throws InputError unless one block of `kernel_name` may use `bytes` of shared memory on this GPU.
inline void require_shared_memory(std::size_t bytes, const std::string& kernel_name) {
  const std::size_t limit = shared_memory_per_block();
  if (bytes > limit)
    throw InputError(kernel_name + " needs " + std::to_string(bytes >> 10) +
                     " KiB of shared memory per block, but this GPU allows " + std::to_string(limit >> 10) +
                     " KiB (an H100 allows 227 KiB).");
}

// An owning array of `count` T in device memory; move-only. Running out of memory is an InputError
// (the problem is too large for this card), not a crash.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ == 0) return;
    const cudaError_t err = cudaMalloc(&ptr_, bytes());
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: an allocation failure is not sticky
      ptr_ = nullptr;
      throw InputError("the GPU is out of memory: allocating " + mebibytes(bytes()) + " failed with " +
                       mebibytes(device_memory_info().first) + " free; use a smaller problem");
    }
    CUDA_CHECK(err);
    MemoryCounter::add(bytes());
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

 private:
  void release() noexcept {
    if (ptr_ == nullptr) return;
    cudaFree(ptr_);  // never throws from a destructor; a failed free leaves the error for the next check
    MemoryCounter::sub(bytes());
    ptr_ = nullptr;
  }
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Host <-> device, converting the double HostTensor to the kernel's element type and back.

template <class T>
T from_double(double x);
template <>
inline float from_double<float>(double x) { return static_cast<float>(x); }
template <>
inline __half from_double<__half>(double x) {
  __half_raw raw;
  raw.x = float_to_f16_bits(static_cast<float>(x));  // same bit pattern as CUDA's (core/half.hpp)
  return __half(raw);
}
template <>
inline __nv_bfloat16 from_double<__nv_bfloat16>(double x) {
  __nv_bfloat16_raw raw;
  raw.x = float_to_bf16_bits(static_cast<float>(x));
  return __nv_bfloat16(raw);
}

inline double to_double(float x) { return x; }
inline double to_double(__half x) { return f16_bits_to_float(static_cast<__half_raw>(x).x); }
inline double to_double(__nv_bfloat16 x) { return bf16_bits_to_float(static_cast<__nv_bfloat16_raw>(x).x); }

// A device copy of `t`, each element rounded to T.
template <class T>
DeviceBuffer<T> upload(const HostTensor& t) {
  std::vector<T> host(t.data.size());
  std::transform(t.data.begin(), t.data.end(), host.begin(), [](double x) { return from_double<T>(x); });
  DeviceBuffer<T> buf(host.size());
  if (!host.empty()) CUDA_CHECK(cudaMemcpy(buf.data(), host.data(), buf.bytes(), cudaMemcpyHostToDevice));
  return buf;
}

// A HostTensor of shape `dims` holding the device buffer's values (waits for the device).
template <class T>
HostTensor download(const DeviceBuffer<T>& buf, std::vector<std::int64_t> dims) {
  HostTensor t(std::move(dims));
  if (static_cast<std::size_t>(t.numel()) != buf.size())
    throw std::logic_error("download: buffer holds " + std::to_string(buf.size()) + " elements, tensor " +
                           t.dims_string() + " needs " + std::to_string(t.numel()));
  std::vector<T> host(buf.size());
  if (!host.empty()) CUDA_CHECK(cudaMemcpy(host.data(), buf.data(), buf.bytes(), cudaMemcpyDeviceToHost));
  std::transform(host.begin(), host.end(), t.data.begin(), [](T x) { return to_double(x); });
  return t;
}

// Fill with NaN (all bits set is a NaN in fp32, fp16 and bf16), so an unwritten output fails checks.
template <class T>
void poison(DeviceBuffer<T>& buf) {
  if (buf.size() > 0) CUDA_CHECK(cudaMemset(buf.data(), 0xff, buf.bytes()));
}

// Set every byte to zero (accumulators such as dQ under atomics).
template <class T>
void zero(DeviceBuffer<T>& buf) {
  if (buf.size() > 0) CUDA_CHECK(cudaMemset(buf.data(), 0, buf.bytes()));
}

// ---------------------------------------------------------------------------------------------
// Random inputs made on the device (benchmarks: no host round trip at N = 64k).

// Element i's draw under `seed`: uniform in (-1, 1), never 0 (Philox4x32-10, core/philox.hpp).
__device__ inline float random_uniform_pm1(std::size_t i, std::uint64_t seed) {
  constexpr float kTwoToMinus32 = 2.3283064365386963e-10f;
  const Philox4 r = philox4x32_10(Philox4{{std::uint32_t(i), std::uint32_t(i >> 32), 0x5eedu, 0u}}, seed);
  const float u = (static_cast<float>(r.x[0]) + 0.5f) * kTwoToMinus32;  // (0, 1)
  return 2.0f * u - 1.0f;
}

template <class T>
__global__ void fill_random_kernel(T* out, std::size_t n, std::uint64_t seed) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  out[i] = static_cast<T>(random_uniform_pm1(i, seed));
}

template <class T>
void fill_random(DeviceBuffer<T>& buf, std::uint64_t seed) {
  constexpr int kThreads = 256;
  if (buf.size() == 0) return;
  const std::size_t blocks = (buf.size() + kThreads - 1) / kThreads;
  fill_random_kernel<T><<<static_cast<unsigned>(blocks), kThreads>>>(buf.data(), buf.size(), seed);
  CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Benchmark timing.

// Median time in ms of `iters` runs of `pass` after `warmup` untimed runs, each run bracketed by CUDA
// events on the default stream. `prepare`, when given, runs before every run, on the same stream but
// outside the events (a counter the pass needs zeroed, say), so its time is not counted.
inline double median_ms(const std::function<void()>& pass, int warmup, int iters,
                        const std::function<void()>& prepare = {}) {
  for (int n = 0; n < warmup; ++n) {
    if (prepare) prepare();
    pass();
  }
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int n = 0; n < std::max(iters, 1); ++n) {
    if (prepare) prepare();
    CUDA_CHECK(cudaEventRecord(start));
    pass();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Forward (and, when settings.backward and `backward` is set, backward) medians. The caller opens a
// PeakScope before allocating its inputs and passes it, and io_bytes: the bytes of q, k, v, o, lse
// (and of dO, dq, dk, dv when the backward is timed).
inline BenchResult time_passes(const BenchSettings& settings, const PeakScope& scope, std::size_t io_bytes,
                               const std::function<void()>& forward, const std::function<void()>& backward) {
  BenchResult r;
  r.forward_ms = median_ms(forward, settings.warmup, settings.iters);
  if (settings.backward && backward) r.backward_ms = median_ms(backward, settings.warmup, settings.iters);
  r.peak_bytes = scope.peak_bytes();
  r.io_bytes = io_bytes;
  return r;
}

}  // namespace flashlab::cuda
