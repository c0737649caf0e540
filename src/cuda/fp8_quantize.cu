// Per-head e4m3 quantization on the GPU, with the optional Hadamard rotation of FlashAttention-3's incoherent
// processing (what and why: fp8_quantize.hpp). The pre-pass of an FP8 forward, so it has to cost little beside it:
// it is memory-bound by design, and this file is laid out to keep it there.
//
// Two passes over x, both enqueued on the caller's stream after a memset of the scratch:
//  1. amax_kernel: per (b, h), the max |y| (y = x, or x rotated in fp32), as the bits of a non-negative float, which
//     order like unsigned integers: a block reduces its rows and does one atomicMax per (b, h). The max of a set does
//     not depend on the order it is taken in, so the result is deterministic. The same bits catch non-finite values
//     for free: +inf is above every finite magnitude and a NaN above +inf, so a row whose max bits reach 0x7f800000
//     holds one, and the thread that sees it reports the element (rare path, below).
//  2. quantize_kernel: reads the amax, makes scale and descale as the CPU does, rotates the row again (identical fp32
//     operations, so identical y) and writes e4m3(y * scale) with the hardware's satfinite conversion. Its blocks walk
//     the tensor in the opposite order from pass 1's, so that its first reads find what pass 1 read last still in
//     the L2.
// Recomputing the rotation costs adds and shuffles, not bytes; storing y between the passes would cost 8 bytes an
// element. Per element a pass moves its input once (and pass 2 writes one byte): 2 x 2 + 1 = 5 bytes for bf16.
//
// The shape of a row in registers. A row of d elements is spread over kLanes consecutive lanes of a warp
// (lanes_per_row: 16 values a lane without rotation, 32 with it from d = 128), each holding kPerLane = d / kLanes
// values as kChunks 16-byte loads: lane l's chunk c is columns (c kLanes + l) kVec ... + kVec - 1, so one load instruction of the kLanes lanes
// reads kLanes x 16 contiguous bytes of a row. A column index's bits are then [chunk | lane | within the chunk]:
// the Walsh-Hadamard butterflies over the low and the high bits are additions between a lane's own registers, and
// only the log2(kLanes) middle bits (2 or 3 stages) cross lanes, by __shfl_xor_sync. The stages run in the CPU's
// order (span 1, 2, 4, ..., fast_walsh_hadamard's), each add rounded to fp32, then the product by fp32(1/sqrt(d)).
// The signs of D are a bitmask passed by value (E4m3SignBits), applied before the first stage by flipping sign bits
// (exact, as the CPU's multiplication by +-1 is).
//
// Non-finite input, the rare path: the thread whose row holds a non-finite y reloads its own inputs and atomicMax's a
// 64-bit code into the scratch: bit 63 set for an input element not finite in float, with (2^62 - 1 - its row-major
// index) below, so the max is the first such element; bit 63 clear for a rotation that overflowed from finite inputs
// (the index of its row's first element). The host reads the code back (the one synchronization) and says which.
#include "cuda/fp8_quantize.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/fp8.hpp"     // kE4m3Max
#include "core/philox.hpp"  // philox4x32_10
#include "cuda/common.cuh"  // CUDA_CHECK, CUDA_CHECK_LAUNCH, DeviceBuffer, median_ms
#include "cuda/dispatch.cuh"

namespace flashlab::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kMinBlocks = 4;  // 1024 threads an SM (at most 64 registers each): enough loads in flight
// The values of a rotated row a lane holds from d = 128 on (lanes_per_row; tools/fp8_prepass_race races 16 and 32).
constexpr int kRotateValuesPerLane = 32;
// 32 values a lane and the butterflies: 3 blocks (85 registers) spill at d = 256. 16 values fit 4 blocks.
constexpr int kMinBlocksRotating = kRotateValuesPerLane == 16 ? 4 : 2;
// 64 values a lane (one shuffle stage fewer, one block an SM) was raced too and dropped: it was slower at d = 128 and
// 256 and its rotated bytes differed from the other two builds' there (bench/results/h200-fp8-prepass-race-64_2026-11-28.txt).
static_assert(kRotateValuesPerLane == 16 || kRotateValuesPerLane == 32,
              "the rotation is built and checked with 16 or 32 values of a row per lane");
