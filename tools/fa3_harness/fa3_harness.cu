// Standalone harness for cuda-fa3-ws (src/cuda/fa3_ws): runs on an H100 with nothing but the driver.
//  --probes : unit probes that localise layout bugs: (i) TMA load of a 128B-swizzled tile, read back
//             through swizzle128_offset; (ii) one wgmma S = Q K^T (SS); (iii) one wgmma O = P V (RS,
//             V transposed); (iv), (v) the same two GEMMs in float8 e4m3 (k32, both operands K-major, P's
//             fragment as an FP8 forward packs it); (vi) P packed from an S accumulator with V^T's keys permuted
//             to match (fp8_layout.cuh); (vii) the same with V^T written by the pre-pass and loaded by TMA. Each
//             prints PASS/FAIL and the first mismatch.
// Correctness of the shipped kernel is the project's business, with its one reference and tolerance rule:
// gpu_fa3_ws_tests and `flashlab check --variants cuda-fa3-ws-step1,...,cuda-fa3-ws`. A candidate below
// is promoted by making it the shipped schedule (ShippedSchedule, forward_config.cuh), which puts it under
// those checks.
//  --bench  : TFLOP/s per ladder step, bf16, B N = 16384 tokens, H d = 2048.
//  --hpg 1,2,.. : with --bench, step 5 by heads per L2 group (launch_forward_variant's; 0 = the launcher's).
//             --hpg-var V: candidate V (launch_forward_variant, candidates.cu) instead of the shipped one.
//  --repeat R : with --bench, the step table R times (run-to-run spread).
//  --variants : with --bench, also the candidate schedules (candidates.cu: 0, 1 and 3), steps 2-5.
//  --timeline DIR : per step / d / N (--steps, --dims, --ns; --causal for bottom-right), one run of the
//             timeline build (launch_forward_timeline, the library's: bf16, shipped choices), written as
//             Trace Event JSON to DIR/h100-fa3-ws-timeline-step<S>-d<D>-n<N/1024>k.json, and the cost of
//             recording (median ms of the plain kernel, the timeline build not recording, and recording).
//             --timeline-records N caps the records kept (default 8192: ~4 blocks of steps 2-4 at N = 8k).
//             One run at a time is `flashlab bench --device cuda --variants cuda-fa3-ws-step3 ... --timeline
//             FILE.json`; this sweeps many and adds the "timeline build, no buffer" column.
// Default: --probes. Options: --steps 1,2,.. --dims 64,.. --ns 4096,.. (bench N) --seed N --log FILE. Exit 1 on any FAIL.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/fp8.hpp"
#include "core/half.hpp"
#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/fp8_layout.cuh"
#include "cuda/fa3_ws/hopper.cuh"
#include "model/timeline.hpp"
#include "candidates.hpp"

// The candidate schedules: candidates.hpp. The timeline build, launch_forward_timeline, is declared in
// fa3_ws_params.hpp (src/cuda/fa3_ws/forward_timeline.cu).

using namespace flashlab;
using namespace flashlab::cuda::fa3_ws;

constexpr int kCandidates[] = {0, 1, 3};  // the candidate schedules --variants runs (besides the shipped one)

namespace {

FILE* g_log = nullptr;
// Prints to stdout (unless quiet) and always to the log file.
void out(bool quiet, const char* fmt, ...) {
  va_list a;
  if (!quiet) {
    va_start(a, fmt);
    vprintf(fmt, a);
    va_end(a);
    fflush(stdout);
  }
  if (g_log) {
    va_start(a, fmt);
    vfprintf(g_log, fmt, a);
    va_end(a);
    fflush(g_log);
  }
}
#define SAY(...) out(false, __VA_ARGS__)
#define LOG(...) out(true, __VA_ARGS__)

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    SAY("FATAL: %s: %s (the CUDA context is unusable; stopping)\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// Waits until `done` has happened, for at most kDeadlineSeconds. A pipeline that deadlocks on an mbarrier spins in
// mbar_wait forever; past the deadline the launch is named and the process exits, which ends the kernel with it.
constexpr double kDeadlineSeconds = 10;  // far beyond any launch here (the longest takes milliseconds)
void wait_for(cudaEvent_t done, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) cuda_ok(e, what);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kDeadlineSeconds) {
      SAY("FATAL: %s did not finish within %g s: a pipeline waits on an mbarrier that never completes (stopping)\n",
          what, kDeadlineSeconds);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}
// All work issued so far has finished (within the deadline, as wait_for) and raised no error.
void finish(const char* what) {
  cudaEvent_t done;
  cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_ok(cudaEventRecord(done), "cudaEventRecord");
  wait_for(done, what);
  cuda_ok(cudaEventDestroy(done), "cudaEventDestroy");
  cuda_ok(cudaGetLastError(), what);
}

std::uint16_t to_bits(float f, DType dt) { return dt == DType::BF16 ? float_to_bf16_bits(f) : float_to_f16_bits(f); }
float from_bits(std::uint16_t h, DType dt) { return dt == DType::BF16 ? bf16_bits_to_float(h) : f16_bits_to_float(h); }

// ---- unit probes ---------------------------------------------------------------------------------------

constexpr int kProbeD = 128;   // two 64-column panels: exercises the panel stride too
constexpr int kProbeRows = 64;  // Q rows (wgmma M)
constexpr int kProbeBc = 128;   // K rows (S's N)
constexpr int kProbeKeys = 64;  // P V: keys (K of the GEMM)

// (i) TMA: one box of (rows, D) at (head, row0, batch) into swizzled smem; the raw bytes come back.
__global__ void probe_tma_kernel(const __grid_constant__ CUtensorMap map, std::uint16_t* raw, int rows, int h, int row0, int b) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + swizzle_atom_pad(smem_raw);
  __shared__ std::uint64_t bar;
  const int bytes = rows * kProbeD * 2;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, bytes);
    for (int pnl = 0; pnl < kProbeD / kPanelCols<__nv_bfloat16>; ++pnl)
      tma_load_4d(smem + pnl * rows * kPanelRowBytes, &map, pnl * kPanelCols<__nv_bfloat16>, h, row0, b, &bar);
  }
  mbar_wait(&bar, 0);
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) raw[i] = reinterpret_cast<const std::uint16_t*>(smem)[i];
}

