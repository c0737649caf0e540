// The GPU's per-head e4m3 quantization (cuda/fp8_quantize.hpp), the FP8 forward's pre-pass, against the CPU's
// (cpu_reference/fp8.hpp: quantize_e4m3_per_head, hadamard_rotate):
//  * without rotation the two do the same fp32 operations, so every byte and every descale must be bit-identical
//    (f32, f16, bf16 inputs; d = 64, 128, 192, 256; S = 1, 37, 1000; B = 2, H = 3);
//  * with rotation the GPU rotates in fp32 and the CPU in double, so each rotated value may differ by at most a
//    bound derived below. The test holds every descale and every byte to what that bound allows, each differing
//    byte to one e4m3 step, and the fraction of differing bytes to 1e-4 (derived below too);
//  * Gaussian inputs, and inputs with a few outlier channels 10 to 100 times larger (the case the rotation is for);
//  * the sign bits the GPU draws are rotation_signs' exactly; the Q, K, V pre-pass (GQA, S_q != S_k) gives the
//    per-tensor results; and bad input is one InputError sentence: a non-finite element (named, with its place), a
//    rotation overflowing fp32, a head dim or dtype not taken, a host pointer.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.hpp"
#include "core/half.hpp"
#include "cpu_reference/fp8.hpp"
#include "cuda/fp8_quantize.hpp"
#include "gpu/fresh_inputs.hpp"

namespace {

using namespace flashlab;

void require_cuda(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

// A device allocation for the length of a test.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(std::size_t n) { require_cuda(cudaMalloc(&p, std::max<std::size_t>(n, 1))); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

int bytes_of(DType t) { return t == DType::F32 ? 4 : 2; }

// Standard-normal (B, S, H, d), rounded to dtype. With outliers, a few channels per head (the same in every row, as
// real activations' outlier features are) are multiplied by 10 to 100.
HostTensor make_input(int B, int S, int H, int d, DType dtype, bool outliers, std::mt19937_64& rng) {
  HostTensor x({B, S, H, d});
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double& v : x.data) v = normal(rng);
  if (outliers) {
    std::uniform_int_distribution<int> channel(0, d - 1);
    std::uniform_real_distribution<double> factor(10.0, 100.0);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int n = 0; n < 3; ++n) {
          const int c = channel(rng);
          const double f = factor(rng);
          for (int s = 0; s < S; ++s) x.at(b, s, h, c) *= f;
        }
  }
  round_to(x, dtype);
  return x;
}

// The tensor's bytes as the GPU reads them.
std::vector<unsigned char> encode(const HostTensor& x, DType dtype) {
  std::vector<unsigned char> out(x.data.size() * static_cast<std::size_t>(bytes_of(dtype)));
  for (std::size_t n = 0; n < x.data.size(); ++n) {
    const float f = static_cast<float>(x.data[n]);
    if (dtype == DType::F32) {
      std::memcpy(&out[4 * n], &f, 4);
    } else {
      const std::uint16_t h = dtype == DType::BF16 ? float_to_bf16_bits(f) : float_to_f16_bits(f);
      std::memcpy(&out[2 * n], &h, 2);
    }
  }
  return out;
}

struct GpuQuantized {
  std::vector<std::uint8_t> q;
  std::vector<float> descale;
};

