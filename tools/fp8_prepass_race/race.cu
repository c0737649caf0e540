// Times the FP8 pre-pass (src/cuda/fp8_quantize.cu: per-head amax, then e4m3, optionally through the Hadamard
// rotation) from bf16 activations, with and without the rotation, at d = 64, 128 and 256: B N = 16k tokens,
// H d = 2048, N = 4096, the shapes of scripts/bench_fp8_prepass.sh. race.sh builds it once per choice of
// kRotateValuesPerLane (the values of a rotated row each lane holds), so the choices can be raced in one run. Each
// prints a hash of the rotated pass's output bytes (e4m3 Q and K, their descales): every choice must produce the same
// bytes (the rotation is exact to the CPU quantizer's), and race.sh fails when two differ.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/fp8_quantize.hpp"

namespace {
// FNV-1a over the bytes of a device buffer, folded into `hash`.
template <class T>
void hash_device(const T* data, std::size_t n, std::uint64_t& hash) {
  std::vector<unsigned char> bytes(n * sizeof(T));
  CUDA_CHECK(cudaMemcpy(bytes.data(), data, bytes.size(), cudaMemcpyDeviceToHost));
  for (const unsigned char b : bytes) hash = (hash ^ b) * 0x100000001b3ull;
}
}  // namespace

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
    std::uint64_t hash = 0xcbf29ce484222325ull;  // the rotated run's bytes, left in q8, k8 and the descales
    hash_device(q8.data(), n, hash);
    hash_device(k8.data(), n, hash);
    hash_device(qd.data(), heads, hash);
    hash_device(kd.data(), heads, hash);
    std::printf("bytes d=%d rotated: %016llx\n", d, static_cast<unsigned long long>(hash));
  }
  return 0;
}
