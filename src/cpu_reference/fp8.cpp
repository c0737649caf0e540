// FP8 attention emulated on the CPU (see fp8.hpp): per-head e4m3 quantization, the Hadamard rotation of
// incoherent processing, the forward as an FP8 kernel computes it (and the bf16 forward beside it), and the
// rule that holds the emulation to attention in double on its dequantized inputs, and a GPU kernel to the
// emulation (check_fp8_kernel). The matmuls run in float
// with Eigen, so their accumulation is fp32 as on the tensor cores; every rounding a kernel does is done here
// at the same point.
#include "cpu_reference/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/fp8.hpp"
#include "core/half.hpp"
#include "core/philox.hpp"
#include "cpu_reference/attention_math.hpp"
#include "cpu_reference/naive.hpp"

namespace flashlab {

using detail::Col;
using detail::Mat;

namespace {

void require_4d(const HostTensor& x, const char* name) {
  if (x.dims.size() != 4)
    throw InputError(std::string(name) + " must be a 4-d (B, S, H, d) tensor, got dims " + x.dims_string());
}

// The (S, d) slice of head h of batch b, as float.
Mat<float> gather_float(const HostTensor& t, int b, int h) { return detail::gather_head<float>(t, b, h); }

}  // namespace

// ---- Per-head quantization -----------------------------------------------------------------------------

Fp8Tensor quantize_e4m3_per_head(const HostTensor& x, const char* name) {
  require_4d(x, name);
  const auto B = x.dims[0], S = x.dims[1], H = x.dims[2], D = x.dims[3];
  Fp8Tensor out{HostTensor(x.dims), std::vector<float>(static_cast<std::size_t>(B * H), 1.0f)};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      float amax = 0;
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) {
          const float v = static_cast<float>(x.at(b, s, h, d));
          if (!std::isfinite(v))
            throw InputError(std::string("fp8 quantization needs finite inputs, but ") + name + " at (b, s, h, d) = (" +
                             std::to_string(b) + ", " + std::to_string(s) + ", " + std::to_string(h) + ", " +
                             std::to_string(d) + ") is " + std::to_string(x.at(b, s, h, d)) + " (not finite in float)");
          amax = std::max(amax, std::abs(v));
        }
      float scale = 1.0f;
      if (amax > 0) {
        scale = kE4m3Max / amax;
        if (!std::isfinite(scale)) scale = std::ldexp(1.0f, 126);  // amax so small that 448 / amax overflows
      }
      out.descale[static_cast<std::size_t>(b * H + h)] = 1.0f / scale;
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d)
          out.q.at(b, s, h, d) = round_to_e4m3(static_cast<float>(x.at(b, s, h, d)) * scale);
    }
  return out;
}

HostTensor dequantize(const Fp8Tensor& t) {
  HostTensor x(t.q.dims);
  const auto B = x.dims[0], S = x.dims[1], H = x.dims[2], D = x.dims[3];
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const double descale = t.descale_at(static_cast<int>(b), static_cast<int>(h));
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) x.at(b, s, h, d) = t.q.at(b, s, h, d) * descale;
    }
  return x;
}

std::vector<std::uint8_t> e4m3_bytes(const Fp8Tensor& t) {
  std::vector<std::uint8_t> bytes(t.q.data.size());
  for (std::size_t n = 0; n < bytes.size(); ++n) bytes[n] = float_to_e4m3_bits(static_cast<float>(t.q.data[n]));
  return bytes;
}

E4m3Qkv quantize_e4m3_qkv(const Qkv& in) {
  E4m3Qkv out;
  const auto one = [](const HostTensor& x, const char* name, std::vector<std::uint8_t>& bytes,
                      std::vector<float>& descale) {
    Fp8Tensor t = quantize_e4m3_per_head(x, name);
    bytes = e4m3_bytes(t);
    descale = std::move(t.descale);
  };
  one(in.q, "Q", out.q, out.q_descale);  // per (b, query head)
  one(in.k, "K", out.k, out.k_descale);  // per (b, kv head)
  one(in.v, "V", out.v, out.v_descale);
  return out;
}

// ---- Incoherent processing -----------------------------------------------------------------------------

