// Times the FP8 pre-pass (src/cuda/fp8_quantize.cu: per-head amax, then e4m3, optionally through the Hadamard
// rotation) from bf16 activations, with and without the rotation, at d = 64, 128 and 256: B N = 16k tokens,
// H d = 2048, N = 4096, the shapes of scripts/bench_fp8_prepass.sh. race.sh builds it once per choice of
// kRotateValuesPerLane (the values of a rotated row each lane holds), so the choices can be raced in one run.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/fp8_quantize.hpp"

int main() {
  using namespace flashlab;
  constexpr int kTokens = 16384, kHidden = 2048, kSeq = 4096;
  for (int d : {64, 128, 256}) {
    Shape s{};
    s.batch = kTokens / kSeq, s.seq_q = s.seq_k = kSeq, s.heads_q = s.heads_kv = kHidden / d, s.head_dim = d;
    const std::size_t n = std::size_t(kTokens) * kHidden;
    cuda::DeviceBuffer<__nv_bfloat16> q(n), k(n), v(n);
    cuda::fill_random(q, 1);
    cuda::fill_random(k, 2);
    cuda::fill_random(v, 3);
    cuda::DeviceBuffer<std::uint8_t> q8(n), k8(n), v8(n);
    const std::size_t heads = std::size_t(s.batch) * s.heads_q;
    cuda::DeviceBuffer<float> qd(heads), kd(heads), vd(heads);
    const cuda::E4m3QkvPrepassIo io{.shape = s, .dtype = DType::BF16, .q = q.data(), .k = k.data(), .v = v.data(),
                                    .q8 = q8.data(), .k8 = k8.data(), .v8 = v8.data(), .q_descale = qd.data(),
                                    .k_descale = kd.data(), .v_descale = vd.data()};
    const double plain = cuda::time_e4m3_qkv_prepass_ms(io, cuda::E4m3Rotation{false, 1}, 5, 30);
    const double rotated = cuda::time_e4m3_qkv_prepass_ms(io, cuda::E4m3Rotation{true, 1}, 5, 30);
    std::printf("d=%3d N=%d  pre-pass %.1f us  with the rotation %.1f us  (+%.1f us)\n", d, kSeq, 1e3 * plain,
                1e3 * rotated, 1e3 * (rotated - plain));
  }
  return 0;
}