constexpr int kIters = 4;  // row groups per warp per block: a block reads 64 KiB of bf16 (128 KiB of f32)

constexpr std::uint64_t kInputBit = 1ull << 63;
constexpr std::uint64_t kIndexMask = (1ull << 62) - 1;
constexpr std::uint32_t kInfBits = 0x7f800000u;

// The lanes that hold one row. Without rotation 16 elements each (24 at d = 192, whose 12 lanes would not divide a
// warp): few registers, many warps in flight, and the pass runs at the copy bandwidth. With rotation 32 each from
// d = 128 (4 lanes at 128, 8 at 256), since every lane stage costs a shuffle per element and the shuffles, not the
// bytes, then bound the pass; at d = 64 16 each (4 lanes) measured faster than 32 (2 lanes).
constexpr int lanes_per_row(int d, bool rotate) {
  if (rotate) return d == 64 ? 4 : d / kRotateValuesPerLane;
  return d == 192 ? 8 : d / 16;
}

// Where a row's elements sit in the lanes and registers (see the opening comment).
template <class T, int D, bool kRotate>
struct RowMap {
  static constexpr int kVec = 16 / int(sizeof(T));  // elements per 16-byte load
  static constexpr int kLanes = lanes_per_row(D, kRotate);
  static constexpr int kPerLane = D / kLanes;
  static constexpr int kChunks = kPerLane / kVec;
  static constexpr int kRowsPerWarp = 32 / kLanes;
  static constexpr int kRowsPerBlock = kRowsPerWarp * kWarps * kIters;
  static_assert(D % (kLanes * kVec) == 0, "a lane's share of a row is whole 16-byte loads");
  // The column of lane l's element j.
  static __device__ __forceinline__ int column(int j, int l) { return ((j / kVec) * kLanes + l) * kVec + j % kVec; }
};

// 16 bytes of T as floats (exact for every type).
__device__ __forceinline__ void unpack(const uint4& raw, float* out, float) {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ void unpack(const uint4& raw, float* out, __nv_bfloat16) {
  const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);             // low half: the first element
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void unpack(const uint4& raw, float* out, __half) {
  const std::uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    std::memcpy(&h, &w[i], sizeof h);
    const float2 f = __half22float2(h);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Lane l's share of a row as its 16-byte loads (zeros when the row is past the end: it still takes part in the
// shuffles), and the same as floats.
template <class T, int D, bool kRotate>
__device__ __forceinline__ void load_raw(const T* row, bool valid, int l, uint4 (&raw)[RowMap<T, D, kRotate>::kChunks]) {
  using M = RowMap<T, D, kRotate>;
#pragma unroll
  for (int c = 0; c < M::kChunks; ++c)
    raw[c] = valid ? __ldg(reinterpret_cast<const uint4*>(row + (c * M::kLanes + l) * M::kVec)) : make_uint4(0, 0, 0, 0);
}
template <class T, int D, bool kRotate>
__device__ __forceinline__ void unpack_row(const uint4 (&raw)[RowMap<T, D, kRotate>::kChunks],
                                           float (&y)[RowMap<T, D, kRotate>::kPerLane]) {
  using M = RowMap<T, D, kRotate>;
#pragma unroll
  for (int c = 0; c < M::kChunks; ++c) unpack(raw[c], y + c * M::kVec, T{});
}
template <class T, int D, bool kRotate>
__device__ __forceinline__ void load_row(const T* row, bool valid, int l, float (&y)[RowMap<T, D, kRotate>::kPerLane]) {
  uint4 raw[RowMap<T, D, kRotate>::kChunks];
  load_raw<T, D, kRotate>(row, valid, l, raw);
  unpack_row<T, D, kRotate>(raw, y);
}

// The Walsh-Hadamard stages whose pairs sit in one lane's registers: for each span s (register-index distance
// kFrom, 2 kFrom, ... below kTo), y[j], y[j + s] <- y[j] + y[j + s], y[j] - y[j + s].
template <int kFrom, int kTo, int kN>
__device__ __forceinline__ void butterflies_in_lane(float (&y)[kN]) {
#pragma unroll
  for (int s = kFrom; s < kTo; s *= 2)
#pragma unroll
    for (int j = 0; j < kN; ++j)
      if (!(j & s)) {
        const float a = y[j], b = y[j + s];
        y[j] = a + b;
        y[j + s] = a - b;
      }
}

// y <- H D y / sqrt(d) in fp32, on the kLanes lanes that hold the row. `signs`: bit j is D's sign of element j.
template <class T, int D, bool kRotate>
__device__ __forceinline__ void rotate_row(float (&y)[RowMap<T, D, kRotate>::kPerLane], int l, std::uint32_t signs) {
  using M = RowMap<T, D, kRotate>;
  constexpr float kNorm = D == 64 ? 0.125f : D == 128 ? 0.08838834764831844055f : 0.0625f;  // fp32(1/sqrt(d))
#pragma unroll
  for (int j = 0; j < M::kPerLane; ++j) y[j] = __uint_as_float(__float_as_uint(y[j]) ^ (((signs >> j) & 1u) << 31));
  butterflies_in_lane<1, M::kVec>(y);  // spans 1 .. kVec / 2: within a lane's 16-byte chunks
  // Spans kVec .. kVec kLanes / 2: across the lanes. The lane holding the upper element computes a - b as (-b) + a.
#pragma unroll
  for (int m = 1; m < M::kLanes; m *= 2) {
    const std::uint32_t flip = (l & m) ? 0x80000000u : 0u;
#pragma unroll
    for (int j = 0; j < M::kPerLane; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, y[j], m);
      y[j] = __uint_as_float(__float_as_uint(y[j]) ^ flip) + other;
    }
  }
  butterflies_in_lane<M::kVec, M::kPerLane>(y);  // spans kVec kLanes .. d / 2: between a lane's chunks
#pragma unroll
  for (int j = 0; j < M::kPerLane; ++j) y[j] *= kNorm;
}

// Lane l's sign bits, from the whole row's. The row's words pass through shared memory: picked from the kernel
// parameter by an index that depends on the lane, they made the compiler copy the parameter to local memory and
// branch per lane (at d = 256 the quantizing pass ran at half its speed, diverged; ncu, 2026-11-28). Every thread of
// the block calls it (it synchronizes the block).
template <class T, int D, bool kRotate>
__device__ __forceinline__ std::uint32_t lane_signs(const E4m3SignBits& bits, int l) {
  using M = RowMap<T, D, kRotate>;
  __shared__ std::uint32_t words[D / 32];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < D / 32; ++w) words[w] = bits.words[w];
  }
  __syncthreads();
  std::uint32_t out = 0;