void fast_walsh_hadamard(std::vector<double>& x) {
  const std::size_t n = x.size();
  if (n == 0 || (n & (n - 1)) != 0)
    throw InputError("the fast Walsh-Hadamard transform needs a power-of-two length, got " + std::to_string(n));
  // Butterflies of growing span: after the pass of span `len`, every aligned block of 2 * len entries holds
  // H_{2 len} times its input block, by the Sylvester recursion.
  for (std::size_t len = 1; len < n; len *= 2)
    for (std::size_t i = 0; i < n; i += 2 * len)
      for (std::size_t j = i; j < i + len; ++j) {
        const double a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

void check_rotation_head_dim(int d) {
  if (d != 64 && d != 128 && d != 256)
    throw InputError("the Hadamard rotation takes head_dim 64, 128 or 256, not " + std::to_string(d));
}

std::vector<double> rotation_signs(int d, std::uint64_t seed) {
  check_rotation_head_dim(d);
  std::vector<double> signs(static_cast<std::size_t>(d));
  for (int i = 0; i < d; i += 4) {
    const Philox4 r = philox4x32_10(Philox4{{static_cast<std::uint32_t>(i / 4), 0u, 0u, 0x48414441u}}, seed);
    for (int k = 0; k < 4 && i + k < d; ++k) signs[static_cast<std::size_t>(i + k)] = (r.x[k] & 1u) ? -1.0 : 1.0;
  }
  return signs;
}

namespace {

// Every (b, s, h) row of x through H D / sqrt(d) (transpose = false) or D H / sqrt(d) (transpose = true).
HostTensor rotate_rows(const HostTensor& x, std::uint64_t seed, bool transpose, const char* name) {
  require_4d(x, name);
  const int d = static_cast<int>(x.dims[3]);
  const std::vector<double> signs = rotation_signs(d, seed);
  const double norm = 1.0 / std::sqrt(static_cast<double>(d));
  HostTensor y(x.dims);
  std::vector<double> row(static_cast<std::size_t>(d));
  for (std::size_t base = 0; base < x.data.size(); base += row.size()) {
    for (std::size_t c = 0; c < row.size(); ++c) row[c] = x.data[base + c] * (transpose ? 1.0 : signs[c]);
    fast_walsh_hadamard(row);
    for (std::size_t c = 0; c < row.size(); ++c) y.data[base + c] = row[c] * norm * (transpose ? signs[c] : 1.0);
  }
  return y;
}

}  // namespace

HostTensor hadamard_rotate(const HostTensor& x, std::uint64_t seed) { return rotate_rows(x, seed, false, "x"); }
HostTensor hadamard_rotate_transpose(const HostTensor& y, std::uint64_t seed) { return rotate_rows(y, seed, true, "y"); }

// ---- The emulated forward ------------------------------------------------------------------------------

namespace {

// One operand as the kernel holds it: per-(b, h) values `q` in the low-precision format (held exactly, in
// double) and the factor that maps them back.
struct Operand {
  HostTensor q;
  std::vector<float> descale;  // (B, H)
  float descale_at(int b, int h) const { return descale[static_cast<std::size_t>(b) * q.dims[2] + h]; }
};

enum class Format { E4M3, BF16 };

Operand to_operand(const HostTensor& x, Format format, const char* name) {
  if (format == Format::E4M3) {
    Fp8Tensor t = quantize_e4m3_per_head(x, name);
    return Operand{std::move(t.q), std::move(t.descale)};
  }
  // bf16 needs no scaling: its 8 exponent bits cover any activation.
  Operand o{x, std::vector<float>(static_cast<std::size_t>(x.dims[0] * x.dims[2]), 1.0f)};
  for (double& v : o.q.data) {
    if (!std::isfinite(static_cast<float>(v)))
      throw InputError(std::string(name) + " has an element that is not finite in float (" + std::to_string(v) +
                       "); the bf16 forward needs finite inputs");
    v = round_to_bf16(v);
  }
  return o;
}

HostTensor dequantized(const Operand& o) {
  return dequantize(Fp8Tensor{o.q, o.descale});  // for bf16 the descale is 1: the rounded values themselves
}

// P's fixed scale. After the row max is subtracted every entry of P = exp(S - m) lies in [0, 1], and the entry
// at the max is exactly 1: P's amax is known before P exists, so no reduction pass (and no per-row descale) is
// needed to scale it. Multiplying by 448 puts that 1 on the largest e4m3 value, so entries keep the 3-bit
// relative precision of normal e4m3 down to 2^-6 / 448 (about 3.5e-5) instead of 2^-6 (about 0.016), and only
// entries below 2^-10 / 448 flush to 0. The same holds for the online softmax of a tiled kernel, whose P is
// taken against the running max and so also peaks at 1 (the rescaling of O stays in fp32). bf16's exponent
// range needs no such scale.
constexpr float kPScaleE4m3 = 448.0f;

EmulatedForward emulate(const Problem& p, const Qkv& in, const LowpAttentionOptions& opt, Format format) {
  validate(p);
  check_dims(p.shape, in);
  if (p.options.dropout_p > 0)
    throw InputError("the emulated low-precision forward offers no dropout; set dropout_p to 0");
  const Shape& s = p.shape;
  if (opt.rotate_qk) check_rotation_head_dim(s.head_dim);
  if (opt.block_keys < 0)
    throw InputError("the emulation's block_keys is 0 (the whole row at once) or a block of keys, not " +
                     std::to_string(opt.block_keys));

  const HostTensor q_in = opt.rotate_qk ? rotate_rows(in.q, opt.rotation_seed, false, "Q") : in.q;
  const HostTensor k_in = opt.rotate_qk ? rotate_rows(in.k, opt.rotation_seed, false, "K") : in.k;
  const Operand Qo = to_operand(q_in, format, "Q");  // per (b, query head)
  const Operand Ko = to_operand(k_in, format, "K");  // per (b, kv head)
  const Operand Vo = to_operand(in.v, format, "V");

  EmulatedForward r;
  r.out = ForwardOut{HostTensor(q_dims(s)), HostTensor(lse_dims(s))};
  r.dequantized = Qkv{dequantized(Qo), dequantized(Ko), dequantized(Vo)};

  const float tau = static_cast<float>(p.softmax_scale());
  const float p_scale = format == Format::E4M3 ? kPScaleE4m3 : 1.0f;
  const auto round_p = [format](float x) { return format == Format::E4M3 ? round_to_e4m3(x) : static_cast<float>(round_to_bf16(x)); };
  Mat<float> S, P;  // (S_q, S_k)
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads_q; ++h) {
      const int h_kv = h / s.group();
      const Mat<float> Q = gather_float(Qo.q, b, h);     // (S_q, d): exact e4m3 / bf16 values
      const Mat<float> K = gather_float(Ko.q, b, h_kv);  // (S_k, d)
      const Mat<float> V = gather_float(Vo.q, b, h_kv);  // (S_k, d)
      // S = (q_Q q_K^T) * descale_Q * descale_K * tau. Products of two e4m3 (or bf16) values are exact in
      // fp32; the sums round in fp32, as the tensor cores' fp32 accumulators do.
      S.noalias() = Q * K.transpose();
      S *= Qo.descale_at(b, h) * Ko.descale_at(b, h_kv) * tau;
      if (p.options.causal != CausalAlign::None) detail::apply_causal_mask(S, p, 0, 0);
      // Softmax in fp32: P = exp(S - m), l = the fp32 row sum of P (before P is rounded), P scaled and rounded to
      // the format as the second matmul's operand; acc = P V accumulated in fp32. With block_keys = 0, m is the
      // row's max; otherwise the running max over the blocks of keys so far, the online softmax's, with acc and l
      // rescaled by exp(m_old - m_new) whenever it rises.
      const Eigen::Index n_keys = S.cols();
      const Eigen::Index block = opt.block_keys > 0 ? opt.block_keys : std::max<Eigen::Index>(n_keys, 1);
      Col<float> m = Col<float>::Constant(S.rows(), -std::numeric_limits<float>::infinity());
      Col<float> l = Col<float>::Zero(S.rows());
      Mat<float> acc = Mat<float>::Zero(S.rows(), s.head_dim);  // (S_q, d)
      for (Eigen::Index j0 = 0; j0 < n_keys; j0 += block) {
        const Eigen::Index bc = std::min(block, n_keys - j0);
        const Col<float> block_max = S.middleCols(j0, bc).rowwise().maxCoeff().array();
        for (Eigen::Index i = 0; i < S.rows(); ++i)
          if (block_max(i) > m(i)) {  // the max rises (a row's first visible key included): rescale the past
            const float corr = m(i) == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m(i) - block_max(i));
            acc.row(i) *= corr;
            l(i) *= corr;
            m(i) = block_max(i);
          }
        const Col<float> m_use = detail::finite_or_zero<float>(m);  // a row that has seen only masked keys: P = 0
        P.resize(S.rows(), bc);
        for (Eigen::Index i = 0; i < S.rows(); ++i)
          for (Eigen::Index j = 0; j < bc; ++j) P(i, j) = std::exp(S(i, j0 + j) - m_use(i));
        l += P.rowwise().sum().array();
        for (Eigen::Index i = 0; i < P.rows(); ++i)
          for (Eigen::Index j = 0; j < bc; ++j) P(i, j) = round_p(P(i, j) * p_scale);
        acc.noalias() += P * V.middleRows(j0, bc);
      }
      m = detail::finite_or_zero<float>(m);
      const float v_factor = Vo.descale_at(b, h_kv) / p_scale;
      for (int i = 0; i < s.seq_q; ++i) {
        const std::size_t lse_at = (static_cast<std::size_t>(b) * s.heads_q + h) * s.seq_q + i;
        if (!(l(i) > 0)) {  // the row sees no key: O = 0, LSE = -inf
          r.out.lse.data[lse_at] = -std::numeric_limits<double>::infinity();
          for (int c = 0; c < s.head_dim; ++c) r.out.o.at(b, i, h, c) = 0.0;
          continue;
        }
        const float o_factor = v_factor / l(i);
        for (int c = 0; c < s.head_dim; ++c) r.out.o.at(b, i, h, c) = round_to_bf16(acc(i, c) * o_factor);
        r.out.lse.data[lse_at] = static_cast<double>(m(i) + std::log(l(i)));
      }
    }
  return r;
}

}  // namespace