// Stores a 64 x N wgmma accumulator (fp32) row-major into out (64, N).
template <int N>
__device__ void store_acc(const float (&d)[N / 2], float* outp) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int i = 0; i < N / 8; ++i) {
    const int r = 16 * warp + g, col = 8 * i + 2 * t;
    outp[r * N + col] = d[4 * i];
    outp[r * N + col + 1] = d[4 * i + 1];
    outp[(r + 8) * N + col] = d[4 * i + 2];
    outp[(r + 8) * N + col + 1] = d[4 * i + 3];
  }
}

// S (64 x Bc) = Q K^T by the SS form for element type T: Q (64 rows) at qs and K (Bc rows) at ks, both K-major and
// swizzled, `depth` elements deep; S stored row-major into s_out.
template <class T>
__device__ void ss_out(const unsigned char* qs, const unsigned char* ks, int depth, float* s_out) {
  float s[kProbeBc / 2];
  for (int i = 0; i < kProbeBc / 2; ++i) s[i] = 0.f;
  reg_fence(s);
  wgmma_fence();
  for (int kk = 0; kk < depth / ElementTraits<T>::kWgmmaK; ++kk)
    wgmma_ss<T, kProbeBc>(s, desc_k_major(smem_u32(qs), kProbeRows, kk), desc_k_major(smem_u32(ks), kProbeBc, kk), kk > 0);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  reg_fence(s);
  store_acc<kProbeBc>(s, s_out);
}

// (ii) S = Q K^T: Q (64, D) and K (Bc, D) by TMA, the same descriptors as the main kernel's issue_s.
template <class T>
__global__ void probe_ss_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap, float* s_out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + swizzle_atom_pad(smem_raw);
  unsigned char* qs = smem;
  unsigned char* ks = smem + kProbeRows * kProbeD * 2;
  __shared__ std::uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, (kProbeRows + kProbeBc) * kProbeD * 2);
    for (int pnl = 0; pnl < kProbeD / kPanelCols<T>; ++pnl) {
      tma_load_4d(qs + pnl * kProbeRows * kPanelRowBytes, &qmap, pnl * kPanelCols<T>, 0, 0, 0, &bar);
      tma_load_4d(ks + pnl * kProbeBc * kPanelRowBytes, &kmap, pnl * kPanelCols<T>, 0, 0, 0, &bar);
    }
  }
  mbar_wait(&bar, 0);
  ss_out<T>(qs, ks, kProbeD, s_out);
}

// (iii) O = P V: P (64, keys) read from global into the A-fragment layout, V (keys, D) by TMA as the
// MN-major B operand, the same descriptors as the main kernel's issue_pv.
template <class T>
__global__ void probe_rs_kernel(const std::uint16_t* p_in, const __grid_constant__ CUtensorMap vmap, float* o_out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* vs = smem_raw + swizzle_atom_pad(smem_raw);
  __shared__ std::uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, kProbeKeys * kProbeD * 2);
    for (int pnl = 0; pnl < kProbeD / kPanelCols<T>; ++pnl)
      tma_load_4d(vs + pnl * kProbeKeys * kPanelRowBytes, &vmap, pnl * kPanelCols<T>, 0, 0, 0, &bar);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  std::uint32_t pf[kProbeKeys / 16][4];
  auto pair = [&](int r, int c) {
    return std::uint32_t(p_in[r * kProbeKeys + c]) | (std::uint32_t(p_in[r * kProbeKeys + c + 1]) << 16);
  };
  for (int ks = 0; ks < kProbeKeys / 16; ++ks) {
    const int r = 16 * warp + g, c = 16 * ks + 2 * t;
    pf[ks][0] = pair(r, c);
    pf[ks][1] = pair(r + 8, c);
    pf[ks][2] = pair(r, c + 8);
    pf[ks][3] = pair(r + 8, c + 8);
  }
  mbar_wait(&bar, 0);
  float o[kProbeD / 2];
  for (int i = 0; i < kProbeD / 2; ++i) o[i] = 0.f;
  reg_fence(o);
  reg_fence(pf);
  wgmma_fence();
  for (int ks = 0; ks < kProbeKeys / 16; ++ks) wgmma_rs<T, kProbeD>(o, pf[ks], desc_mn_major<T>(smem_u32(vs), kProbeKeys, ks), 1);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  reg_fence(o);
  reg_fence(pf);
  store_acc<kProbeD>(o, o_out);
}

// (iv), (v): float8 e4m3, the generated k32 forms and ElementTraits<__nv_fp8_e4m3>'s layout. The threads write the
// operands into swizzled shared memory themselves (no e4m3 tensor map yet): one 128-byte panel row holds d = 128.
constexpr int kProbe8D = 128;    // K of S = Q K^T: one panel of e4m3
constexpr int kProbe8Keys = 128; // K of O = P V^T: one panel of e4m3

// Copies a (rows, 128) e4m3 tile, row-major in global memory, into its 128B-swizzled panel.
__device__ void stage_e4m3(unsigned char* tile, const std::uint8_t* src, int rows) {
  using E = __nv_fp8_e4m3;
  for (int i = threadIdx.x; i < rows * kPanelCols<E>; i += blockDim.x)
    tile[swizzle128_offset<E>(i / kPanelCols<E>, i % kPanelCols<E>, rows)] = src[i];
}

