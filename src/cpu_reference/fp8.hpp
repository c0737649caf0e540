#pragma once
// FP8 attention on the CPU: what a Hopper kernel that feeds its tensor cores e4m3 (core/fp8.hpp) computes,
// emulated operation by operation, so that the kernel's output has something exact to be held to before any
// GPU runs it. Three pieces, as in FlashAttention-3's FP8 forward:
//  * per-head scaling: e4m3 holds magnitudes up to 448 with 3 mantissa bits, so each (batch, head) slice of
//    Q, K, V is multiplied by s = 448 / amax before rounding, and its matmul results by the descale 1 / s;
//  * incoherent processing: a random orthogonal rotation of the head dim (Hadamard times random signs) applied
//    to Q and K alike. It leaves Q K^T unchanged, and spreads an outlier channel over all d channels, so the
//    per-head amax no longer wastes the format's range on one channel;
//  * the forward itself: S = Q K^T and O = P V on e4m3 operands with fp32 accumulation, softmax in fp32, P
//    stored as e4m3 under a fixed scale, O stored as bf16.
// Tensors use the project's layout (core/tensor.hpp): Q, O (B, S_q, H_q, d); K, V (B, S_k, H_kv, d); LSE
// (B, H_q, S_q). Values are held in double, and every value a kernel would store is exactly representable in
// its format.
//
// The rule, written once (check_fp8_emulation): the emulated forward is judged against naive attention in
// double on the DEQUANTIZED inputs (the rotated, quantized, descaled Q, K, V: what the FP8 operands stand
// for), so that the error of quantizing the inputs, which is the format's and not the kernel's, is left out.
// It must sit within fp8_emulation_bounds, a worst-case bound derived from the e4m3 rounding of P, the fp32
// arithmetic and the bf16 rounding of O (derivation in fp8.cpp). How far FP8 attention lands from attention
// on the unquantized inputs is a property of the format and the inputs: tools/fp8_error_study.cpp measures it.
// A kernel (cuda-fa3-ws's FP8 forward, `flashlab check --dtype e4m3`) is held to the emulation on the same operands:
// within kFp8KernelFactor of its error against the same reference (check_fp8_kernel).
#include <cstdint>
#include <vector>

#include "core/fp8.hpp"  // E4m3Qkv
#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab {

// ---- Per-head quantization -----------------------------------------------------------------------------

// A (B, S, H, d) tensor scaled per (batch, head) and rounded to e4m3.
struct Fp8Tensor {
  HostTensor q;                // (B, S, H, d): round_to_e4m3(float(x) * scale), each in [-448, 448]
  std::vector<float> descale;  // (B, H), row-major: 1 / scale, the factor that maps q back to x
  float descale_at(int b, int h) const { return descale[static_cast<std::size_t>(b) * q.dims[2] + h]; }
};

// Per (b, h): amax = max |x| over the (S, d) slice, scale = 448 / amax in float (1 when amax is 0; 2^126 when
// 448 / amax would overflow float, amax < about 1.3e-36), q = round_to_e4m3(float(x) * scale), descale =
// 1 / scale in float. Elements are taken to float first, as a kernel reads them. Throws InputError, naming
// `name`, unless x is 4-d and every element is finite in float.
Fp8Tensor quantize_e4m3_per_head(const HostTensor& x, const char* name);
// q * descale per (b, h), in double (exact: a 4-bit significand times a 24-bit one).
HostTensor dequantize(const Fp8Tensor&);
// The e4m3 bytes of q, in q's layout: what a kernel's buffer holds.
std::vector<std::uint8_t> e4m3_bytes(const Fp8Tensor&);
// The inputs of an FP8 kernel (core/fp8.hpp E4m3Qkv) from values: Q quantized per (b, query head), K and V per
// (b, kv head), as fp8_attention_emulated quantizes them (without rotation), so that the kernel and the emulation
// compute on the same operands. Throws InputError as quantize_e4m3_per_head does.
E4m3Qkv quantize_e4m3_qkv(const Qkv&);