EmulatedForward fp8_attention_emulated(const Problem& p, const Qkv& in, const LowpAttentionOptions& opt) {
  return emulate(p, in, opt, Format::E4M3);
}

EmulatedForward bf16_attention_emulated(const Problem& p, const Qkv& in, const LowpAttentionOptions& opt) {
  return emulate(p, in, opt, Format::BF16);
}

// ---- Errors and the rule -------------------------------------------------------------------------------

ErrorMetrics error_metrics(const HostTensor& out, const HostTensor& ref) {
  if (out.dims != ref.dims)
    throw InputError("error_metrics compares tensors of the same dims, got " + out.dims_string() + " and " +
                     ref.dims_string());
  ErrorMetrics e;
  double sum2 = 0;
  for (std::size_t n = 0; n < out.data.size(); ++n) {
    const double a = out.data[n], b = ref.data[n];
    if (std::isnan(a) || std::isnan(b)) return ErrorMetrics{NAN, NAN};
    if (a == b) continue;  // equal infinities included
    const double d = std::abs(a - b);  // +inf when the infinities differ
    e.max_abs = std::max(e.max_abs, d);
    sum2 += d * d;
  }
  e.rmse = out.data.empty() ? 0.0 : std::sqrt(sum2 / static_cast<double>(out.data.size()));
  return e;
}