// (iv) S = Q K^T, Q (64, 128) and K (Bc, 128) in e4m3, both K-major: four k32 steps of the SS form.
__global__ void probe_ss_e4m3_kernel(const std::uint8_t* q, const std::uint8_t* k, float* s_out) {
  using E = __nv_fp8_e4m3;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* qs = smem_raw + swizzle_atom_pad(smem_raw);
  unsigned char* ks = qs + kProbeRows * kPanelRowBytes;
  stage_e4m3(qs, q, kProbeRows);
  stage_e4m3(ks, k, kProbeBc);
  fence_proxy_async_smem();
  __syncthreads();
  ss_out<E>(qs, ks, kProbe8D, s_out);
}

// O (64 x d) = P V by the e4m3 RS form, one k32 step per set of A fragments pf, against V^T at `vs` (d rows of
// 128 keys, K-major, swizzled), stored row-major into o_out.
constexpr int kProbe8Steps = kProbe8Keys / ElementTraits<__nv_fp8_e4m3>::kWgmmaK;
__device__ void rs_e4m3_out(std::uint32_t (&pf)[kProbe8Steps][4], const unsigned char* vs, float* o_out) {
  float o[kProbeD / 2];
  for (int i = 0; i < kProbeD / 2; ++i) o[i] = 0.f;
  reg_fence(o);
  reg_fence(pf);
  wgmma_fence();
  for (int ks = 0; ks < kProbe8Steps; ++ks)
    wgmma_rs<__nv_fp8_e4m3, kProbeD>(o, pf[ks], desc_k_major(smem_u32(vs), kProbeD, ks), 1);
  wgmma_commit_group();
  wgmma_wait_group<0>();
  reg_fence(o);
  reg_fence(pf);
  store_acc<kProbeD>(o, o_out);
}

// (v) O = P V with P (64, keys) in registers and V^T (d, keys) K-major in shared memory, e4m3: the RS form an
// FP8 forward issues. The A fragment of one k32 step, per warp (16 rows) and thread (g = lane / 4, t = lane % 4):
// word 0 is row g, columns 4t .. 4t + 3 (the lowest byte first); word 1 row g + 8; words 2 and 3 the same at
// columns 16 + 4t .. 16 + 4t + 3.
__global__ void probe_rs_e4m3_kernel(const std::uint8_t* p_in, const std::uint8_t* vt, float* o_out) {
  using E = __nv_fp8_e4m3;
  constexpr int kK = ElementTraits<E>::kWgmmaK;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* vs = smem_raw + swizzle_atom_pad(smem_raw);
  stage_e4m3(vs, vt, kProbeD);
  fence_proxy_async_smem();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto word = [&](int r, int c) {
    const std::uint8_t* x = p_in + r * kProbe8Keys + c;
    return std::uint32_t(x[0]) | std::uint32_t(x[1]) << 8 | std::uint32_t(x[2]) << 16 | std::uint32_t(x[3]) << 24;
  };
  std::uint32_t pf[kProbe8Keys / kK][4];
  for (int ks = 0; ks < kProbe8Keys / kK; ++ks) {
    const int r = 16 * warp + g, c = kK * ks + 4 * t;
    pf[ks][0] = word(r, c);
    pf[ks][1] = word(r + 8, c);
    pf[ks][2] = word(r, c + 16);
    pf[ks][3] = word(r + 8, c + 16);
  }
  rs_e4m3_out(pf, vs, o_out);
}

// O (64 x d) = P V as the FP8 forward will issue it, for probes (vi) and (vii): P (64 x 128 keys, p_in row-major)
// read into the registers an S accumulator holds it in, packed without moving values between threads
// (pack_p_e4m3), against V^T at `vs`, whose keys are stored in the matching order (fp8_v_key; fp8_layout.cuh).
__device__ void pv_from_accumulator_e4m3(const float* p_in, const unsigned char* vs, float* o_out) {
  using E = __nv_fp8_e4m3;
  constexpr int kK = ElementTraits<E>::kWgmmaK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[kProbe8Keys / 2];  // as S's accumulator holds P: n-tile i, rows g and g + 8, columns 8i + 2t, + 1
  for (int i = 0; i < kProbe8Keys / 8; ++i)
    for (int q = 0; q < 4; ++q)
      acc[4 * i + q] = p_in[(16 * warp + g + 8 * (q / 2)) * kProbe8Keys + 8 * i + 2 * t + q % 2];
  std::uint32_t pf[kProbe8Keys / kK][4];
  for (int ks = 0; ks < kProbe8Keys / kK; ++ks) pack_p_e4m3(acc, ks, 1.f, pf[ks]);
  rs_e4m3_out(pf, vs, o_out);
}

// (vi) V^T, keys already in fp8_v_key's order, written into shared memory by the threads.
__global__ void probe_pv_e4m3_permuted_kernel(const float* p_in, const std::uint8_t* vt_permuted, float* o_out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* vs = smem_raw + swizzle_atom_pad(smem_raw);
  stage_e4m3(vs, vt_permuted, kProbeD);
  fence_proxy_async_smem();
  __syncthreads();
  pv_from_accumulator_e4m3(p_in, vs, o_out);
}

// (vii) V^T as the FP8 forward will get it: V (keys, d) through the pre-pass (transpose_v_e4m3), then one TMA box
// of its V^T (make_vt_tensor_map) into swizzled shared memory.
__global__ void probe_pv_e4m3_tma_kernel(const float* p_in, const __grid_constant__ CUtensorMap vtmap, float* o_out) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* vs = smem_raw + swizzle_atom_pad(smem_raw);
  __shared__ std::uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar, kProbeD * kProbe8Keys);
    tma_load_4d(vs, &vtmap, 0, 0, 0, 0, &bar);  // keys 0 .. 127, dims 0 .. d - 1 of (b, h) = (0, 0)
  }
  mbar_wait(&bar, 0);
  pv_from_accumulator_e4m3(p_in, vs, o_out);
}

