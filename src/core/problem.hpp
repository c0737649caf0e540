#pragma once
// The attention problem every variant solves: shapes, options, dtypes, and the one error type for bad
// input. Tensors are row-major in layout (B, S, H, D); the LSE is (B, H_q, S_q).
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace flashlab {

// Thrown for bad input: the message is one sentence saying what is wrong and what is supported.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// heads_q % heads_kv == 0: query head h reads key/value head h / (heads_q / heads_kv) (GQA/MQA).
struct Shape {
  int batch = 1, heads_q = 1, heads_kv = 1, seq_q = 1, seq_k = 1, head_dim = 64;
  int group() const { return heads_q / heads_kv; }
};

// TopLeft: query i sees keys j <= i (PyTorch is_causal).
// BottomRight: query i sees keys j <= i + seq_k - seq_q (FlashAttention >= 2.1), so the last query
// sees every key; when seq_q > seq_k the first seq_q - seq_k queries see none (O = 0, LSE = -inf).
enum class CausalAlign { None, TopLeft, BottomRight };

struct Options {
  CausalAlign causal = CausalAlign::None;
  double scale = 0.0;      // softmax scale; 0 means the default 1/sqrt(head_dim)
  double dropout_p = 0.0;  // probability of dropping an element of P, in [0, 1)
  std::uint64_t seed = 0;  // Philox key for the dropout mask
  // The backward sums dQ's partial sums in a fixed order, so that two runs give bit-identical gradients
  // (variants whose backward adds them with atomics in arrival order need a mode for it; the forward
  // ignores it).
  bool deterministic = false;
};

struct Problem {
  Shape shape;
  Options options;
  double softmax_scale() const;  // options.scale, or 1/sqrt(head_dim)
};

// Options::scale from a caller's optional scale (the Python API's and the PyTorch operators': None is
// 1/sqrt(head_dim)); 0 is refused with InputError, since Options would read it as that default.
double scale_option(std::optional<double> scale);

// E4M3: float8 e4m3 (core/fp8.hpp), the FP8 forward's input format. Unlike the others it is not a precision a
// value is rounded to on its own: each (batch, head) of Q, K, V is scaled to the format's range first and carries
// its descale (cpu_reference/fp8.hpp, quantize_e4m3_per_head); O comes back in bf16 and the LSE in fp32. Only a
// forward takes it (FlashAttention-3 ships no FP8 backward), and only the variants whose row says so.
enum class DType { F64, F32, F16, BF16, E4M3 };

// The loop nest an implementation follows; it names the traffic model (model/traffic.hpp).
// Standard: S and P go through HBM. FA1: K/V block loop outer. FA2: Q block loop outer.
enum class Algorithm { Standard, FA1, FA2 };
const char* to_string(Algorithm);               // "standard", "fa1", "fa2"
Algorithm parse_algorithm(const std::string&);  // throws InputError

const char* to_string(DType);
const char* to_string(CausalAlign);  // "none", "top-left", "bottom-right"
DType parse_dtype(const std::string&);              // "f64|f32|f16|bf16|e4m3" (and float64, fp16, fp8, ...)
CausalAlign parse_causal(const std::string&);       // "none|top-left|bottom-right"
int dtype_bytes(DType);  // bytes of one element: 8, 4, 2, 2, 1 (e4m3: the input bytes, not O's bf16)

// Throws InputError unless every extent is positive, head_dim <= 256, heads_q % heads_kv == 0 and
// 0 <= dropout_p < 1.
void validate(const Problem&);

}  // namespace flashlab