namespace {
double max_abs_finite(const HostTensor& t) {
  double m = 0;
  for (double x : t.data)
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}
}  // namespace

// The bound, worst case over every input of these magnitudes. u = 2^-24 is fp32's unit roundoff, n = S_k,
// gamma_k = k u / (1 - k u) the bound on the relative error of an fp32 sum of k terms in any order, A = tau d
// max|Q| max|K| a bound on |S|. The reference's S, P, l, O are exact (double on the dequantized inputs, whose
// products with the descales are exact).
//  * S: the fp32 dot product and the three products by descale_Q, descale_K, tau: |S32 - S| <= eps_S =
//    (d + 4) u A (gamma_d <= (d + 1) u for d <= 256, plus 3 u).
//  * P32 = exp(S32 - m32): the argument is off by at most delta = 2 eps_S + u (2 A + 2 eps_S) (the row max
//    moves by at most eps_S, and the subtraction rounds); expf adds one ulp (2u relative). So P32 = P (1 + e),
//    |e| <= eta = expm1(delta) (1 + 2u) + 2u, and l32 = l (1 + e_l), |e_l| <= eta_l = (1 + eta)(1 + gamma_n) - 1.
//  * The e4m3 P: the product by 448 rounds (u), then e4m3 rounds, by at most 2^-4 relative at and above 2^-6
//    and by at most 2^-10 below: |P8 - P| <= kappa P + 2^-10 / 448 with kappa = (2^-4 + 2u)(1 + eta) + eta.
//  * O32 = (sum_j P8_j V_j) / l32 times (1 + 4u) for the fp32 sum over j (gamma_n) and the three products and
//    quotient of the epilogue. With l >= 1 (the max entry is 1) and sum_j P_j |V_j| <= l max|V|:
//      |sum P8 V / l32 - sum P V / l| <= max|V| (kappa + sigma + eta_l) / (1 - eta_l), sigma = n 2^-10 / 448,
//    and |O32| <= G max|V| with G = (1 + kappa + sigma) / (1 - eta_l). The fp32 roundings add
//    (gamma_n + 4u) G max|V|, and bf16 adds 2^-8 |O32|; together at most G max|V| (2^-8 + 2 (gamma_n + 4u)).
//  * LSE32 = m32 + log(l32): eps_S from m, -log(1 - eta_l) from l, and the roundings of logf (2u log n) and of
//    the sum (2u |LSE|, with slack).
Fp8Bounds fp8_emulation_bounds(const Problem& p, const Qkv& deq, const HostTensor& ref_lse) {
  validate(p);
  check_dims(p.shape, deq);
  const double u = std::ldexp(1.0, -24);
  const double d = p.shape.head_dim, n = p.shape.seq_k;
  const double A = p.softmax_scale() * d * max_abs_finite(deq.q) * max_abs_finite(deq.k);
  const double max_v = max_abs_finite(deq.v);
  const auto gamma = [u](double k) { return k * u / (1 - k * u); };
  const double eps_s = (d + 4) * u * A;
  const double delta = 2 * eps_s + u * (2 * A + 2 * eps_s);
  const double eta = std::expm1(delta) * (1 + 2 * u) + 2 * u;
  const double eta_l = (1 + eta) * (1 + gamma(n)) - 1;
  const double kappa = (std::ldexp(1.0, -4) + 2 * u) * (1 + eta) + eta;
  const double sigma = n * std::ldexp(1.0, -10) / 448.0;
  const double G = (1 + kappa + sigma) / (1 - eta_l);
  Fp8Bounds b;
  b.o_max_abs = max_v * ((kappa + sigma + eta_l) / (1 - eta_l) + G * (std::ldexp(1.0, -8) + 2 * (gamma(n) + 4 * u)));
  b.lse_max_abs = eps_s - std::log1p(-eta_l) + 2 * u * std::log(n) + 2 * u * (max_abs_finite(ref_lse) + 1);
  return b;
}