// One call of quantize_e4m3_per_head_on_device on x uploaded as dtype; the outputs poisoned first, so that an
// element nobody writes fails the comparison.
GpuQuantized run_gpu(const HostTensor& x, DType dtype, const cuda::E4m3Rotation& rot, const char* name = "x") {
  const int B = int(x.dims[0]), S = int(x.dims[1]), H = int(x.dims[2]), d = int(x.dims[3]);
  const std::vector<unsigned char> in = encode(x, dtype);
  DeviceBytes dx(in.size()), dq(x.data.size()), dd(std::size_t(B) * H * 4),
      scratch(cuda::e4m3_quantize_scratch_bytes(B, H));
  require_cuda(cudaMemcpy(dx.p, in.data(), in.size(), cudaMemcpyHostToDevice));
  require_cuda(cudaMemset(dq.p, 0xA5, x.data.size()));
  require_cuda(cudaMemset(dd.p, 0xff, std::size_t(B) * H * 4));  // NaN
  require_cuda(cudaMemset(scratch.p, 0x5a, cuda::e4m3_quantize_scratch_bytes(B, H)));  // the call clears it itself
  cudaStream_t stream = nullptr;
  require_cuda(cudaStreamCreate(&stream));
  const cuda::E4m3QuantizeIo io{dx.p, dtype, B, S, H, d, static_cast<std::uint8_t*>(dq.p), static_cast<float*>(dd.p)};
  try {
    cuda::quantize_e4m3_per_head_on_device(io, rot, name, scratch.p, stream);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  require_cuda(cudaStreamDestroy(stream));
  GpuQuantized r{std::vector<std::uint8_t>(x.data.size()), std::vector<float>(std::size_t(B) * H)};
  require_cuda(cudaMemcpy(r.q.data(), dq.p, r.q.size(), cudaMemcpyDeviceToHost));
  require_cuda(cudaMemcpy(r.descale.data(), dd.p, r.descale.size() * 4, cudaMemcpyDeviceToHost));
  return r;
}

std::uint32_t bits(float f) { return float_to_bits(f); }

// An e4m3 byte's place on the number line, counted in steps from zero (+0 and -0 both 0).
int ordinal(std::uint8_t b) { return (b & 0x80) ? -int(b & 0x7f) : int(b & 0x7f); }

// float(v) rounded towards -inf / +inf (the double interval's ends, kept outside it).
float float_down(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) > v) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}
float float_up(double v) {
  float f = static_cast<float>(v);
  if (static_cast<double>(f) < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  return f;
}

// ---- The rotation's error bound --------------------------------------------------------------------------------
// u = 2^-24, m = log2(d), and for one row x (already float, exact) let N = ||x||_1 / sqrt(d).
//  * GPU: each output of the m butterfly stages is a sum of the d terms +-x_i along a tree of depth m, every node
//    rounded, so |s - (H D x)_k| <= gamma_m ||x||_1 with gamma_m = m u / (1 - m u), and |s| <= (1 + gamma_m) ||x||_1.
//    Then y = fl(s * fl(1/sqrt(d))): two more relative errors of at most u each (none at d = 64, 256). So
//    |y_gpu - t| <= (gamma_m + (1 + gamma_m)(2u + u^2)) N, t = (H D x)_k / sqrt(d) exactly.
//  * CPU: the same tree in double (error below 2^-49 N), then one rounding to float: |y_cpu - t| <= (u + 2^-48) N.
//  * Together |y_gpu - y_cpu| <= e_row = (m + 4) u N: gamma_m + 3u is m u + 3u plus terms of order m^2 u^2, which
//    the remaining u N covers many times over for m <= 8.
// What follows from it, for a (b, h) slice with E = the largest e_row and a_cpu = the CPU's amax:
//  * amax: |a_gpu - a_cpu| <= E (a max moves by at most the largest move of its elements);
//  * descale = fl(1 / fl(448 / a)) = (a / 448)(1 + d1)/(1 + d2) with |d1|, |d2| <= u on each side, so
//    descale_gpu / descale_cpu lies within [(1 - E / a_cpu)(1 - u)^2 / (1 + u)^2, (1 + E / a_cpu)(1 + u)^2 / (1 - u)^2];
//  * each byte: scale_gpu = (1 + d) / descale_gpu with |d| <= u, and z_gpu = fl(y_gpu scale_gpu) with y_gpu within
//    e_row of y_cpu, so z_gpu lies in an interval the test computes; e4m3 rounding is monotone, so the GPU's byte must
//    lie between the roundings of the interval's ends.
// The fraction of bytes that differ. A byte differs only where a rounding boundary of e4m3 falls between z_cpu and
// z_gpu. Their distance is typically a few u |z| (the m stages' roundings, each at most u/2 relative to a partial
// sum, add like a random walk, about sqrt(m / 3) u; the norm's product, the CPU's own rounding to float and the
// scale's last bit add about 3u), while e4m3's step at z is at least 2^-4 |z| (3 mantissa bits; more, relatively,
// in the subnormal range). So a byte differs with probability about 6u / 2^-4 ~ 6e-6, and a bound of 1e-4 leaves a
// factor of about 17; an arithmetic that is not the CPU's (a lost sign, a stage on the wrong span) would fail the
// per-byte interval at once and flip far more than 1e-4.
constexpr double kU = 1.0 / 16777216.0;  // 2^-24
constexpr double kMaxDifferingFraction = 1e-4;

struct RotationTally {
  std::int64_t elements = 0, differing = 0;
  double max_descale_rel = 0;  // the largest |descale_gpu / descale_cpu - 1| seen
};

// Checks one rotated run against the CPU as derived above; adds to the tally.
void check_rotated(const HostTensor& x, std::uint64_t seed, const GpuQuantized& gpu, RotationTally& tally) {
  const int B = int(x.dims[0]), S = int(x.dims[1]), H = int(x.dims[2]), d = int(x.dims[3]);
  const int m = int(std::lround(std::log2(double(d))));
  const HostTensor y = hadamard_rotate(x, seed);  // double
  const Fp8Tensor cpu = quantize_e4m3_per_head(y, "x");
  const std::vector<std::uint8_t> cpu_bytes = e4m3_bytes(cpu);
  // e_row per (b, s, h) row.
  std::vector<double> e_row(std::size_t(B) * S * H);
  for (std::size_t r = 0; r < e_row.size(); ++r) {
    double l1 = 0;
    for (int c = 0; c < d; ++c) l1 += std::abs(x.data[r * d + c]);
    e_row[r] = (m + 4) * kU * l1 / std::sqrt(double(d));
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const std::size_t bh = std::size_t(b) * H + h;
      double E = 0, a_cpu = 0;
      for (int s = 0; s < S; ++s) {
        E = std::max(E, e_row[(std::size_t(b) * S + s) * H + h]);
        for (int c = 0; c < d; ++c) a_cpu = std::max(a_cpu, std::abs(double(float(y.at(b, s, h, c)))));
      }
      const double dc = cpu.descale[bh], dg = gpu.descale[bh];
      CAPTURE(b);
      CAPTURE(h);
      REQUIRE(a_cpu > 0);
      const double r = E / a_cpu;
      const double lo = dc * (1 - r) * (1 - kU) * (1 - kU) / ((1 + kU) * (1 + kU));
      const double hi = dc * (1 + r) * (1 + kU) * (1 + kU) / ((1 - kU) * (1 - kU));
      CHECK_MESSAGE((dg >= lo && dg <= hi), "descale " << dg << " outside [" << lo << ", " << hi << "] around the CPU's "
                                                        << dc);
      tally.max_descale_rel = std::max(tally.max_descale_rel, std::abs(dg / dc - 1));
      // Every byte of the slice.
      const double scale_lo = (1 - kU) / dg, scale_hi = (1 + kU) / dg;
      int reported = 0;
      for (int s = 0; s < S; ++s) {
        const double e = e_row[(std::size_t(b) * S + s) * H + h];
        for (int c = 0; c < d; ++c) {
          const std::size_t n = ((std::size_t(b) * S + s) * H + h) * d + c;
          const double yc = double(float(y.data[n]));
          const double y_lo = yc - e, y_hi = yc + e;
          // z = y * scale * (1 + d'), |d'| <= u: the extremes of the product over the boxes.
          const double p[4] = {y_lo * scale_lo, y_lo * scale_hi, y_hi * scale_lo, y_hi * scale_hi};
          const double z_lo = *std::min_element(p, p + 4), z_hi = *std::max_element(p, p + 4);
          const float v_lo = round_to_e4m3(float_down(z_lo < 0 ? z_lo * (1 + kU) : z_lo * (1 - kU)));
          const float v_hi = round_to_e4m3(float_up(z_hi < 0 ? z_hi * (1 - kU) : z_hi * (1 + kU)));
          const std::uint8_t g = gpu.q[n], want = cpu_bytes[n];
          const float vg = e4m3_bits_to_float(g);
          const bool in_interval = vg >= v_lo && vg <= v_hi;
          const bool one_step = std::abs(ordinal(g) - ordinal(want)) <= 1;
          if ((!in_interval || !one_step) && reported++ < 5)
            FAIL_CHECK("element (" << b << ", " << s << ", " << h << ", " << c << "): GPU byte 0x" << std::hex << int(g)
                                   << " (" << vg << "), CPU byte 0x" << int(want) << std::dec << " ("
                                   << e4m3_bits_to_float(want) << "); the fp32 rotation allows [" << v_lo << ", "
                                   << v_hi << "]");
          tally.differing += g != want;
        }
      }
      CHECK(reported == 0);
    }
  tally.elements += std::int64_t(x.data.size());
}

}  // namespace

