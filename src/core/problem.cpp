#include "core/problem.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

namespace flashlab {

double scale_option(std::optional<double> scale) {
  if (scale && *scale == 0.0) throw InputError("scale must not be 0 (None means 1/sqrt(head_dim))");
  return scale.value_or(0.0);
}

double Problem::softmax_scale() const {
  return options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(shape.head_dim));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::F64: return "f64";
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
  }
  return "?";
}

const char* to_string(CausalAlign a) {
  switch (a) {
    case CausalAlign::None: return "none";
    case CausalAlign::TopLeft: return "top-left";
    case CausalAlign::BottomRight: return "bottom-right";
  }
  return "?";
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

DType parse_dtype(const std::string& text) {
  const std::string s = lower(text);
  if (s == "f64" || s == "float64" || s == "double" || s == "fp64") return DType::F64;
  if (s == "f32" || s == "float32" || s == "float" || s == "fp32") return DType::F32;
  if (s == "f16" || s == "float16" || s == "half" || s == "fp16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  // float8_e4m3fn is PyTorch's and ml_dtypes' name ("fn": finite, no infinity), f8e4m3fn MLIR's.
  if (s == "e4m3" || s == "fp8" || s == "f8" || s == "fp8_e4m3" || s == "float8_e4m3" || s == "float8_e4m3fn" ||
      s == "f8e4m3fn")
    return DType::E4M3;
  throw InputError("unknown dtype '" + text + "': supported are f64, f32, f16, bf16 and e4m3 (fp8)");
}

CausalAlign parse_causal(const std::string& text) {
  const std::string s = lower(text);
  if (s == "none" || s == "no" || s == "0") return CausalAlign::None;
  if (s == "top-left" || s == "topleft") return CausalAlign::TopLeft;
  if (s == "bottom-right" || s == "bottomright") return CausalAlign::BottomRight;
  throw InputError("unknown causal alignment '" + text + "': supported are none, top-left and bottom-right");
}

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Standard: return "standard";
    case Algorithm::FA1: return "fa1";
    case Algorithm::FA2: return "fa2";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& text) {
  const std::string s = lower(text);
  if (s == "standard" || s == "naive") return Algorithm::Standard;
  if (s == "fa1") return Algorithm::FA1;
  if (s == "fa2") return Algorithm::FA2;
  throw InputError("unknown algorithm '" + text + "': supported are standard, fa1 and fa2");
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::E4M3: return 1;
  }
  return 0;
}

void validate(const Problem& p) {
  const Shape& s = p.shape;
  auto positive = [](int v, const char* what) {
    if (v < 1) throw InputError(std::string(what) + " must be at least 1, got " + std::to_string(v));
  };
  positive(s.batch, "batch");
  positive(s.heads_q, "heads_q");
  positive(s.heads_kv, "heads_kv");
  positive(s.seq_q, "seq_q");
  positive(s.seq_k, "seq_k");
  positive(s.head_dim, "head_dim");
  if (s.head_dim > 256)
    throw InputError("head_dim " + std::to_string(s.head_dim) + " is not supported: head dims 1..256 are");
  if (s.heads_q % s.heads_kv != 0)
    throw InputError("heads_q (" + std::to_string(s.heads_q) + ") must be a multiple of heads_kv (" +
                     std::to_string(s.heads_kv) + ") for grouped-query attention");
  if (!(p.options.dropout_p >= 0.0 && p.options.dropout_p < 1.0))
    throw InputError("dropout probability must be in [0, 1), got " + std::to_string(p.options.dropout_p));
  if (!std::isfinite(p.options.scale))
    throw InputError("softmax scale must be finite (0 means 1/sqrt(head_dim))");
}

}  // namespace flashlab
