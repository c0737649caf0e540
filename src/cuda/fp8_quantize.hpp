#pragma once
// Per-head e4m3 quantization on the GPU, with FlashAttention-3's optional Hadamard rotation ("incoherent
// processing"): the pre-pass that turns a model's f32 / f16 / bf16 activations into the e4m3 Q, K, V and the
// per-(batch, head) descales that cuda-fa3-ws's FP8 forward reads (core/fp8.hpp, E4m3Qkv). The CPU reference
// does the same on host tensors (cpu_reference/fp8.hpp); a real model's activations are already on the GPU, so
// this is the path it takes.
//
// What it computes, per (b, h) slice (S, d) of a (B, S, H, d) tensor x (core/tensor.hpp's layout):
//   y      = float(x), or with rotation y = fp32( H D float(x) / sqrt(d) ) row by row along the head dim (H the
//            Sylvester Hadamard matrix, D the signs of rotation_signs(d, seed) in cpu_reference/fp8.hpp);
//   amax   = max |y| over the slice;  scale = 448 / amax in float (1 when amax is 0, 2^126 when 448 / amax
//            overflows float);  q = satfinite-round-to-nearest-even e4m3(y * scale);  descale = 1 / scale.
// That is the CPU's quantize_e4m3_per_head(rotate ? hadamard_rotate(x, seed) : x) with one difference: the CPU
// rotates in double and rounds the result to float once, the GPU rotates in fp32 (log2(d) butterfly stages, each
// add rounded, then the product by fp32(1/sqrt(d))). Without rotation the two do the same fp32 operations and the
// bytes and descales are bit-identical. With rotation an element's y may differ from the CPU's by at most
//   (log2(d) + 4) * 2^-24 * ||x_row||_1 / sqrt(d)
// (tests/gpu/test_cuda_fp8_quantize.cpp derives and checks it), so a byte may land one e4m3 step away where y *
// scale sits that close to a rounding boundary, and a descale may differ in its last bits.
//
// Head dims: 64, 128, 256 with rotation (the CPU's check_rotation_head_dim); 64, 128, 192, 256 without. Input
// rows must be 16-byte aligned (the base pointer; d * element bytes is then a multiple of 16).
//
// Scratch: the caller allocates it (e4m3_quantize_scratch_bytes; 8-byte aligned, cudaMalloc's is) and may reuse
// it from call to call on one stream. It holds the per-(b, h) amax of the first pass and the non-finite flag.
//
// Streams and synchronization: everything runs on the caller's stream, in its order. The launch_* functions never
// synchronize: they leave the non-finite flag in the scratch. The *_on_device functions, and check_* on their own,
// read that flag back, which is the one synchronization (cudaStreamSynchronize on the caller's stream after the
// kernels), and turn it into an InputError naming the tensor and the first non-finite element.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/problem.hpp"  // DType, Shape, InputError

namespace flashlab::cuda {

// The head dims each mode takes (any other is one InputError sentence).
inline constexpr int kE4m3QuantizeHeadDims[] = {64, 128, 192, 256};
inline constexpr int kE4m3RotationHeadDims[] = {64, 128, 256};

struct E4m3Rotation {
  bool enabled = false;
  std::uint64_t seed = 0;  // the seed of D, as hadamard_rotate's
};

// The signs of D as bits (bit i of the 256: sign i is -1), drawn as cpu_reference/fp8.cpp's rotation_signs draws
// them (Philox4x32-10 of core/philox.hpp, counter (i / 4, 0, 0, 0x48414441), bit 0 of word i % 4): computed on the
// host and passed to the kernels by value. Throws InputError unless head_dim is 64, 128 or 256.
struct E4m3SignBits {
  std::uint32_t words[8] = {};
  bool negative(int i) const { return (words[i >> 5] >> (i & 31)) & 1u; }
};
E4m3SignBits e4m3_rotation_sign_bits(int head_dim, std::uint64_t seed);

// One tensor. Device pointers, contiguous row-major; the caller owns them.
struct E4m3QuantizeIo {
  const void* x = nullptr;     // (B, S, H, d) of `dtype`: F32, F16 or BF16
  DType dtype = DType::BF16;
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  std::uint8_t* q = nullptr;   // (B, S, H, d) e4m3 bytes, written
  float* descale = nullptr;    // (B, H) fp32, written (also when S = 0: 1)
};

// Bytes of scratch one tensor of (batch, heads) needs: 8 (the flag) + 4 per (b, h) (the amax).
std::size_t e4m3_quantize_scratch_bytes(int batch, int heads);

// Checks the call (InputError: dtype, head dim for the mode, extents, null, host or misaligned pointers), then
// enqueues three operations on `stream`: a memset of the scratch, the amax pass, the quantize pass. No sync.
void launch_quantize_e4m3_per_head(const E4m3QuantizeIo&, const E4m3Rotation&, void* scratch, cudaStream_t stream);
// Synchronizes `stream` and throws InputError naming `name` ("Q") if the launch that used `scratch` met a
// non-finite element (or, rotating, a row whose fp32 rotation overflows). The outputs are then meaningless.
void check_quantize_e4m3_finite(const E4m3QuantizeIo&, const void* scratch, const char* name, cudaStream_t stream);
// Both: the GPU's quantize_e4m3_per_head. Returns once the outputs are written and checked.
void quantize_e4m3_per_head_on_device(const E4m3QuantizeIo&, const E4m3Rotation&, const char* name, void* scratch,
                                      cudaStream_t stream);

// ---- The FP8 forward's pre-pass: Q and K (rotated when asked, with one seed) and V -----------------------------

// Device pointers, as cuda-fa3-ws's Params holds them: q (B, S_q, H_q, d), k and v (B, S_k, H_kv, d) of `dtype`;
// their e4m3 bytes in the same layouts, and the descales (B, H_q) and (B, H_kv).
struct E4m3QkvPrepassIo {
  Shape shape;
  DType dtype = DType::BF16;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  std::uint8_t* q8 = nullptr;
  std::uint8_t* k8 = nullptr;
  std::uint8_t* v8 = nullptr;
  float* q_descale = nullptr;
  float* k_descale = nullptr;
  float* v_descale = nullptr;
};

// Scratch of the three together (Q's, then K's, then V's pieces).
std::size_t e4m3_qkv_prepass_scratch_bytes(const Shape&);
// Enqueue all of it on `stream` (rotation applies to Q and K only; V is never rotated). No sync.
void launch_e4m3_qkv_prepass(const E4m3QkvPrepassIo&, const E4m3Rotation&, void* scratch, cudaStream_t stream);
// One sync for the three flags; throws naming Q, K or V (the first that has a non-finite element).
void check_e4m3_qkv_prepass_finite(const E4m3QkvPrepassIo&, const void* scratch, cudaStream_t stream);
void e4m3_qkv_prepass_on_device(const E4m3QkvPrepassIo&, const E4m3Rotation&, void* scratch, cudaStream_t stream);

// The benchmark hook: the median time in ms of launch_e4m3_qkv_prepass on the default stream (CUDA events around
// each run, `warmup` untimed runs first), with its own scratch; the flags are checked once, after the timed runs.
// The bytes one run moves are e4m3_qkv_prepass_bytes.
double time_e4m3_qkv_prepass_ms(const E4m3QkvPrepassIo&, const E4m3Rotation&, int warmup, int iters);
// DRAM bytes of one run, if nothing stays in the L2 between the two passes: each input read twice (amax, then
// quantize), the e4m3 bytes written once, the descales written and the scratch cleared.
std::size_t e4m3_qkv_prepass_bytes(const Shape&, DType);

}  // namespace flashlab::cuda