#pragma unroll
  for (int j = 0; j < M::kPerLane; ++j) {
    const int c = M::column(j, l);
    out |= ((words[c >> 5] >> (c & 31)) & 1u) << j;
  }
  return out;
}

// A block's (b, h) slice and chunk of rows. Blocks are numbered (b, chunk, h) with h fastest, so that the blocks
// running at once read neighbouring rows of memory; pass 2 takes the numbers backwards.
struct BlockPlace {
  int b, h, chunk;
};
__device__ __forceinline__ BlockPlace place(int block, int heads, int chunks) {
  const int h = block % heads, rest = block / heads;
  return BlockPlace{rest / chunks, h, rest % chunks};
}

// The rare path: this lane's share of row (b, s, h) (first element at flat index `row_index`) has a non-finite y.
template <class T, int D, bool kRotate>
__device__ __noinline__ void report_non_finite(const T* row, std::int64_t row_index, int l, unsigned long long* flag) {
  using M = RowMap<T, D, kRotate>;
  float x[M::kPerLane];
  load_row<T, D, kRotate>(row, true, l, x);
  unsigned long long code = 0;
#pragma unroll
  for (int j = 0; j < M::kPerLane; ++j)
    if (!(fabsf(x[j]) <= FLT_MAX)) {
      const unsigned long long c = kInputBit | (kIndexMask - static_cast<unsigned long long>(row_index + M::column(j, l)));
      code = c > code ? c : code;
    }
  // Finite inputs and a non-finite y: the fp32 rotation overflowed (or another lane of the row holds the bad input,
  // whose code wins). Without rotation y is x, so this cannot happen.
  if (code == 0 && kRotate) code = kIndexMask - static_cast<unsigned long long>(row_index);
  if (code != 0) atomicMax(flag, code);
}