TEST_CASE("the GPU's rotation signs are rotation_signs' draws, bit for bit") {
  for (const int d : {64, 128, 256})
    for (const std::uint64_t seed : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(0x9e3779b97f4a7c15ull), fresh_seed()}) {
      CAPTURE(d);
      CAPTURE(seed);
      const std::vector<double> want = rotation_signs(d, seed);
      const cuda::E4m3SignBits got = cuda::e4m3_rotation_sign_bits(d, seed);
      int negatives = 0;
      for (int i = 0; i < d; ++i) {
        REQUIRE(got.negative(i) == (want[std::size_t(i)] < 0));
        negatives += got.negative(i);
      }
      CHECK(negatives > 0);  // not a vacuous pass on all-positive signs
      CHECK(negatives < d);
      for (int i = d; i < 256; ++i) CHECK_FALSE(got.negative(i));  // no bits past the head dim
    }
}

TEST_CASE("without rotation every byte and every descale is the CPU's, bit for bit") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (const int d : {64, 128, 192, 256})
      for (const int S : {1, 37, 1000})
        for (const bool outliers : {false, true}) {
          CAPTURE(to_string(dtype));
          CAPTURE(d);
          CAPTURE(S);
          CAPTURE(outliers);
          const HostTensor x = make_input(2, S, 3, d, dtype, outliers, rng);
          const GpuQuantized gpu = run_gpu(x, dtype, cuda::E4m3Rotation{});
          const Fp8Tensor cpu = quantize_e4m3_per_head(x, "x");
          const std::vector<std::uint8_t> want = e4m3_bytes(cpu);
          std::size_t first_diff = want.size();
          for (std::size_t n = 0; n < want.size() && first_diff == want.size(); ++n)
            if (gpu.q[n] != want[n]) first_diff = n;
          CHECK_MESSAGE(first_diff == want.size(), "first differing byte at flat index " << first_diff);
          for (std::size_t bh = 0; bh < cpu.descale.size(); ++bh) CHECK(bits(gpu.descale[bh]) == bits(cpu.descale[bh]));
        }
}