template <class X>
X* dev_alloc(std::size_t n) {
  X* p = nullptr;
  cuda_ok(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(X)), "cudaMalloc");
  return p;
}

std::vector<std::uint16_t> random_bits(std::size_t n, DType dt, std::mt19937_64& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = to_bits(nd(rng), dt);
  return v;
}

// A device copy of a host vector, for a kernel argument; a tensor map goes by value as it is.
template <class X>
const X* to_device(const std::vector<X>& v, std::vector<void*>& owned) {
  X* d = dev_alloc<X>(v.size());
  cuda_ok(cudaMemcpy(d, v.data(), v.size() * sizeof(X), cudaMemcpyHostToDevice), "memcpy");
  owned.push_back(d);
  return d;
}
inline const CUtensorMap& to_device(const CUtensorMap& map, std::vector<void*>&) { return map; }

// kernel<<<1, 128, smem>>>(inputs..., out) with the inputs on the device, and its `outputs` floats back.
template <class Kernel, class... In>
std::vector<float> on_device(const char* what, Kernel kernel, int outputs, int smem, const In&... inputs) {
  cuda_ok(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  std::vector<void*> owned;
  float* out = dev_alloc<float>(outputs);
  kernel<<<1, 128, smem>>>(to_device(inputs, owned)..., out);
  finish(what);
  std::vector<float> got(outputs);
  cuda_ok(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost), "memcpy");
  cudaFree(out);
  for (void* p : owned) cudaFree(p);
  return got;
}