// A lane's walk over its rows of the block, iteration it at row s = chunk kRowsPerBlock + (it kWarps + warp)
// kRowsPerWarp + g, one row group's bytes ahead: take() hands over the current row's values and requests the next's.
template <class T, int D, bool kRotate>
struct RowCursor {
  using M = RowMap<T, D, kRotate>;
  const T* x;
  int seq, heads, l;
  BlockPlace p;
  int s;                    // the current row
  uint4 raw[M::kChunks];    // its bytes, requested one iteration ago
  __device__ RowCursor(const T* x_, int seq_, int heads_, BlockPlace p_, int warp, int g, int l_)
      : x(x_), seq(seq_), heads(heads_), l(l_), p(p_), s(p_.chunk * M::kRowsPerBlock + warp * M::kRowsPerWarp + g) {
    load_raw<T, D, kRotate>(x + row_index_of(s), s < seq, l, raw);
  }
  __device__ std::int64_t row_index_of(int row) const {
    return ((std::int64_t(p.b) * seq + (row < seq ? row : 0)) * heads + p.h) * D;
  }
  __device__ std::int64_t row_index() const { return row_index_of(s); }
  __device__ void take(float (&y)[M::kPerLane], bool more) {
    unpack_row<T, D, kRotate>(raw, y);
    s += kWarps * M::kRowsPerWarp;
    if (more) load_raw<T, D, kRotate>(x + row_index_of(s), s < seq, l, raw);
  }
};

template <class T, int D, bool kRotate>
__global__ void __launch_bounds__(kThreads, kRotate ? kMinBlocksRotating : kMinBlocks) amax_kernel(const T* __restrict__ x, int seq, int heads, int chunks,
                                                        E4m3SignBits sign_bits, std::uint32_t* __restrict__ amax,
                                                        unsigned long long* __restrict__ flag) {
  using M = RowMap<T, D, kRotate>;
  const BlockPlace p = place(blockIdx.x, heads, chunks);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / M::kLanes, l = lane % M::kLanes;
  const std::uint32_t signs = kRotate ? lane_signs<T, D, kRotate>(sign_bits, l) : 0u;
  std::uint32_t max_bits = 0;
  // The next row group's bytes are requested before this one's arithmetic (RowCursor): with the rotation's butterflies
  // between the loads, the pass would otherwise wait on memory and compute in turn.
  RowCursor<T, D, kRotate> rows(x, seq, heads, p, warp, g, l);
  for (int it = 0; it < kIters; ++it) {
    if (__all_sync(0xffffffffu, rows.s >= seq)) break;  // the warp's rows are all past the end (s grows with it)
    const bool valid = rows.s < seq;
    const std::int64_t row_index = rows.row_index();
    float y[M::kPerLane];
    rows.take(y, it + 1 < kIters);
    if constexpr (kRotate) rotate_row<T, D, kRotate>(y, l, signs);
    std::uint32_t row_bits = 0;
#pragma unroll
    for (int j = 0; j < M::kPerLane; ++j) row_bits = max(row_bits, __float_as_uint(y[j]) & 0x7fffffffu);
    if (row_bits >= kInfBits) report_non_finite<T, D, kRotate>(x + row_index, row_index, l, flag);
    max_bits = max(max_bits, row_bits);
  }
  __shared__ std::uint32_t warp_max[kWarps];
  max_bits = __reduce_max_sync(0xffffffffu, max_bits);
  if (lane == 0) warp_max[warp] = max_bits;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kWarps; ++w) max_bits = max(max_bits, warp_max[w]);
    if (max_bits != 0) atomicMax(&amax[std::int64_t(p.b) * heads + p.h], max_bits);
  }
}

// Four floats to four e4m3 bytes (satfinite, nearest even), the first in the lowest byte.
__device__ __forceinline__ std::uint32_t pack4_e4m3(const float* z) {
  const std::uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(z[0], z[1]), __NV_SATFINITE, __NV_E4M3);
  const std::uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(z[2], z[3]), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