TEST_CASE("with rotation: descales and bytes within what the fp32 rotation allows, differing bytes one step and rare") {
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  RotationTally tally;
  for (const DType dtype : {DType::F32, DType::BF16})
    for (const int d : {64, 128, 256})
      for (const int S : {1, 37, 1000})
        for (const bool outliers : {false, true}) {
          CAPTURE(to_string(dtype));
          CAPTURE(d);
          CAPTURE(S);
          CAPTURE(outliers);
          const std::uint64_t rotation_seed = rng();
          const HostTensor x = make_input(2, S, 3, d, dtype, outliers, rng);
          const GpuQuantized gpu = run_gpu(x, dtype, cuda::E4m3Rotation{true, rotation_seed});
          check_rotated(x, rotation_seed, gpu, tally);
          if (d == 128 && S == 1000 && outliers) {  // deterministic: a second run gives the same bytes and descales
            const GpuQuantized again = run_gpu(x, dtype, cuda::E4m3Rotation{true, rotation_seed});
            CHECK(again.q == gpu.q);
            CHECK(std::memcmp(again.descale.data(), gpu.descale.data(), gpu.descale.size() * 4) == 0);
          }
        }
  const double fraction = double(tally.differing) / double(tally.elements);
  MESSAGE("rotated: " << tally.differing << " of " << tally.elements << " bytes differ from the CPU's (" << fraction
                      << "); largest relative descale difference " << tally.max_descale_rel);
  CHECK(tally.elements > 10000000);
  CHECK(fraction < kMaxDifferingFraction);
}

