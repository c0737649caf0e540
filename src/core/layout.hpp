#pragma once
// How a caller lays out its 4-d tensors, and the problem's shape read from them. FlashLab computes in
// (B, S, H, D) (core/tensor.hpp): the layout of `flashlab run`'s .npy files. PyTorch's
// scaled_dot_product_attention takes (B, H, S, D); the Python module accepts both.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace flashlab {

enum class Layout { BSHD, BHSD };
inline constexpr std::size_t kInputRank = 4;  // q, k, v, o and dO are 4-d in either layout
const char* to_string(Layout);            // "bshd", "bhsd"
const char* axis_names(Layout);           // "(batch, seq, heads, head_dim)", "(batch, heads, seq, head_dim)"
Layout parse_layout(const std::string&);  // "bshd" | "bhsd"; throws InputError

// Extents (or strides) of a 4-d tensor given in `layout`, reordered to (B, S, H, D), and back.
std::vector<std::int64_t> to_bshd(const std::vector<std::int64_t>& dims, Layout);
std::vector<std::int64_t> from_bshd(const std::vector<std::int64_t>& bshd, Layout);

// "(2, 256, 8, 64)": extents or strides as a sentence shows them.
std::string dims_string(const std::vector<std::int64_t>& dims);

// One input tensor as its caller named it ("q", or "q ('q.npy')") and its dims in the caller's layout.
struct InputDims {
  std::string name;
  std::vector<std::int64_t> dims;
};

// The shape of the problem that q, k, v (and dO, when given) describe, their dims given in `layout`:
// q (B, S_q, H_q, D), k and v (B, S_k, H_kv, D), dO like q. Throws InputError naming the first tensor
// that is not 4-d, has an extent outside 1..2^30 or disagrees with q and k, or when H_q is not a
// multiple of H_kv; each sentence gives shapes in the caller's layout. The options are validate()'s.
Shape shape_of_inputs(Layout, const InputDims& q, const InputDims& k, const InputDims& v,
                      const InputDims* dO = nullptr);

// Throws InputError naming o or lse unless they have the dims a forward of `shape` gives them: o like q,
// in `layout`; lse (B, H_q, S_q) in either layout.
void check_forward_outputs(Layout, const Shape&, const InputDims& o, const InputDims& lse);

}  // namespace flashlab