template <class T, int D, bool kRotate>
__global__ void __launch_bounds__(kThreads, kRotate ? kMinBlocksRotating : kMinBlocks) quantize_kernel(const T* __restrict__ x, int seq, int heads, int chunks,
                                                            E4m3SignBits sign_bits,
                                                            const std::uint32_t* __restrict__ amax,
                                                            std::uint8_t* __restrict__ q, float* __restrict__ descale) {
  using M = RowMap<T, D, kRotate>;
  const BlockPlace p = place(gridDim.x - 1 - blockIdx.x, heads, chunks);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / M::kLanes, l = lane % M::kLanes;
  const std::uint32_t signs = kRotate ? lane_signs<T, D, kRotate>(sign_bits, l) : 0u;
  // scale = 448 / amax as the CPU makes it (quantize_e4m3_per_head): IEEE division (no fast math in this build).
  const float a = __uint_as_float(amax[std::int64_t(p.b) * heads + p.h]);
  float scale = 1.0f;
  if (a > 0.0f) {
    scale = kE4m3Max / a;
    if (!isfinite(scale)) scale = 0x1p126f;  // amax so small that 448 / amax overflows
  }
  if (p.chunk == 0 && threadIdx.x == 0) descale[std::int64_t(p.b) * heads + p.h] = 1.0f / scale;
  RowCursor<T, D, kRotate> rows(x, seq, heads, p, warp, g, l);
  for (int it = 0; it < kIters; ++it) {
    if (__all_sync(0xffffffffu, rows.s >= seq)) break;  // the warp's rows are all past the end (s grows with it)
    const bool valid = rows.s < seq;
    const std::int64_t row_index = rows.row_index();
    float y[M::kPerLane];
    rows.take(y, it + 1 < kIters);
    if constexpr (kRotate) rotate_row<T, D, kRotate>(y, l, signs);
#pragma unroll
    for (int j = 0; j < M::kPerLane; ++j) y[j] *= scale;
    if (!valid) continue;
    std::uint8_t* out = q + row_index;
#pragma unroll
    for (int c = 0; c < M::kChunks; ++c) {
      std::uint8_t* dst = out + (c * M::kLanes + l) * M::kVec;
      if constexpr (M::kVec == 8) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pack4_e4m3(y + 8 * c), pack4_e4m3(y + 8 * c + 4));
      } else {
        *reinterpret_cast<std::uint32_t*>(dst) = pack4_e4m3(y + 4 * c);
      }
    }
  }
}

// ---- Host side ----------------------------------------------------------------------------------------------

int input_bytes(DType t) { return t == DType::F32 ? 4 : 2; }

template <const auto& kList>
bool listed(int d) {
  for (int x : kList)
    if (x == d) return true;
  return false;
}

// Blocks per (b, h) slice: RowMap's kRowsPerBlock, which depends on d only (kLanes does not depend on T).
std::int64_t chunks_of(int seq, int head_dim, bool rotate) {
  const std::int64_t rows = std::int64_t(32 / lanes_per_row(head_dim, rotate)) * kWarps * kIters;
  return std::max<std::int64_t>(1, (seq + rows - 1) / rows);
}

// Throws InputError unless `p` is a pointer into device memory of the current device with the given alignment.
void check_pointer(const void* p, std::size_t align, const char* what, const char* tensor) {
  const std::string who = std::string(tensor) + "'s " + what;
  if (p == nullptr) throw InputError("fp8 quantization on the GPU needs " + who + " as a device pointer, got null");
  cudaPointerAttributes attr{};
  CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    throw InputError("fp8 quantization on the GPU needs " + who + " in device memory, but it points to host memory");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (attr.device != device)
    throw InputError("fp8 quantization on the GPU needs " + who + " on the current device " + std::to_string(device) +
                     ", but it lives on device " + std::to_string(attr.device));
  if (reinterpret_cast<std::uintptr_t>(p) % align != 0)
    throw InputError("fp8 quantization on the GPU needs " + who + " " + std::to_string(align) +
                     "-byte aligned (as cudaMalloc's are), got address " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(p)));
}