TEST_CASE("the rotation spreads an outlier channel: the GPU's amax falls as the CPU's does") {
  // Not a bound of the rotation, a sanity check of what it is for: one channel 100x the others. Without rotation
  // amax is about 100 sigma, with it about 100 sigma / sqrt(d) + a few sigma, so the descale must fall.
  std::mt19937_64 rng(fresh_seed());
  HostTensor x = make_input(1, 256, 1, 128, DType::F32, false, rng);
  for (int s = 0; s < 256; ++s) x.at(0, s, 0, 7) = static_cast<float>(100.0 * x.at(0, s, 0, 7) + 100.0);
  const GpuQuantized plain = run_gpu(x, DType::F32, cuda::E4m3Rotation{});
  const GpuQuantized rotated = run_gpu(x, DType::F32, cuda::E4m3Rotation{true, 7});
  CHECK(rotated.descale[0] < plain.descale[0] / 4);
}

TEST_CASE("the Q, K, V pre-pass: Q and K rotated with one seed, V not, GQA and S_q != S_k") {
  Shape s;
  s.batch = 2;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.seq_q = 300;
  s.seq_k = 517;
  s.head_dim = 128;
  const std::uint64_t seed = fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const HostTensor q = make_input(s.batch, s.seq_q, s.heads_q, s.head_dim, DType::BF16, true, rng);
  const HostTensor k = make_input(s.batch, s.seq_k, s.heads_kv, s.head_dim, DType::BF16, true, rng);
  const HostTensor v = make_input(s.batch, s.seq_k, s.heads_kv, s.head_dim, DType::BF16, true, rng);
  const std::uint64_t rotation_seed = rng();
  const cuda::E4m3Rotation rot{true, rotation_seed};
  const auto upload = [](const HostTensor& t, DeviceBytes& buf) {
    const std::vector<unsigned char> bytes = encode(t, DType::BF16);
    require_cuda(cudaMemcpy(buf.p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  };
  DeviceBytes dq(q.data.size() * 2), dk(k.data.size() * 2), dv(v.data.size() * 2);
  upload(q, dq);
  upload(k, dk);
  upload(v, dv);
  DeviceBytes q8(q.data.size()), k8(k.data.size()), v8(v.data.size());
  DeviceBytes qd(std::size_t(s.batch) * s.heads_q * 4), kd(std::size_t(s.batch) * s.heads_kv * 4),
      vd(std::size_t(s.batch) * s.heads_kv * 4);
  DeviceBytes scratch(cuda::e4m3_qkv_prepass_scratch_bytes(s));
  cuda::E4m3QkvPrepassIo io;
  io.shape = s;
  io.dtype = DType::BF16;
  io.q = dq.p;
  io.k = dk.p;
  io.v = dv.p;
  io.q8 = static_cast<std::uint8_t*>(q8.p);
  io.k8 = static_cast<std::uint8_t*>(k8.p);
  io.v8 = static_cast<std::uint8_t*>(v8.p);
  io.q_descale = static_cast<float*>(qd.p);
  io.k_descale = static_cast<float*>(kd.p);
  io.v_descale = static_cast<float*>(vd.p);
  cuda::e4m3_qkv_prepass_on_device(io, rot, scratch.p, nullptr);
  require_cuda(cudaDeviceSynchronize());
  const auto fetch = [](const DeviceBytes& buf, std::size_t n) {
    std::vector<std::uint8_t> out(n);
    require_cuda(cudaMemcpy(out.data(), buf.p, n, cudaMemcpyDeviceToHost));
    return out;
  };
  const auto fetch_f = [](const DeviceBytes& buf, std::size_t n) {
    std::vector<float> out(n);
    require_cuda(cudaMemcpy(out.data(), buf.p, n * 4, cudaMemcpyDeviceToHost));
    return out;
  };
  // Each tensor as the per-tensor call makes it (the same kernels: bit-identical), and V as the CPU does.
  const GpuQuantized want_q = run_gpu(q, DType::BF16, rot), want_k = run_gpu(k, DType::BF16, rot);
  CHECK(fetch(q8, q.data.size()) == want_q.q);
  CHECK(fetch(k8, k.data.size()) == want_k.q);
  CHECK(fetch_f(qd, want_q.descale.size()) == want_q.descale);
  CHECK(fetch_f(kd, want_k.descale.size()) == want_k.descale);
  const Fp8Tensor cpu_v = quantize_e4m3_per_head(v, "V");
  CHECK(fetch(v8, v.data.size()) == e4m3_bytes(cpu_v));
  CHECK(fetch_f(vd, cpu_v.descale.size()) == cpu_v.descale);
  // K rotated as the CPU rotates it, within the bound.
  RotationTally tally;
  check_rotated(k, rotation_seed, want_k, tally);
  // The benchmark hook runs and takes time; a NaN in V is named V.
  CHECK(cuda::time_e4m3_qkv_prepass_ms(io, rot, 1, 3) > 0);
  const std::uint16_t nan_bits = 0x7fc0;
  require_cuda(cudaMemcpy(static_cast<unsigned char*>(dv.p) + 2 * 1000, &nan_bits, 2, cudaMemcpyHostToDevice));
  // flat index 1000 of (2, 517, 2, 128): d = 1000 % 128 = 104, h = 7 % 2 = 1, s = 3, b = 0
  CHECK_THROWS_WITH_AS(cuda::e4m3_qkv_prepass_on_device(io, rot, scratch.p, nullptr),
                       "fp8 quantization needs finite inputs, but V at (b, s, h, d) = (0, 3, 1, 104) is nan (not finite "
                       "in float)",
                       InputError);
}

TEST_CASE("non-finite input: one InputError naming the tensor and its first non-finite element") {
  std::mt19937_64 rng(fresh_seed());
  for (const bool rotate : {false, true})
    for (const DType dtype : {DType::F32, DType::BF16}) {
      CAPTURE(rotate);
      CAPTURE(to_string(dtype));
      HostTensor x = make_input(2, 50, 3, 64, dtype, false, rng);
      x.at(1, 20, 2, 5) = std::numeric_limits<double>::infinity();
      x.at(1, 40, 0, 9) = std::nan("");  // later in row-major order: not the one named
      CHECK_THROWS_WITH_AS(run_gpu(x, dtype, cuda::E4m3Rotation{rotate, 3}, "Q"),
                           "fp8 quantization needs finite inputs, but Q at (b, s, h, d) = (1, 20, 2, 5) is inf (not "
                           "finite in float)",
                           InputError);
      // The CPU refuses the same tensor (its sentence names the same element).
      CHECK_THROWS_AS(quantize_e4m3_per_head(x, "Q"), InputError);
    }
  // Finite inputs whose fp32 rotation overflows: a row of +-3e38 with signs D cancels in no order.
  HostTensor x = make_input(1, 4, 1, 64, DType::F32, false, rng);
  const std::vector<double> signs = rotation_signs(64, 11);
  for (int c = 0; c < 64; ++c) x.at(0, 2, 0, c) = 3e38 * signs[std::size_t(c)];  // D x = 3e38 everywhere
  CHECK_THROWS_WITH_AS(run_gpu(x, DType::F32, cuda::E4m3Rotation{true, 11}, "K"),
                       "fp8 quantization needs finite inputs, but the fp32 Hadamard rotation of K's row at (b, s, h) = "
                       "(0, 2, 0) overflows float: its elements are finite but too large to rotate",
                       InputError);
}

TEST_CASE("what the GPU quantization does not take is one sentence each") {
  DeviceBytes buf(1 << 20), scratch(4096);
  const auto io = [&](DType dtype, int d) {
    return cuda::E4m3QuantizeIo{buf.p, dtype, 1, 8, 2, d, static_cast<std::uint8_t*>(buf.p),
                                static_cast<float*>(buf.p)};
  };
  CHECK_THROWS_WITH_AS(cuda::quantize_e4m3_per_head_on_device(io(DType::BF16, 192), {true, 1}, "Q", scratch.p, nullptr),
                       "the Hadamard rotation takes head_dim 64, 128 or 256, not 192", InputError);
  CHECK_THROWS_WITH_AS(cuda::quantize_e4m3_per_head_on_device(io(DType::BF16, 96), {}, "Q", scratch.p, nullptr),
                       "fp8 quantization on the GPU takes head_dim 64, 128, 192 or 256, not 96", InputError);
  CHECK_THROWS_WITH_AS(cuda::e4m3_rotation_sign_bits(32, 1), "the Hadamard rotation takes head_dim 64, 128 or 256, not 32",
                       InputError);
  CHECK_THROWS_WITH_AS(cuda::quantize_e4m3_per_head_on_device(io(DType::F64, 64), {}, "Q", scratch.p, nullptr),
                       "fp8 quantization on the GPU reads f32, f16 or bf16 tensors, but Q is f64", InputError);
  std::vector<float> host(1024);
  cuda::E4m3QuantizeIo on_host = io(DType::F32, 64);
  on_host.x = host.data();
  CHECK_THROWS_WITH_AS(cuda::quantize_e4m3_per_head_on_device(on_host, {}, "Q", scratch.p, nullptr),
                       "fp8 quantization on the GPU needs Q's input in device memory, but it points to host memory",
                       InputError);
  cuda::E4m3QuantizeIo misaligned = io(DType::F32, 64);
  misaligned.x = static_cast<unsigned char*>(buf.p) + 4;
  CHECK_THROWS_AS(cuda::quantize_e4m3_per_head_on_device(misaligned, {}, "Q", scratch.p, nullptr), InputError);
  // S = 0 is no error: nothing to read, and each descale is 1 (the CPU's for an all-zero slice).
  cuda::E4m3QuantizeIo empty = io(DType::BF16, 64);
  empty.seq = 0;
  empty.x = nullptr;
  empty.q = nullptr;
  require_cuda(cudaMemset(buf.p, 0xff, 8));
  cuda::quantize_e4m3_per_head_on_device(empty, {true, 1}, "Q", scratch.p, nullptr);
  float descale[2] = {0, 0};
  require_cuda(cudaMemcpy(descale, buf.p, 8, cudaMemcpyDeviceToHost));
  CHECK(descale[0] == 1.0f);
  CHECK(descale[1] == 1.0f);
  // The launch left no error behind.
  require_cuda(cudaGetLastError());
}
