// cuda-fa3-ws's FP8 path, the parts that exist so far, against the CPU: the pre-pass that writes V^T for an e4m3
// O += P V (fa3_ws/fp8_transpose_v.cu). Every byte of V^T must be the byte of V that fp8_v_key names, and zero
// where that key is past the end; V is random bytes (any e4m3 pattern moves as it is), V^T starts poisoned.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace {

using namespace flashlab;

// The CPU's V^T: the same rule, written from fp8_layout.cuh's words (within 32 keys, logical k = 16 h + 4 t + j
// holds key 16 h + 8 (j / 2) + 2 t + j % 2).
std::uint8_t expected(const std::vector<std::uint8_t>& v, int b, int h, int d, int k, int seq_k, int heads_kv, int head_dim) {
  const int base = k / 32 * 32, h16 = (k % 32) / 16, t = (k % 16) / 4, j = k % 4;
  const int key = base + 16 * h16 + 8 * (j / 2) + 2 * t + j % 2;
  if (key >= seq_k) return 0;
  return v[((std::size_t(b) * seq_k + key) * heads_kv + h) * head_dim + d];
}

void require_cuda(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

}  // namespace

TEST_CASE("the FP8 V^T: every byte where fp8_v_key puts it, zero past the keys, any length") {
  int dev = 0, major = 0, minor = 0;
  require_cuda(cudaGetDevice(&dev));
  require_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  require_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) {
    // The pre-pass is built for sm_90a alone: elsewhere its launch must fail loudly, not leave V^T unwritten.
    MESSAGE("not a compute capability 9.0 GPU: the sm_90a pre-pass must refuse to launch here");
    void *dv = nullptr, *dvt = nullptr;
    require_cuda(cudaMalloc(&dv, 64));
    require_cuda(cudaMalloc(&dvt, 64 * 32));
    CHECK_THROWS_AS(cuda::fa3_ws::transpose_v_e4m3(dv, dvt, 1, 1, 1, 64, nullptr), std::runtime_error);
    require_cuda(cudaFree(dv));
    require_cuda(cudaFree(dvt));
    return;
  }
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  CAPTURE(seed);
  rng.seed(seed);
  for (const int head_dim : {64, 128, 256})
    for (const int seq_k : {1, 31, 32, 40, 63, 64, 97, 300}) {
      CAPTURE(head_dim);
      CAPTURE(seq_k);
      const int batch = 2, heads_kv = 3, vt_keys = cuda::fa3_ws::fp8_vt_keys(seq_k);
      REQUIRE(vt_keys % 32 == 0);
      REQUIRE(vt_keys >= seq_k);
      REQUIRE(vt_keys < seq_k + 32);
      std::vector<std::uint8_t> v(std::size_t(batch) * seq_k * heads_kv * head_dim);
      for (auto& x : v) x = std::uint8_t(rng());
      const std::size_t vt_bytes = std::size_t(batch) * heads_kv * head_dim * vt_keys;
      void *dv = nullptr, *dvt = nullptr;
      require_cuda(cudaMalloc(&dv, v.size()));
      require_cuda(cudaMalloc(&dvt, vt_bytes));
      require_cuda(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice));
      require_cuda(cudaMemset(dvt, 0xA5, vt_bytes));  // poison: a byte the pre-pass never writes fails below
      cuda::fa3_ws::transpose_v_e4m3(dv, dvt, batch, seq_k, heads_kv, head_dim, nullptr);
      require_cuda(cudaDeviceSynchronize());
      std::vector<std::uint8_t> vt(vt_bytes);
      require_cuda(cudaMemcpy(vt.data(), dvt, vt_bytes, cudaMemcpyDeviceToHost));
      require_cuda(cudaFree(dv));
      require_cuda(cudaFree(dvt));
      int wrong = 0;
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads_kv; ++h)
          for (int d = 0; d < head_dim; ++d)
            for (int k = 0; k < vt_keys; ++k) {
              const std::uint8_t got = vt[((std::size_t(b) * heads_kv + h) * head_dim + d) * vt_keys + k];
              const std::uint8_t want = expected(v, b, h, d, k, seq_k, heads_kv, head_dim);
              if (got != want && wrong++ < 3) {
                CAPTURE(b);
                CAPTURE(h);
                CAPTURE(d);
                CAPTURE(k);
                CHECK(int(got) == int(want));
              }
            }
      CHECK(wrong == 0);
    }
}