void check_call(const E4m3QuantizeIo& io, const E4m3Rotation& rot, const void* scratch, const char* name) {
  if (io.dtype != DType::F32 && io.dtype != DType::F16 && io.dtype != DType::BF16)
    throw InputError(std::string("fp8 quantization on the GPU reads f32, f16 or bf16 tensors, but ") + name + " is " +
                     to_string(io.dtype));
  if (io.batch < 0 || io.seq < 0 || io.heads < 0)
    throw InputError(std::string("fp8 quantization on the GPU needs non-negative extents, but ") + name +
                     " has (B, S, H) = (" + std::to_string(io.batch) + ", " + std::to_string(io.seq) + ", " +
                     std::to_string(io.heads) + ")");
  if (rot.enabled) {
    if (!listed<kE4m3RotationHeadDims>(io.head_dim))
      throw InputError("the Hadamard rotation takes head_dim 64, 128 or 256, not " + std::to_string(io.head_dim));
  } else if (!listed<kE4m3QuantizeHeadDims>(io.head_dim)) {
    throw InputError("fp8 quantization on the GPU takes head_dim 64, 128, 192 or 256, not " +
                     std::to_string(io.head_dim));
  }
  const std::int64_t blocks = chunks_of(io.seq, io.head_dim, rot.enabled) * io.batch * io.heads;
  if (blocks > 0x7fffffff)
    throw InputError(std::string("fp8 quantization on the GPU launches one block per (b, chunk of rows, h), and ") +
                     name + " needs " + std::to_string(blocks) + ", past the 2^31 - 1 a launch takes");
  if (io.batch == 0 || io.heads == 0) return;  // nothing to read or write
  if (io.seq > 0) {
    check_pointer(io.x, 16, "input", name);
    check_pointer(io.q, 16, "e4m3 output", name);
  }
  check_pointer(io.descale, 4, "descale output", name);
  check_pointer(scratch, 8, "scratch", name);
}

template <class T, int D, bool kRotate>
void launch_passes(const E4m3QuantizeIo& io, const E4m3SignBits& signs, void* scratch, cudaStream_t stream) {
  const int chunks = static_cast<int>(chunks_of(io.seq, D, kRotate));
  const unsigned blocks = static_cast<unsigned>(std::int64_t(chunks) * io.batch * io.heads);
  auto* flag = static_cast<unsigned long long*>(scratch);
  auto* amax = reinterpret_cast<std::uint32_t*>(static_cast<unsigned char*>(scratch) + 8);
  const T* x = static_cast<const T*>(io.x);
  if (io.seq > 0) {
    amax_kernel<T, D, kRotate><<<blocks, kThreads, 0, stream>>>(x, io.seq, io.heads, chunks, signs, amax, flag);
    CUDA_CHECK_LAUNCH();
  }
  // With S = 0 this pass still runs one block per (b, h): it writes the descale, 1.
  quantize_kernel<T, D, kRotate><<<blocks, kThreads, 0, stream>>>(x, io.seq, io.heads, chunks, signs, amax, io.q,
                                                                   io.descale);
  CUDA_CHECK_LAUNCH();
}

template <class T>
void launch_typed(const E4m3QuantizeIo& io, const E4m3Rotation& rot, void* scratch, cudaStream_t stream) {
  const E4m3SignBits signs = rot.enabled ? e4m3_rotation_sign_bits(io.head_dim, rot.seed) : E4m3SignBits{};
  dispatch_head_dim<kE4m3QuantizeHeadDims>(io.head_dim, "fp8 quantization", [&]<int D>() {
    if (rot.enabled) {
      if constexpr (D == 64 || D == 128 || D == 256) launch_passes<T, D, true>(io, signs, scratch, stream);
    } else {
      launch_passes<T, D, false>(io, signs, scratch, stream);
    }
  });
}

std::string to_string_exact(double v) { return std::to_string(v); }