Fp8Check check_fp8_emulation(const Problem& p, const EmulatedForward& e) {
  Fp8Check c;
  c.reference = naive_forward<double>(p, e.dequantized);
  c.o = error_metrics(e.out.o, c.reference.o);
  c.lse = error_metrics(e.out.lse, c.reference.lse);
  c.bounds = fp8_emulation_bounds(p, e.dequantized, c.reference.lse);
  return c;
}

Fp8KernelCheck check_fp8_kernel(const Problem& p, const EmulatedForward& emulated, const ForwardOut& kernel) {
  Fp8KernelCheck c;
  c.emulation = check_fp8_emulation(p, emulated);
  const ForwardOut& ref = c.emulation.reference;
  if (kernel.o.dims != ref.o.dims || kernel.lse.dims != ref.lse.dims)
    throw InputError("the FP8 kernel's outputs have dims " + kernel.o.dims_string() + " and " +
                     kernel.lse.dims_string() + " but the problem needs O " + ref.o.dims_string() + " and LSE " +
                     ref.lse.dims_string());
  c.o = error_metrics(kernel.o, ref.o);
  c.lse = error_metrics(kernel.lse, ref.lse);
  c.o_limit = kFp8KernelFactor * c.emulation.o.max_abs;
  c.lse_limit = kFp8KernelFactor * c.emulation.lse.max_abs + kFp8LseSlack * (1 + max_abs_finite(ref.lse));
  return c;
}

}  // namespace flashlab
