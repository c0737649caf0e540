// cuda-fa3-ws forward, what ships: launch_forward (every ladder step, f16 and bf16, with and without
// dropout; 114 kernels: 2 dtypes x (7 steps x 3 head dims, with and without dropout, steps 2-7 with the
// wide K/V blocks of d = 64 and 128, and steps 5-7 at d = 64 with two consumers on them)), and the TMA descriptors
// every launcher builds. The kernel and its parts
// are in forward_kernel.cuh, which says what changed from cuda-fa2 and why.
#include <cuda.h>

#include <stdexcept>
#include <string>

#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled, fetched once through the runtime (no link against libcuda).
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    constexpr unsigned kDriverApiVersion = 12000;  // the cuTensorMapEncodeTiled ABI since CUDA 12.0
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, kDriverApiVersion, cudaEnableDefault, &status),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (status != cudaDriverEntryPointSuccess || ptr == nullptr)
      throw std::runtime_error("cuda-fa3-ws: the driver has no cuTensorMapEncodeTiled (needs a CUDA 12+ driver)");
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_bshd_tensor_map(const void* base, DType dtype, int batch, int seq, int heads, int head_dim,
                                 int box_rows) {
  expect(dtype == DType::F16 || dtype == DType::BF16, "a tensor map's dtype is f16 or bf16");
  CUtensorMap map{};
  with_element(dtype, [&]<class T>() {
    map = make_bshd_tensor_map(base, ElementTraits<T>::kTensorMapType, ElementTraits<T>::kBytes, batch, seq, heads,
                               head_dim, box_rows);
  });
  return map;
}

// TMA needs a 16-byte aligned base and 16-byte multiple strides: a row of one head is d * bytes (64 to 512 for
// d in {64, 128, 256}), so the S and B strides (H d bytes, S H d bytes) are multiples of 16 too. A box is one panel
// row wide (hopper.cuh, panel_row_bytes): 128 bytes under the 128-byte swizzle, or a whole 64-byte row (e4m3 at
// d = 64) under the 64-byte one, which is what the consumers' descriptors (desc_k_major) read back.
CUtensorMap make_bshd_tensor_map(const void* base, CUtensorMapDataType type, int element_bytes, int batch, int seq,
                                 int heads, int head_dim, int box_rows) {
  expect(element_bytes == 1 || element_bytes == 2, "a tensor map's elements are 1 or 2 bytes");
  const int panel_bytes = panel_row_bytes(head_dim * element_bytes);
  expect(panel_bytes == 128 || panel_bytes == 64, "a row of the head dim is 64 bytes or a whole number of 128-byte panels");
  const int panel_cols = panel_bytes / element_bytes;
  expect(head_dim % panel_cols == 0, "the head dim is a whole number of panels");
  const CUtensorMapSwizzle swizzle = panel_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(seq), static_cast<cuuint64_t>(batch)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(head_dim) * element_bytes;
  const cuuint64_t strides[3] = {row_bytes, row_bytes * heads, row_bytes * heads * seq};  // bytes, dims 1..3
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(panel_cols), 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled()(&map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuda-fa3-ws: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(r)) +
                             " (d=" + std::to_string(head_dim) + ", heads=" + std::to_string(heads) + ", seq=" +
                             std::to_string(seq) + ", batch=" + std::to_string(batch) + ", box rows=" + std::to_string(box_rows) + ")");
  return map;
}

// V^T's rows are vt_keys bytes (a multiple of 32, so of 16 as TMA needs); a box is panel_keys keys (a 128- or
// 64-byte panel row of e4m3, swizzled to its width) by box_rows dims.
CUtensorMap make_vt_tensor_map(const void* vt, int batch, int heads_kv, int head_dim, int vt_keys, int box_rows,
                               int panel_keys) {
  expect(vt_keys % 32 == 0, "V^T's rows are a multiple of 32 keys (fp8_vt_keys)");
  expect(panel_keys == 128 || panel_keys == 64, "V^T's panels are 128 or 64 keys");
  CUtensorMap map{};
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(vt_keys), static_cast<cuuint64_t>(head_dim),
                              static_cast<cuuint64_t>(heads_kv), static_cast<cuuint64_t>(batch)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(vt_keys);
  const cuuint64_t strides[3] = {row_bytes, row_bytes * head_dim, row_bytes * head_dim * heads_kv};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(panel_keys), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled()(&map, ElementTraits<__nv_fp8_e4m3>::kTensorMapType, 4, const_cast<void*>(vt), dims,
                                    strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    panel_keys == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuda-fa3-ws: cuTensorMapEncodeTiled failed for V^T with CUresult " +
                             std::to_string(static_cast<int>(r)) + " (d=" + std::to_string(head_dim) + ", keys=" +
                             std::to_string(vt_keys) + ", box rows=" + std::to_string(box_rows) + ")");
  return map;
}

static_assert(kRowsPerConsumer == kStep1QueryRows && 2 * kRowsPerConsumer == kQueryRows,
              "cuda/constraints.hpp's query rows per block are the kernel's (the registry counts tiles with them)");

void launch_forward(DType dtype, const Params& p, cudaStream_t stream, LadderStep step) {
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  dispatch_head_dim<kHeadDims>(p.head_dim, "cuda-fa3-ws forward", [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      with_element(dtype, [&]<class T>() {
        // Dropout keeps the narrow blocks: its keep bits beside a wider S_ij spill (100-160 bytes at steps
        // 4 and 5, ptxas -v), and dropout is checked for correctness, not raced.
        if (p.dropout) launch_config<T, D, kStep, true, false, RungSchedule<kStep, ShippedSchedule<false>>>(p, stream);
        else with_shipped_schedule<D, kStep>(p, [&]<class S>() { launch_config<T, D, kStep, false, false, S>(p, stream); });
      });
    });
  });
}

}  // namespace flashlab::cuda::fa3_ws