// ---- Incoherent processing: x -> H D x / sqrt(d) along the head dim ------------------------------------

// The unnormalized fast Walsh-Hadamard transform in place: x <- H_n x, H_n the Sylvester Hadamard matrix
// (H_1 = [1], H_2n = [[H_n, H_n], [H_n, -H_n]]), n = x.size() a power of two. n log2 n additions.
void fast_walsh_hadamard(std::vector<double>& x);

// Throws InputError unless d is 64, 128 or 256 (the head dims the rotation is offered for).
void check_rotation_head_dim(int d);
// The diagonal of D: d signs +-1 drawn from Philox4x32-10 (core/philox.hpp) under `seed`, sign i from bit 0
// of word i % 4 of the counter (i / 4, 0, 0, 0x48414441 "HADA"): the last word keeps these draws apart from
// dropout's, whose counter ends in the batch index. Deterministic in seed.
std::vector<double> rotation_signs(int d, std::uint64_t seed);
// x -> H D x / sqrt(d) for every (b, s, h) row of a (B, S, H, d) tensor, in double. An orthogonal map: applied
// to Q and K with the same seed it leaves every Q K^T unchanged.
HostTensor hadamard_rotate(const HostTensor& x, std::uint64_t seed);
// Its transpose (and inverse): y -> D H y / sqrt(d).
HostTensor hadamard_rotate_transpose(const HostTensor& y, std::uint64_t seed);

// ---- The emulated forward ------------------------------------------------------------------------------

struct LowpAttentionOptions {
  bool rotate_qk = false;           // apply hadamard_rotate to Q and K first (needs d = 64, 128 or 256)
  std::uint64_t rotation_seed = 0;  // the seed of D
  // 0: the softmax of each row at once, P against the row's max. Bc > 0: the online softmax in the order a tiled
  // kernel takes it, Bc keys at a time: P against the running max of the blocks seen so far (never lagging, so
  // P <= 1 still), rounded there, and O and l rescaled in fp32 whenever the max rises. cuda-fa3-ws's FP8 forward
  // runs e4m3_kernel_block_keys(d) (core/fp8.hpp).
  int block_keys = 0;
};

struct EmulatedForward {
  ForwardOut out;   // O rounded to bf16; LSE in fp32 (natural log; -inf for a row that sees no key)
  Qkv dequantized;  // the inputs the low-precision operands stand for, in double (rotated when asked)
};

// The FP8 forward: Q quantized per (b, query head), K and V per (b, kv head) (quantize_e4m3_per_head);
// S = (q_Q q_K^T) * descale_Q * descale_K * softmax_scale, accumulated in fp32; causal mask (top-left or
// bottom-right, core/mask.hpp); softmax in fp32; P * 448 rounded to e4m3; O = P V accumulated in fp32, times
// descale_V / 448, divided by the fp32 row sum of P, rounded to bf16. seq_q != seq_k and GQA (heads_q a
// multiple of heads_kv) are supported. Throws InputError for bad shapes, non-finite inputs, dropout (not
// offered here) or a head dim the rotation does not take.
EmulatedForward fp8_attention_emulated(const Problem&, const Qkv&, const LowpAttentionOptions& = {});
// The options under which the emulation rounds P where and as cuda-fa3-ws's FP8 forward does at head dim d: its
// online softmax, e4m3_kernel_block_keys(d) keys at a time (no rotation: the kernel takes its operands rotated or not,
// as given).
inline LowpAttentionOptions fp8_kernel_order(int head_dim) {
  LowpAttentionOptions o;
  o.block_keys = e4m3_kernel_block_keys(head_dim);
  return o;
}
// The bf16 forward the same way, for comparison: Q, K, V rounded to bf16 (no scaling), S in fp32, P rounded
// to bf16, O = P V accumulated in fp32, divided by the row sum, rounded to bf16.
EmulatedForward bf16_attention_emulated(const Problem&, const Qkv&, const LowpAttentionOptions& = {});

// ---- Errors and the rule -------------------------------------------------------------------------------