// The sentence for a non-zero flag code.
InputError non_finite_error(const E4m3QuantizeIo& io, std::uint64_t code, const char* name, cudaStream_t stream) {
  const std::int64_t index = static_cast<std::int64_t>(kIndexMask - (code & kIndexMask));
  const std::int64_t d = index % io.head_dim, h = (index / io.head_dim) % io.heads;
  const std::int64_t s = (index / io.head_dim / io.heads) % io.seq, b = index / io.head_dim / io.heads / io.seq;
  if ((code & kInputBit) == 0)
    return InputError(std::string("fp8 quantization needs finite inputs, but the fp32 Hadamard rotation of ") + name +
                      "'s row at (b, s, h) = (" + std::to_string(b) + ", " + std::to_string(s) + ", " +
                      std::to_string(h) + ") overflows float: its elements are finite but too large to rotate");
  // Read the element back for the sentence (a second synchronization, on the error path only).
  double value = 0;
  const int bytes = input_bytes(io.dtype);
  std::uint32_t raw = 0;
  CUDA_CHECK(cudaMemcpyAsync(&raw, static_cast<const unsigned char*>(io.x) + index * bytes, bytes,
                             cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (io.dtype == DType::F32) {
    value = bits_to_float(raw);
  } else if (io.dtype == DType::BF16) {
    value = bf16_bits_to_float(static_cast<std::uint16_t>(raw));
  } else {
    value = f16_bits_to_float(static_cast<std::uint16_t>(raw));
  }
  return InputError(std::string("fp8 quantization needs finite inputs, but ") + name + " at (b, s, h, d) = (" +
                    std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) + ", " +
                    std::to_string(d) + ") is " + to_string_exact(value) + " (not finite in float)");
}

std::size_t round16(std::size_t n) { return (n + 15) / 16 * 16; }

struct PrepassPart {
  E4m3QuantizeIo io;
  const char* name;
  bool rotate;
  std::size_t offset;  // in the scratch
};

// Q, K and V as three calls of the per-tensor pass.
std::array<PrepassPart, 3> parts_of(const E4m3QkvPrepassIo& io, bool rotate) {
  const Shape& s = io.shape;
  const std::size_t q_scratch = e4m3_quantize_scratch_bytes(s.batch, s.heads_q);
  const std::size_t kv_scratch = e4m3_quantize_scratch_bytes(s.batch, s.heads_kv);
  return {PrepassPart{{io.q, io.dtype, s.batch, s.seq_q, s.heads_q, s.head_dim, io.q8, io.q_descale}, "Q", rotate, 0},
          PrepassPart{{io.k, io.dtype, s.batch, s.seq_k, s.heads_kv, s.head_dim, io.k8, io.k_descale}, "K", rotate,
                      q_scratch},
          PrepassPart{{io.v, io.dtype, s.batch, s.seq_k, s.heads_kv, s.head_dim, io.v8, io.v_descale}, "V", false,
                      q_scratch + kv_scratch}};
}

void* at(void* scratch, std::size_t offset) { return static_cast<unsigned char*>(scratch) + offset; }
const void* at(const void* scratch, std::size_t offset) { return static_cast<const unsigned char*>(scratch) + offset; }

}  // namespace

E4m3SignBits e4m3_rotation_sign_bits(int head_dim, std::uint64_t seed) {
  if (!listed<kE4m3RotationHeadDims>(head_dim))
    throw InputError("the Hadamard rotation takes head_dim 64, 128 or 256, not " + std::to_string(head_dim));
  E4m3SignBits bits;
  for (int i = 0; i < head_dim; i += 4) {
    const Philox4 r = philox4x32_10(Philox4{{static_cast<std::uint32_t>(i / 4), 0u, 0u, 0x48414441u}}, seed);
    for (int k = 0; k < 4; ++k)
      if (r.x[k] & 1u) bits.words[(i + k) >> 5] |= 1u << ((i + k) & 31);
  }
  return bits;
}

std::size_t e4m3_quantize_scratch_bytes(int batch, int heads) {
  return round16(8 + 4 * static_cast<std::size_t>(std::max(batch, 0)) * static_cast<std::size_t>(std::max(heads, 0)));
}

namespace {
// The launches of one tensor, its call checked.
void launch_checked(const E4m3QuantizeIo& io, const E4m3Rotation& rot, void* scratch, cudaStream_t stream) {
  if (io.batch == 0 || io.heads == 0) return;
  CUDA_CHECK(cudaMemsetAsync(scratch, 0, e4m3_quantize_scratch_bytes(io.batch, io.heads), stream));
  switch (io.dtype) {
    case DType::F32: launch_typed<float>(io, rot, scratch, stream); break;
    case DType::F16: launch_typed<__half>(io, rot, scratch, stream); break;
    default: launch_typed<__nv_bfloat16>(io, rot, scratch, stream); break;
  }
}
}  // namespace

void launch_quantize_e4m3_per_head(const E4m3QuantizeIo& io, const E4m3Rotation& rot, void* scratch,
                                   cudaStream_t stream) {
  check_call(io, rot, scratch, "x");
  launch_checked(io, rot, scratch, stream);
}

