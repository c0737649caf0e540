// FP8 forward, the pre-pass that lays out V for O += P V. An 8-bit wgmma reads its B operand K-major only, so the
// forward reads V^T (d, keys) rather than V (keys, d); and it packs P straight from S's accumulator, so V^T holds
// its keys in the order that packing implies (fp8_layout.cuh, fp8_v_key). This kernel writes that V^T once per
// call, before the forward; the other way, a transpose in shared memory inside the producer (fp8_transpose_v_smem.cuh,
// launch_forward_e4m3_vt_in_smem; tools/fa3_harness/race.sh races the two), costs no pass over V but shared-memory
// traffic in every block that reads it.
//   V   (B, S_k, H_kv, d)       e4m3, the project's layout
//   V^T (B, H_kv, d, S_k pad)   e4m3, S_k rounded up to 32 (fp8_vt_keys); column k holds key fp8_v_key(k),
//                               zero where that key is past S_k
// One block moves a tile of 64 keys x 64 dims through shared memory: 16-byte coalesced loads of V's rows, 4-byte
// stores of V^T's rows (four logical keys each).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/fp8_layout.cuh"
#include "cuda/fa3_ws/host_checks.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

constexpr int kTileKeys = 64, kTileDims = 64, kThreads = 256;

__global__ void __launch_bounds__(kThreads) transpose_v_e4m3_kernel(const std::uint8_t* v, std::uint8_t* vt,
                                                                     int seq_k, int heads_kv, int head_dim, int vt_keys) {
  __shared__ std::uint8_t tile[kTileKeys][kTileDims + 4];  // (key, dim); +4: rows start on other banks
  const int bh = blockIdx.z, b = bh / heads_kv, h = bh % heads_kv;
  const int key0 = blockIdx.x * kTileKeys, dim0 = blockIdx.y * kTileDims;
  {  // V's rows: thread i loads 16 bytes of key i / 4 (zero past the end of the keys)
    const int r = threadIdx.x / 4, c = 16 * (threadIdx.x % 4), key = key0 + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (key < seq_k) x = *reinterpret_cast<const uint4*>(v + ((std::int64_t(b) * seq_k + key) * heads_kv + h) * head_dim + dim0 + c);
    const std::uint32_t words[4] = {x.x, x.y, x.z, x.w};
    for (int w = 0; w < 4; ++w)
      for (int byte = 0; byte < 4; ++byte) tile[r][c + 4 * w + byte] = std::uint8_t(words[w] >> (8 * byte));
  }
  __syncthreads();
  // V^T's rows: word j of dim row d holds logical keys 4j .. 4j + 3 of the tile; the tile's 64 keys are two whole
  // blocks of 32, so fp8_v_key maps them within the tile.
  for (int i = threadIdx.x; i < kTileDims * (kTileKeys / 4); i += kThreads) {
    const int d = i / (kTileKeys / 4), k = 4 * (i % (kTileKeys / 4));
    if (key0 + k >= vt_keys) continue;
    std::uint32_t word = 0;
    for (int j = 0; j < 4; ++j) word |= std::uint32_t(tile[fp8_v_key(k + j)][d]) << (8 * j);
    *reinterpret_cast<std::uint32_t*>(vt + ((std::int64_t(b) * heads_kv + h) * head_dim + dim0 + d) * vt_keys + key0 + k) = word;
  }
}

}  // namespace

int fp8_vt_keys(int seq_k) { return (seq_k + 31) / 32 * 32; }

void transpose_v_e4m3(const void* v, void* vt, int batch, int seq_k, int heads_kv, int head_dim, cudaStream_t stream) {
  expect(head_dim > 0 && head_dim % kTileDims == 0, "the head dim of an FP8 V is a multiple of 64");
  expect(reinterpret_cast<std::uintptr_t>(v) % 16 == 0 && reinterpret_cast<std::uintptr_t>(vt) % 16 == 0,
         "V and V^T are 16-byte aligned");
  if (batch == 0 || seq_k == 0 || heads_kv == 0) return;
  const int vt_keys = fp8_vt_keys(seq_k);
  const dim3 grid((vt_keys + kTileKeys - 1) / kTileKeys, head_dim / kTileDims, batch * heads_kv);
  transpose_v_e4m3_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const std::uint8_t*>(v),
                                                         static_cast<std::uint8_t*>(vt), seq_k, heads_kv, head_dim, vt_keys);
  check_cuda(cudaGetLastError(), "the FP8 V transpose launch");
}

}  // namespace flashlab::cuda::fa3_ws
