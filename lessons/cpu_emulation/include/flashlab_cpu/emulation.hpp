#pragma once
// The CPU emulation of the little CUDA the lessons' kernels use (lessons 04 and 05): enough for a
// readable kernel written for the GPU to compile as C++ and run on the CPU, unchanged.
//
//  * `__global__`, `__device__`, `__host__` mean nothing; `__forceinline__` is `inline`.
//  * `__shared__` is `static`: blocks run one after another, so a function's static array is the running
//    block's shared memory, seen by all its threads. On a GPU it holds garbage until the block writes it:
//    the build's copy of the .cu file registers each `__shared__` variable (SharedMemory below), and every
//    block starts with it filled with 0xff bytes (NaN in a float), so a tile read before it is loaded shows.
//    `extern __shared__` (dynamic shared memory) is not emulated.
//  * Each CUDA thread of a block is one std::thread; threadIdx, blockIdx, blockDim and gridDim are
//    thread_local, set for each. `__syncthreads()` is a std::barrier of the block's threads; a thread that
//    returns leaves the barrier (arrive_and_drop), as an exited thread no longer counts on a GPU.
//  * `atomicAdd` is std::atomic_ref's fetch_add; `min`, `max` take the place of CUDA's device overloads.
//  * A launch `kernel<<<grid, block>>>(args)` is not C++: lessons/cpu_emulation/rewrite_cuda.cmake copies
//    the .cu file at build time with it rewritten to `::flashlab_cpu::launcher(kernel, grid, block)(args)`,
//    which runs the whole grid before it returns (the default stream, already synchronized).
//  * The runtime calls the lessons make (cudaMalloc, cudaMemcpy, cudaMemset, cudaGetLastError, events, ...)
//    work on host memory: cuda_runtime.h, cuda_fp16.h and cuda_bf16.h beside this folder are shims that
//    include this file.
// Launch errors are reported as CUDA would report them: a block of more than 1024 threads or an empty grid
// makes the launch fail with cudaErrorInvalidConfiguration (CUDA_CHECK_LAUNCH() throws on it).
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define FLASHLAB_CPU_EMULATION 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __restrict__ __restrict

// ---------------------------------------------------------------------------------------------
// Built-in types and variables.

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// CUDA's device overloads of min and max (global functions on the GPU).
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// atomicAdd: returns the old value, like CUDA's.
template <class T>
  requires(std::is_arithmetic_v<T>)
inline T atomicAdd(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}

// ---------------------------------------------------------------------------------------------
// The runtime's error codes and its sticky "last error".

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
};

namespace flashlab_cpu {

inline cudaError_t& last_error() {
  static thread_local cudaError_t err = cudaSuccess;
  return err;
}
inline cudaError_t record(cudaError_t err) {
  if (err != cudaSuccess) last_error() = err;
  return err;
}

// Every __shared__ variable the running program has met, and the poison a block's shared memory starts with.
struct SharedRegion {
  void* at;
  std::size_t bytes;
};
inline std::mutex shared_mutex;
inline std::vector<SharedRegion> shared_regions;
inline constexpr unsigned char kSharedPoison = 0xff;  // all bits set: a NaN float, a -1 int

// rewrite_cuda.cmake turns `__shared__ float Kj[32][64];` into `static float Kj[32][64];` followed by a static
// SharedMemory of it: made once, by the first thread to get there (the others wait for it), it poisons the
// array and registers it, so that poison_shared() poisons it again before every later block.
class SharedMemory {
 public:
  SharedMemory(void* at, std::size_t bytes) {
    std::memset(at, kSharedPoison, bytes);
    const std::lock_guard<std::mutex> lock(shared_mutex);
    shared_regions.push_back({at, bytes});
  }
};
inline void poison_shared() {
  const std::lock_guard<std::mutex> lock(shared_mutex);
  for (const SharedRegion& r : shared_regions) std::memset(r.at, kSharedPoison, r.bytes);
}

// The running block's barrier: every thread of the block points at the same one.
inline thread_local std::barrier<>* block_barrier = nullptr;

// The threads of one block: built on each call, so every launch starts clean.
template <class Fn>
void run_block(dim3 grid, dim3 block, uint3 block_idx, Fn& body) {
  const unsigned n = block.x * block.y * block.z;
  poison_shared();  // a fresh block: its shared memory holds nothing it wrote
  std::barrier<> barrier(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (unsigned t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      blockIdx = block_idx;
      blockDim = block;
      gridDim = grid;
      block_barrier = &barrier;
      body();
      block_barrier = nullptr;
      barrier.arrive_and_drop();  // an exited thread no longer holds up the others' __syncthreads()
    });
  }
  for (std::thread& th : threads) th.join();
}