int run_probes(std::uint64_t seed) {
  const DType dt = DType::BF16;
  std::mt19937_64 rng(seed);
  int fails = 0;
  constexpr int kSmem = 64 * 1024;
  // (i) TMA: B=2, S=100, H=3 so that rows 100..127 of a 128-row box are out of bounds (zero-filled).
  {
    const int B = 2, S = 100, H = 3, rows = 128, h = 1, b = 1;
    auto src = random_bits(std::size_t(B) * S * H * kProbeD, dt, rng);
    auto* d_src = dev_alloc<std::uint16_t>(src.size());
    auto* d_raw = dev_alloc<std::uint16_t>(rows * kProbeD);
    cuda_ok(cudaMemcpy(d_src, src.data(), src.size() * 2, cudaMemcpyHostToDevice), "memcpy");
    const CUtensorMap map = make_bshd_tensor_map(d_src, dt, B, S, H, kProbeD, rows);
    cuda_ok(cudaFuncSetAttribute(probe_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "attr");
    probe_tma_kernel<<<1, 128, kSmem>>>(map, d_raw, rows, h, 0, b);
    finish("probe (i) TMA");
    std::vector<std::uint16_t> raw(rows * kProbeD);
    cuda_ok(cudaMemcpy(raw.data(), d_raw, raw.size() * 2, cudaMemcpyDeviceToHost), "memcpy");
    bool ok = true;
    for (int r = 0; r < rows && ok; ++r)
      for (int c = 0; c < kProbeD && ok; ++c) {
        const std::uint16_t want = r < S ? src[((std::size_t(b) * S + r) * H + h) * kProbeD + c] : 0;
        const std::uint16_t got = raw[swizzle128_offset<__nv_bfloat16>(r, c, rows) / 2];
        if (got != want) {
          SAY("probe (i) TMA 128B swizzle: FAIL at (row %d, col %d): got 0x%04x (%g) want 0x%04x (%g)\n", r, c, got,
              from_bits(got, dt), want, from_bits(want, dt));
          ok = false;
        }
      }
    if (ok) SAY("probe (i) TMA 128B swizzle (B=2 S=100 H=3 d=128, box 128 rows, zero-fill past row 100): PASS\n");
    fails += !ok;
    cudaFree(d_src);
    cudaFree(d_raw);
  }
  // (ii) S = Q K^T (64 x 128 x 128).
  {
    auto q = random_bits(kProbeRows * kProbeD, dt, rng), k = random_bits(kProbeBc * kProbeD, dt, rng);
    auto* dq = dev_alloc<std::uint16_t>(q.size());
    auto* dk = dev_alloc<std::uint16_t>(k.size());
    auto* ds = dev_alloc<float>(kProbeRows * kProbeBc);
    cuda_ok(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice), "memcpy");
    cuda_ok(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice), "memcpy");
    const CUtensorMap qm = make_bshd_tensor_map(dq, dt, 1, kProbeRows, 1, kProbeD, kProbeRows);
    const CUtensorMap km = make_bshd_tensor_map(dk, dt, 1, kProbeBc, 1, kProbeD, kProbeBc);
    cuda_ok(cudaFuncSetAttribute(probe_ss_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "attr");
    probe_ss_kernel<__nv_bfloat16><<<1, 128, kSmem>>>(qm, km, ds);
    finish("probe (ii) wgmma SS");
    std::vector<float> s(kProbeRows * kProbeBc);
    cuda_ok(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost), "memcpy");
    bool ok = true;
    for (int r = 0; r < kProbeRows && ok; ++r)
      for (int c = 0; c < kProbeBc && ok; ++c) {
        double want = 0;
        for (int x = 0; x < kProbeD; ++x) want += double(from_bits(q[r * kProbeD + x], dt)) * from_bits(k[c * kProbeD + x], dt);
        if (!(std::fabs(s[r * kProbeBc + c] - want) <= 1e-3 * (1 + std::fabs(want)))) {
          SAY("probe (ii) wgmma SS S = Q K^T: FAIL at (row %d, col %d): got %g want %g\n", r, c, s[r * kProbeBc + c], want);
          ok = false;
        }
      }
    if (ok) SAY("probe (ii) wgmma SS S = Q K^T (64 x 128, d=128): PASS\n");
    fails += !ok;
    cudaFree(dq);
    cudaFree(dk);
    cudaFree(ds);
  }
  // (iii) O = P V (64 x 128, 64 keys).
  {
    auto pm = random_bits(kProbeRows * kProbeKeys, dt, rng), v = random_bits(kProbeKeys * kProbeD, dt, rng);
    auto* dp = dev_alloc<std::uint16_t>(pm.size());
    auto* dv = dev_alloc<std::uint16_t>(v.size());
    auto* d_o = dev_alloc<float>(kProbeRows * kProbeD);
    cuda_ok(cudaMemcpy(dp, pm.data(), pm.size() * 2, cudaMemcpyHostToDevice), "memcpy");
    cuda_ok(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice), "memcpy");
    const CUtensorMap vm = make_bshd_tensor_map(dv, dt, 1, kProbeKeys, 1, kProbeD, kProbeKeys);
    cuda_ok(cudaFuncSetAttribute(probe_rs_kernel<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "attr");
    probe_rs_kernel<__nv_bfloat16><<<1, 128, kSmem>>>(dp, vm, d_o);
    finish("probe (iii) wgmma RS");
    std::vector<float> o(kProbeRows * kProbeD);
    cuda_ok(cudaMemcpy(o.data(), d_o, o.size() * 4, cudaMemcpyDeviceToHost), "memcpy");
    bool ok = true;
    for (int r = 0; r < kProbeRows && ok; ++r)
      for (int c = 0; c < kProbeD && ok; ++c) {
        double want = 0;
        for (int x = 0; x < kProbeKeys; ++x) want += double(from_bits(pm[r * kProbeKeys + x], dt)) * from_bits(v[x * kProbeD + c], dt);
        if (!(std::fabs(o[r * kProbeD + c] - want) <= 1e-3 * (1 + std::fabs(want)))) {
          SAY("probe (iii) wgmma RS O = P V (V MN-major): FAIL at (row %d, col %d): got %g want %g\n", r, c, o[r * kProbeD + c], want);
          ok = false;
        }
      }
    if (ok) SAY("probe (iii) wgmma RS O = P V (64 x 128, 64 keys, V transposed): PASS\n");
    fails += !ok;
    cudaFree(dp);
    cudaFree(dv);
    cudaFree(d_o);
  }
  // (iv)-(vii): e4m3. The FP8 tensor cores keep fewer bits than fp32 while they accumulate (about 14), so a sum is
  // held to 2^-7 of the sum of its terms' magnitudes; an operand laid out wrong moves it by whole terms.
  auto e4m3_operand = [&](int n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<std::uint8_t> v(n);
    for (auto& x : v) x = float_to_e4m3_bits(nd(rng));
    return v;
  };
  auto check_e4m3 = [&](const char* what, const std::vector<float>& got, int rows, int cols, auto term, int depth) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        double want = 0, magnitude = 0;
        for (int x = 0; x < depth; ++x) {
          want += term(r, c, x);
          magnitude += std::fabs(term(r, c, x));
        }
        if (!(std::fabs(got[r * cols + c] - want) <= 0x1p-7 * magnitude + 1e-6)) {
          SAY("%s: FAIL at (row %d, col %d): got %g want %g\n", what, r, c, got[r * cols + c], want);
          return false;
        }
      }
    return true;
  };
  auto report = [&](bool ok, const char* passed) {
    if (ok) SAY("%s: PASS\n", passed);
    fails += !ok;
  };
  {
    const auto q = e4m3_operand(kProbeRows * kProbe8D), k = e4m3_operand(kProbeBc * kProbe8D);
    const auto s = on_device("probe (iv) wgmma SS e4m3", probe_ss_e4m3_kernel, kProbeRows * kProbeBc, kSmem, q, k);
    report(check_e4m3("probe (iv) wgmma SS e4m3 S = Q K^T", s, kProbeRows, kProbeBc, [&](int r, int c, int x) {
             return double(e4m3_bits_to_float(q[r * kProbe8D + x])) * e4m3_bits_to_float(k[c * kProbe8D + x]);
           }, kProbe8D),
           "probe (iv) wgmma SS e4m3 S = Q K^T (64 x 128, d=128, k32)");
  }
  {
    const auto pm = e4m3_operand(kProbeRows * kProbe8Keys), vt = e4m3_operand(kProbeD * kProbe8Keys);  // V^T: (d, keys)
    const auto o = on_device("probe (v) wgmma RS e4m3", probe_rs_e4m3_kernel, kProbeRows * kProbeD, kSmem, pm, vt);
    report(check_e4m3("probe (v) wgmma RS e4m3 O = P V (V^T K-major)", o, kProbeRows, kProbeD, [&](int r, int c, int x) {
             return double(e4m3_bits_to_float(pm[r * kProbe8Keys + x])) * e4m3_bits_to_float(vt[c * kProbe8Keys + x]);
           }, kProbe8Keys),
           "probe (v) wgmma RS e4m3 O = P V (64 x 128, 128 keys, P in registers, V^T K-major, k32)");
  }
  // (vi), (vii): P in [0, 1) as e4m3 values (the packing then rounds nothing), V standard normal in e4m3, (keys, d).
  auto probability_block = [&] {
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<float> pm(kProbeRows * kProbe8Keys);
    for (auto& x : pm) x = round_to_e4m3(ud(rng));
    return pm;
  };
  auto p_times_v = [](const std::vector<float>& pm, const std::vector<std::uint8_t>& v, int keys) {
    return [&pm, &v, keys](int r, int c, int key) {
      if (key >= keys) return 0.0;  // V^T is zero there
      return double(pm[r * kProbe8Keys + key]) * e4m3_bits_to_float(v[key * kProbeD + c]);
    };
  };
  {
    const auto pm = probability_block();
    const auto v = e4m3_operand(kProbe8Keys * kProbeD);
    std::vector<std::uint8_t> vt(kProbeD * kProbe8Keys);  // V^T: (d, keys), keys in fp8_v_key's order
    for (int c = 0; c < kProbeD; ++c)
      for (int k = 0; k < kProbe8Keys; ++k) vt[c * kProbe8Keys + k] = v[fp8_v_key(k) * kProbeD + c];
    const auto o = on_device("probe (vi) e4m3 P from the accumulator", probe_pv_e4m3_permuted_kernel,
                             kProbeRows * kProbeD, kSmem, pm, vt);
    report(check_e4m3("probe (vi) e4m3 O = P V, P packed from S's accumulator, V^T keys permuted", o, kProbeRows,
                      kProbeD, p_times_v(pm, v, kProbe8Keys), kProbe8Keys),
           "probe (vi) e4m3 O = P V (P packed from S's accumulator in place, V^T's keys in fp8_v_key's order)");
  }
  {
    constexpr int kKeys = 100;  // the pre-pass zero-fills V^T's keys 100 .. 127
    const auto pm = probability_block();
    const auto v = e4m3_operand(kKeys * kProbeD);  // B = H = 1
    const int vt_keys = fp8_vt_keys(kKeys);
    auto* dv = dev_alloc<std::uint8_t>(v.size());
    auto* dvt = dev_alloc<std::uint8_t>(std::size_t(kProbeD) * vt_keys);
    cuda_ok(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice), "memcpy");
    transpose_v_e4m3(dv, dvt, 1, kKeys, 1, kProbeD, nullptr);
    const CUtensorMap vtm = make_vt_tensor_map(dvt, 1, 1, kProbeD, vt_keys, kProbeD);
    const auto o = on_device("probe (vii) e4m3 V^T by the pre-pass and TMA", probe_pv_e4m3_tma_kernel,
                             kProbeRows * kProbeD, kSmem, pm, vtm);
    report(check_e4m3("probe (vii) e4m3 O = P V, V^T from the pre-pass by TMA", o, kProbeRows, kProbeD,
                      p_times_v(pm, v, kKeys), kProbe8Keys),
           "probe (vii) e4m3 O = P V (100 keys; V^T from transpose_v_e4m3, one TMA box of make_vt_tensor_map)");
    cudaFree(dv);
    cudaFree(dvt);
  }
  return fails;
}