struct ErrorMetrics {
  double max_abs = 0;  // max |out - ref|
  double rmse = 0;     // sqrt(mean (out - ref)^2)
};
// Over every element. Equal infinities (the LSE of a row that sees no key) count as no error; a NaN on either
// side makes both metrics NaN; unequal infinities make them +inf. Throws InputError when the dims differ.
ErrorMetrics error_metrics(const HostTensor& out, const HostTensor& ref);

// The worst-case distance the FP8 emulation may have from naive attention in double on `dequantized`
// (derived in fp8.cpp): max |dO| <= o_max_abs and max |dLSE| <= lse_max_abs. For standard-normal inputs
// o_max_abs is 0.07 to 0.09 max|V|: 2^-4 from rounding P to e4m3, 2^-8 from rounding O to bf16, the rest from
// P's subnormals and the worst case of the fp32 sums. A worst case, reached only when every entry of P rounds the
// same way: the errors measured on random inputs are about 10x smaller (tests/test_fp8.cpp).
struct Fp8Bounds {
  double o_max_abs = 0;
  double lse_max_abs = 0;
};
Fp8Bounds fp8_emulation_bounds(const Problem&, const Qkv& dequantized, const HostTensor& ref_lse);

struct Fp8Check {
  ForwardOut reference;  // naive attention in double on the dequantized inputs
  ErrorMetrics o, lse;   // the emulation's errors against it
  Fp8Bounds bounds;
  bool passes() const { return o.max_abs <= bounds.o_max_abs && lse.max_abs <= bounds.lse_max_abs; }
};
// The rule applied to an output of fp8_attention_emulated.
Fp8Check check_fp8_emulation(const Problem&, const EmulatedForward&);

// ---- The rule for a kernel ------------------------------------------------------------------------------
// A GPU kernel computing the FP8 forward (e4m3 operands with fp32 accumulation, P rounded to e4m3, O to bf16) is
// held to the emulation of the same computation on the same operands, both measured against the reference of
// check_fp8_emulation (naive attention in double on the dequantized inputs), as FlashAttention holds a kernel to
// a baseline of the same precision:
//    max |O_kernel - O_ref|     <= kFp8KernelFactor * max |O_emulated - O_ref|
//    max |LSE_kernel - LSE_ref| <= kFp8KernelFactor * max |LSE_emulated - LSE_ref| + kFp8LseSlack (1 + max |LSE_ref|)
// (max |LSE_ref| over the finite entries; equal infinities, the LSE of a row that sees no key, count as no error;
// a NaN anywhere fails).
inline constexpr double kFp8KernelFactor = 2;  // FlashAttention's rule: within 2x a same-precision baseline
// The emulation's LSE error is that of fp32 arithmetic, about 1e-7 |LSE|, and doubling it leaves no room for the
// kernel's S: the FP8 tensor cores accumulate S with fewer bits than fp32. What cuda-fa3-ws's FP8 forward measured
// against it is in bench/results/h200-fa3-ws-e4m3-notes.md.
inline constexpr double kFp8LseSlack = 1.0 / 512;  // 2^-9, relative to 1 + max |LSE_ref|

struct Fp8KernelCheck {
  Fp8Check emulation;  // the reference, the emulation's errors against it, and its worst-case bounds
  ErrorMetrics o, lse;  // the kernel's errors against emulation.reference
  double o_limit = 0, lse_limit = 0;  // the rule's right-hand sides
  bool o_passes() const { return o.max_abs <= o_limit; }  // false for NaN
  bool lse_passes() const { return lse.max_abs <= lse_limit; }
  bool passes() const { return o_passes() && lse_passes(); }
};
// `emulated`: fp8_attention_emulated(p, inputs, fp8_kernel_order(d)), on the values the kernel's operands were
// quantized from (quantize_e4m3_qkv); `kernel`: the kernel's O (bf16 values) and LSE. Throws InputError when an
// output's dims are not the problem's.
Fp8KernelCheck check_fp8_kernel(const Problem&, const EmulatedForward& emulated, const ForwardOut& kernel);

}  // namespace flashlab