// `kernel<<<grid, block, shared_bytes, stream>>>(args...)` becomes `launcher(kernel, grid, block, ...)(args...)`.
template <class... Params>
class Launcher {
 public:
  Launcher(void (*kernel)(Params...), dim3 grid, dim3 block) : kernel_(kernel), grid_(grid), block_(block) {}

  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "a kernel launch passes one argument per parameter");
    const unsigned long long threads = 1ull * block_.x * block_.y * block_.z;
    const unsigned long long blocks = 1ull * grid_.x * grid_.y * grid_.z;
    if (threads == 0 || threads > 1024 || block_.z > 64 || blocks == 0) {
      record(cudaErrorInvalidConfiguration);
      return;
    }
    // Arguments are converted to the parameters' types once, as a launch copies them to the device.
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    auto body = [&] { std::apply(kernel_, params); };
    for (unsigned z = 0; z < grid_.z; ++z)
      for (unsigned y = 0; y < grid_.y; ++y)
        for (unsigned x = 0; x < grid_.x; ++x) run_block(grid_, block_, uint3{x, y, z}, body);
  }

 private:
  void (*kernel_)(Params...);
  dim3 grid_, block_;
};

template <class... Params>
Launcher<Params...> launcher(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t /*shared_bytes*/ = 0,
                             const void* /*stream*/ = nullptr) {
  return Launcher<Params...>(kernel, grid, block);
}

}  // namespace flashlab_cpu

inline void __syncthreads() {
  if (flashlab_cpu::block_barrier != nullptr) flashlab_cpu::block_barrier->arrive_and_wait();
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---------------------------------------------------------------------------------------------
// The runtime API, on host memory. "Device" memory is host memory from malloc.

using cudaStream_t = const void*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};

inline const char* cudaGetErrorName(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
  }
  return "unknown error";
}
// Returns and clears the last error, as CUDA's does.
inline cudaError_t cudaGetLastError() { return std::exchange(flashlab_cpu::last_error(), cudaSuccess); }
inline cudaError_t cudaPeekAtLastError() { return flashlab_cpu::last_error(); }

template <class T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
  if (ptr == nullptr) return flashlab_cpu::record(cudaErrorInvalidValue);
  *ptr = static_cast<T*>(std::malloc(bytes == 0 ? 1 : bytes));
  return *ptr == nullptr ? flashlab_cpu::record(cudaErrorMemoryAllocation) : cudaSuccess;
}
inline cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return flashlab_cpu::record(cudaErrorInvalidValue);
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(dst, src, bytes, kind);
}
inline cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
  if (bytes > 0 && dst == nullptr) return flashlab_cpu::record(cudaErrorInvalidValue);
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t = nullptr) {
  return cudaMemset(dst, value, bytes);
}
// Launches run to completion before they return: there is never anything to wait for.
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : flashlab_cpu::record(cudaErrorInvalidDevice);
}
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
// The emulated "GPU" reports an H100's compute capability (9.0), shared memory (227 KiB opt-in), L2 (50 MiB) and
// 132 SMs.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrL2CacheSize: *value = 50 * 1024 * 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
  }
  return cudaSuccess;
}
// Shared memory is host memory here: any size a kernel asks for is allowed.
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cudaSuccess;
}
// The emulation runs a launch's blocks one after another: one is resident at a time.
template <class Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Kernel, int, std::size_t) {
  *blocks = 1;
  return cudaSuccess;
}
// Free and total "device" memory: the host's is not asked; a generous constant keeps messages readable.
inline cudaError_t cudaMemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  *free_bytes = std::size_t(1) << 34;
  *total_bytes = std::size_t(1) << 34;
  return cudaSuccess;
}

// Events time on the host's steady clock (a launch has finished when it returns).
struct CUevent_st {
  std::chrono::steady_clock::time_point at{};
};
using cudaEvent_t = CUevent_st*;
inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st{};
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t = nullptr) {
  event->at = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
  *ms = std::chrono::duration<float, std::milli>(stop->at - start->at).count();
  return cudaSuccess;
}