void check_quantize_e4m3_finite(const E4m3QuantizeIo& io, const void* scratch, const char* name, cudaStream_t stream) {
  if (io.batch == 0 || io.heads == 0) return;  // nothing was launched
  std::uint64_t code = 0;
  CUDA_CHECK(cudaMemcpyAsync(&code, scratch, sizeof code, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the one synchronization: the host reads the flag
  if (code != 0) throw non_finite_error(io, code, name, stream);
}

void quantize_e4m3_per_head_on_device(const E4m3QuantizeIo& io, const E4m3Rotation& rot, const char* name,
                                      void* scratch, cudaStream_t stream) {
  check_call(io, rot, scratch, name);
  launch_checked(io, rot, scratch, stream);
  check_quantize_e4m3_finite(io, scratch, name, stream);
}

std::size_t e4m3_qkv_prepass_scratch_bytes(const Shape& s) {
  return e4m3_quantize_scratch_bytes(s.batch, s.heads_q) + 2 * e4m3_quantize_scratch_bytes(s.batch, s.heads_kv);
}

void launch_e4m3_qkv_prepass(const E4m3QkvPrepassIo& io, const E4m3Rotation& rot, void* scratch,
                             cudaStream_t stream) {
  const auto parts = parts_of(io, rot.enabled);
  for (const PrepassPart& p : parts) check_call(p.io, E4m3Rotation{p.rotate, rot.seed}, at(scratch, p.offset), p.name);
  for (const PrepassPart& p : parts) launch_checked(p.io, E4m3Rotation{p.rotate, rot.seed}, at(scratch, p.offset), stream);
}

void check_e4m3_qkv_prepass_finite(const E4m3QkvPrepassIo& io, const void* scratch, cudaStream_t stream) {
  const auto parts = parts_of(io, false);
  std::uint64_t codes[3] = {0, 0, 0};
  for (int n = 0; n < 3; ++n)
    if (parts[n].io.batch > 0 && parts[n].io.heads > 0)
      CUDA_CHECK(cudaMemcpyAsync(&codes[n], at(scratch, parts[n].offset), sizeof codes[n], cudaMemcpyDeviceToHost,
                                 stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // the one synchronization: the host reads the three flags
  for (int n = 0; n < 3; ++n)
    if (codes[n] != 0) throw non_finite_error(parts[n].io, codes[n], parts[n].name, stream);
}

void e4m3_qkv_prepass_on_device(const E4m3QkvPrepassIo& io, const E4m3Rotation& rot, void* scratch,
                                cudaStream_t stream) {
  launch_e4m3_qkv_prepass(io, rot, scratch, stream);
  check_e4m3_qkv_prepass_finite(io, scratch, stream);
}

double time_e4m3_qkv_prepass_ms(const E4m3QkvPrepassIo& io, const E4m3Rotation& rot, int warmup, int iters) {
  DeviceBuffer<std::uint64_t> scratch((e4m3_qkv_prepass_scratch_bytes(io.shape) + 7) / 8);
  const auto parts = parts_of(io, rot.enabled);
  for (const PrepassPart& p : parts) check_call(p.io, E4m3Rotation{p.rotate, rot.seed}, at(scratch.data(), p.offset), p.name);
  // The timed runs are the launches alone (checked once above), as a forward that calls launch_e4m3_qkv_prepass
  // with checked buffers would run them.
  const auto run = [&] {
    for (const PrepassPart& p : parts) launch_checked(p.io, E4m3Rotation{p.rotate, rot.seed}, at(scratch.data(), p.offset), 0);
  };
  const double ms = median_ms(run, warmup, iters);
  check_e4m3_qkv_prepass_finite(io, scratch.data(), /*stream=*/0);
  return ms;
}

std::size_t e4m3_qkv_prepass_bytes(const Shape& s, DType dtype) {
  const std::size_t q = std::size_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::size_t kv = std::size_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
  const std::size_t elems = q + 2 * kv, eb = static_cast<std::size_t>(input_bytes(dtype));
  const std::size_t per_head = std::size_t(s.batch) * (s.heads_q + 2 * s.heads_kv);
  return elems * (2 * eb + 1) + per_head * 4 /* descales */ + e4m3_qkv_prepass_scratch_bytes(s);
}

}  // namespace flashlab::cuda