// ---- timing -------------------------------------------------------------------------------------------------

__global__ void fill_random_kernel(std::uint16_t* x, std::size_t n, std::uint32_t salt, bool bf16) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ salt;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float f = (static_cast<float>(h & 0xffff) / 65535.f) * 2.f - 1.f;  // uniform in [-1, 1], never all zero
    if (bf16) {
      const __nv_bfloat16 b = __float2bfloat16(f);
      x[i] = *reinterpret_cast<const std::uint16_t*>(&b);
    } else {
      const __half b = __float2half(f);
      x[i] = *reinterpret_cast<const std::uint16_t*>(&b);
    }
  }
}

// Median ms of kIters runs after kWarm (events around each launch); -1 when `launch` says "not built".
template <class F>
double median_ms(F&& launch, int warm = 5, int iters = 20) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int it = 0; it < warm + iters; ++it) {
    cudaEventRecord(e0);
    const bool built = launch();
    cudaEventRecord(e1);
    wait_for(e1, "bench kernel");
    if (!built) return -1;
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (it >= warm) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct BenchBuffers {
  static constexpr int kTokens = 16384, kHidden = 2048;
  std::uint16_t *q, *k, *v, *o;
  float* lse;
  int* tile_counter;
  BenchBuffers() {
    const std::size_t n = std::size_t(kTokens) * kHidden;
    q = dev_alloc<std::uint16_t>(n);
    k = dev_alloc<std::uint16_t>(n);
    v = dev_alloc<std::uint16_t>(n);
    o = dev_alloc<std::uint16_t>(n);
    lse = dev_alloc<float>(std::size_t(kTokens) * kHidden / 64);
    tile_counter = dev_alloc<int>(2);
    cuda_ok(cudaMemset(tile_counter, 0, 2 * sizeof(int)), "tile counter");
    fill_random_kernel<<<1024, 256>>>(q, n, 1, true);
    fill_random_kernel<<<1024, 256>>>(k, n, 2, true);
    fill_random_kernel<<<1024, 256>>>(v, n, 3, true);
    finish("fill");
  }
  ~BenchBuffers() {
    cudaFree(q);
    cudaFree(k);
    cudaFree(v);
    cudaFree(o);
    cudaFree(lse);
    cudaFree(tile_counter);
  }
  // B N = kTokens, H d = kHidden, bf16.
  Params params(int D, int N, bool causal) const {
    Params p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.tile_counter = tile_counter;
    p.batch = kTokens / N;
    p.heads_q = p.heads_kv = kHidden / D;
    p.seq_q = p.seq_k = N;
    p.head_dim = D;
    p.align = causal ? CausalAlign::BottomRight : CausalAlign::None;
    p.scale = static_cast<float>(1.0 / std::sqrt(double(D)));
    p.scale_log2 = p.scale * 1.4426950408889634f;
    return p;
  }
};

double tflops(const Params& p, double ms) {
  double flops = 4.0 * p.batch * p.heads_q * double(p.seq_q) * p.seq_k * p.head_dim;
  if (p.align != CausalAlign::None) flops /= 2;
  return ms > 0 ? flops / (ms * 1e-3) / 1e12 : -1;
}

void run_bench(const std::vector<int>& steps, const std::vector<int>& dims, const std::vector<int>& ns, bool variants,
               const std::vector<int>& heads_per_group, int hpg_var, int repeats) {
  const BenchBuffers buf;
  for (int r = 0; r < repeats; ++r) {
  SAY("bench bf16, B*N = %d tokens, H*d = %d, TFLOP/s (median of 20 after 5 warm-ups)\n", BenchBuffers::kTokens, BenchBuffers::kHidden);
  SAY("%4s %6s %6s", "d", "N", "causal");
  for (int s : steps) SAY("  step%d", s);
  SAY("\n");
  for (int D : dims)
    for (bool causal : {false, true})
      for (int N : ns) {
        const Params p = buf.params(D, N, causal);
        SAY("%4d %6d %6s", D, N, causal ? "yes" : "no");
        for (int step : steps) {
          const double ms = median_ms([&] {
            launch_forward(DType::BF16, p, nullptr, static_cast<LadderStep>(step));
            return true;
          });
          SAY("  %5.0f", tflops(p, ms));
        }
        SAY("\n");
      }
  }
  if (!heads_per_group.empty()) {
    // Step 5's tile order with the heads of an L2 group given (0: the launcher's choice).
    SAY("step 5, TFLOP/s by heads per L2 group (0 = launcher's choice)\n%4s %6s %6s", "d", "N", "causal");
    for (int g : heads_per_group) SAY("  hpg%-3d", g);
    SAY("\n");
    for (int D : dims)
      for (bool causal : {false, true})
        for (int N : ns) {
          const Params p = buf.params(D, N, causal);
          SAY("%4d %6d %6s", D, N, causal ? "yes" : "no");
          for (int g : heads_per_group) {
            SAY("  %6.0f", tflops(p, median_ms([&] {
                  return launch_forward_variant(DType::BF16, p, nullptr, LadderStep::Persistent,
                                                hpg_var >= 0 ? hpg_var : kShipped, g);
                })));
          }
          SAY("\n");
        }
  }
  if (!variants) return;
  SAY("variants, TFLOP/s: ship = launch_forward (order m-fast + K ahead + 3 stages at d=128), v0 = previous pass,\n"
      "v1 = + m-fast tile order, v3 = + K ahead of V (built at d = 128 only; elsewhere ship = v3)\n");
  SAY("%4s %6s %6s %4s %6s", "d", "N", "causal", "step", "ship");
  for (int v : kCandidates) SAY("  %5s", ("v" + std::to_string(v)).c_str());
  SAY("\n");
  for (int D : dims)
    for (bool causal : {false, true})
      for (int N : ns)
        for (int step : steps) {
          if (step < 2) continue;
          const Params p = buf.params(D, N, causal);
          SAY("%4d %6d %6s %4d", D, N, causal ? "yes" : "no", step);
          SAY("  %5.0f", tflops(p, median_ms([&] {
                launch_forward(DType::BF16, p, nullptr, static_cast<LadderStep>(step));
                return true;
              })));
          // Each candidate's O beside the shipped kernel's (bf16 rounding of a different summation order
          // stays near 1e-2; a layout or masking bug does not).
          const std::size_t n_o = std::size_t(BenchBuffers::kTokens) * BenchBuffers::kHidden;
          std::vector<std::uint16_t> o_ship(n_o), o_var(n_o);
          cuda_ok(cudaMemcpy(o_ship.data(), p.o, n_o * 2, cudaMemcpyDeviceToHost), "copy O");
          std::string diffs;
          for (int v : kCandidates) {
            const double ms = median_ms([&] { return launch_forward_variant(DType::BF16, p, nullptr, static_cast<LadderStep>(step), v); });
            if (ms < 0) { SAY("  %5s", "-"); continue; }
            SAY("  %5.0f", tflops(p, ms));
            cuda_ok(cudaMemcpy(o_var.data(), p.o, n_o * 2, cudaMemcpyDeviceToHost), "copy O");
            float worst = 0;
            for (std::size_t i = 0; i < n_o; ++i)
              worst = std::max(worst, std::fabs(from_bits(o_var[i], DType::BF16) - from_bits(o_ship[i], DType::BF16)));
            char buf_s[48];
            std::snprintf(buf_s, sizeof buf_s, " v%d:%.1e", v, worst);
            diffs += buf_s;
          }
          SAY("   max|O - O_ship|%s\n", diffs.c_str());
        }
}

// One timeline run per (step, d, N): records of the first blocks, as Trace Event JSON in `dir`; and the
// cost of recording (plain shipped kernel vs the timeline build with and without a buffer).
int run_timeline(const std::string& dir, const std::vector<int>& steps, const std::vector<int>& dims, const std::vector<int>& ns,
                 bool causal, int capacity) {
  const BenchBuffers buf;
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  auto* d_rec = dev_alloc<flashlab::TimelineRecord>(capacity);  // the kernel reads p.timeline as flashlab::TimelineRecord slots
  auto* d_count = dev_alloc<unsigned>(1);
  int fails = 0;
  SAY("timeline (bf16, shipped choices, %s): ms median of 20: plain / timeline build, no buffer / recording\n",
      causal ? "causal bottom-right" : "not causal");
  for (int D : dims)
    for (int N : ns)
      for (int step : steps) {
        Params p = buf.params(D, N, causal);
        const LadderStep ls = static_cast<LadderStep>(step);
        const double plain = median_ms([&] {
          launch_forward(DType::BF16, p, nullptr, ls);
          return true;
        });
        const double idle = median_ms([&] {
          launch_forward_timeline(DType::BF16, p, nullptr, ls);  // p.timeline is null: the build, not recording
          return true;
        });
        p.timeline = d_rec;
        p.timeline_count = d_count;
        p.timeline_capacity = capacity;
        const double rec = median_ms([&] {
          cuda_ok(cudaMemsetAsync(d_count, 0, sizeof(unsigned)), "timeline count");
          launch_forward_timeline(DType::BF16, p, nullptr, ls);
          return true;
        });
        // The kept run: a clean buffer (0xff bytes: event kTimelineHole), then one launch.
        cuda_ok(cudaMemset(d_rec, 0xff, std::size_t(capacity) * sizeof(flashlab::TimelineRecord)), "timeline fill");
        cuda_ok(cudaMemset(d_count, 0, sizeof(unsigned)), "timeline count");
        launch_forward_timeline(DType::BF16, p, nullptr, ls);
        finish("timeline kernel");
        unsigned used = 0;
        cuda_ok(cudaMemcpy(&used, d_count, sizeof used, cudaMemcpyDeviceToHost), "memcpy");
        std::vector<flashlab::TimelineRecord> raw(std::min<std::size_t>(used, capacity));
        cuda_ok(cudaMemcpy(raw.data(), d_rec, raw.size() * sizeof(flashlab::TimelineRecord), cudaMemcpyDeviceToHost), "memcpy");
        std::vector<flashlab::TimelineRecord> recs;
        for (const flashlab::TimelineRecord& r : raw)
          if (r.event != kTimelineHole) recs.push_back(r);
        char name[128], label[160];
        std::snprintf(name, sizeof name, "%s/h100-fa3-ws-timeline-step%d-d%d-n%dk%s.json", dir.c_str(), step, D, N / 1024,
                      causal ? "-causal" : "");
        std::snprintf(label, sizeof label, "ladder step %d, bf16, B=%d H=%d N=%d d=%d%s, blocks 0-%d", step, p.batch, p.heads_q,
                      N, D, causal ? " causal bottom-right" : "", kTimelineBlocks - 1);
        try {
          const flashlab::Timeline t = timeline_from_records(recs.data(), recs.size(), prop.name, "cuda-fa3-ws", label, step >= 2 ? 1 : 0);
          std::ofstream f(name);
          write_trace_event_json(t, f);
          if (!f) throw std::runtime_error(std::string("cannot write ") + name);
        } catch (const std::exception& e) {
          SAY("timeline: step %d d=%d N=%d: %s\n", step, D, N, e.what());
          ++fails;
          continue;
        }
        SAY("timeline step %d d=%d N=%d: %zu records (%u slots taken of %d) -> %s; ms plain %.3f, timeline build %.3f "
            "(%+.1f%%), recording %.3f (%+.1f%%)\n",
            step, D, N, recs.size(), used, capacity, name, plain, idle, 100 * (idle / plain - 1), rec, 100 * (rec / plain - 1));
      }
  cudaFree(d_rec);
  cudaFree(d_count);
  return fails;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* c = s; *c;) {
    v.push_back(std::atoi(c));
    while (*c && *c != ',') ++c;
    if (*c == ',') ++c;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  bool probes = false, bench = false, variants = false, causal = false;
  std::vector<int> heads_per_group;
  int repeats = 1, hpg_var = -1;
  std::string timeline_dir;
  int timeline_records = 8192;
  std::vector<int> steps = {1, 2, 3, 4, 5}, dims(std::begin(kHeadDims), std::end(kHeadDims)),
                   ns = {512, 1024, 2048, 4096, 8192, 16384};
  std::uint64_t seed = std::random_device{}();
  const char* log_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--probes") probes = true;
    else if (a == "--bench") bench = true;
    else if (a == "--variants") variants = true;
    else if (a == "--causal") causal = true;
    else if (a == "--timeline" && i + 1 < argc) timeline_dir = argv[++i];
    else if (a == "--timeline-records" && i + 1 < argc) timeline_records = std::atoi(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = parse_list(argv[++i]);
    else if (a == "--dims" && i + 1 < argc) dims = parse_list(argv[++i]);
    else if (a == "--ns" && i + 1 < argc) ns = parse_list(argv[++i]);
    else if (a == "--hpg" && i + 1 < argc) heads_per_group = parse_list(argv[++i]);
    else if (a == "--hpg-var" && i + 1 < argc) hpg_var = std::atoi(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--log" && i + 1 < argc) log_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--probes] [--bench] [--variants] [--timeline DIR [--causal] [--timeline-records N]] [--steps 1,2,..] [--dims 64,..] [--ns 4096,..] [--hpg 1,2,.. [--hpg-var V]] [--repeat R] [--seed N] [--log FILE]\n", argv[0]);
      return 2;
    }
  }
  if (!probes && !bench && timeline_dir.empty()) probes = true;
  if (log_path) g_log = std::fopen(log_path, "a");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  SAY("cuda-fa3-ws harness on %s (sm_%d%d, %d SMs); seed %llu\n", prop.name, prop.major, prop.minor,
      prop.multiProcessorCount, static_cast<unsigned long long>(seed));
  int fails = 0;
  std::vector<std::string> summary;
  if (probes) {
    const int f = run_probes(seed);
    fails += f;
    summary.push_back(std::string("probes: ") + (f ? std::to_string(f) + " FAIL" : "all PASS"));
  }
  if (bench) run_bench(steps, dims, ns, variants, heads_per_group, hpg_var, repeats);
  if (!timeline_dir.empty()) {
    const int f = run_timeline(timeline_dir, steps, dims, ns, causal, timeline_records);
    fails += f;
    summary.push_back(std::string("timeline: ") + (f ? std::to_string(f) + " FAIL" : "written"));
  }
  SAY("---- summary ----\n");
  for (const auto& s : summary) SAY("%s\n", s.c_str());
  SAY("%s\n", fails ? "RESULT: FAIL" : "RESULT: PASS");
  if (g_log) std::fclose(g_log);
  return fails ? 1 : 0;
}
