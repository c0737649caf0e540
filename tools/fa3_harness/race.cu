// Races candidate schedules of cuda-fa3-ws's persistent forward (Schedule's knobs, forward_config.cuh; the list is
// race_candidates.inc) on random inputs, x uniform in (-1, 1): bf16 as `flashlab bench` makes them, e4m3 as
// `flashlab bench --dtype e4m3` does (e4m3(448 x), descale 1/448); B N = 16k and H d = 2048. Each candidate's O
// (poisoned with NaN before its launches) is compared with the first's of its element type and head dim: the
// candidates change where and when the softmax computes, not what, so O may differ only by P's rounding of a slightly
// different exp2 or rescale (a few bf16 steps at most), never by a wrong block; where V is transposed changes
// nothing at all. Timing: each candidate's launcher whole, median of 15 after 3 warm-ups: an FP8 candidate that reads
// the pre-pass's V^T runs that pre-pass in every call (race_kernels.cu), one that transposes V in the producer gets
// no V^T scratch (Params::vt null). A winner is promoted by making it ShippedSchedule's. Build and run:
// tools/fa3_harness/race.sh (which writes race_selected.inc: race_candidates.inc's lines, or those RACE_ONLY picks).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/flops.hpp"
#include "cuda/common.cuh"  // random_uniform_pm1
#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace flashlab::cuda::fa3_ws {
#define RACE_CANDIDATE(name, type, d, wide, poly, own_o, lazy, vt_smem, trees, split_s, consumers, what) void name(const Params&, cudaStream_t);
#include "race_selected.inc"
#undef RACE_CANDIDATE
}  // namespace flashlab::cuda::fa3_ws

namespace {
using namespace flashlab::cuda::fa3_ws;

struct Candidate {
  const char* name;
  bool e4m3;  // else bf16
  int d;
  bool vt_smem;  // FP8: V transposed in the producer, no V^T scratch
  const char* what;
  void (*launch)(const Params&, cudaStream_t);
};
template <class T>
constexpr bool is_e4m3 = sizeof(T) == 1;
const Candidate kCandidates[] = {
#define RACE_CANDIDATE(name, type, d, wide, poly, own_o, lazy, vt_smem, trees, split_s, consumers, what) \
  {#name, is_e4m3<type>, d, vt_smem, what, &name},
#include "race_selected.inc"
#undef RACE_CANDIDATE
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Element i uniform in (-1, 1) under `seed` (cuda::random_uniform_pm1, the bench's draw): stored as e4m3(448 x)
// (`e4m3`), else as bf16 (two bytes an element).
__global__ void fill_random(unsigned char* out, std::size_t n, std::uint64_t seed, bool e4m3) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u = flashlab::cuda::random_uniform_pm1(i, seed);
  if (e4m3) out[i] = __nv_cvt_float_to_fp8(448.0f * u, __NV_SATFINITE, __NV_E4M3);
  else reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(u);
}

template <class T>
T* dev_alloc(std::size_t n) {
  T* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return p;
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ns = {4096, 8192, 16384};
  if (argc > 1) {
    ns.clear();
    for (char* s = argv[1]; *s;) { ns.push_back(std::atoi(s)); while (*s && *s != ',') ++s; if (*s) ++s; }
  }
  // RACE_SEQ_Q: queries per sequence, for all N (keys); unset, as many as keys. With fewer queries than keys the
  // causal rows align bottom-right (the last query sees every key, as in a KV cache).
  const char* seq_q_env = std::getenv("RACE_SEQ_Q");
  const int seq_q_given = seq_q_env ? std::atoi(seq_q_env) : 0;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s\n", prop.name);
  if (seq_q_given > 0) std::printf("queries: %d per sequence (N is the keys), causal bottom-right\n", seq_q_given);
  std::printf("%-24s %4s %4s %6s %7s %10s %10s %s\n", "candidate", "type", "d", "N", "causal", "TFLOP/s", "max|dO|",
              "what");
  int failures = 0;
  for (const bool e4m3 : {false, true}) {
    for (int d : {64, 128, 256}) {
      bool any = false;
      for (const Candidate& c : kCandidates) any = any || (c.e4m3 == e4m3 && c.d == d);
      if (!any) continue;
      for (int n : ns) {
        for (int causal : {0, 1}) {
          const int batch = std::max(1, 16384 / n), heads = 2048 / d, sq = seq_q_given > 0 ? seq_q_given : n;
          const std::size_t kv_elems = std::size_t(batch) * n * heads * d, bytes = kv_elems * (e4m3 ? 1 : 2);
          const std::size_t elems = std::size_t(batch) * sq * heads * d, q_bytes = elems * (e4m3 ? 1 : 2);
          auto* q = dev_alloc<unsigned char>(q_bytes);
          auto* k = dev_alloc<unsigned char>(bytes);
          auto* v = dev_alloc<unsigned char>(bytes);
          auto* vt = e4m3 ? dev_alloc<unsigned char>(static_cast<std::size_t>(fp8_vt_bytes(batch, heads, d, n))) : nullptr;
          auto* o = dev_alloc<__nv_bfloat16>(elems);
          auto* lse = dev_alloc<float>(std::size_t(batch) * heads * sq);
          auto* desc = dev_alloc<float>(std::size_t(batch) * heads);
          auto* counter = dev_alloc<int>(2);
          check(cudaMemset(counter, 0, 2 * sizeof(int)), "cudaMemset");
          std::vector<float> descale(std::size_t(batch) * heads, 1.0f / 448.0f);
          check(cudaMemcpy(desc, descale.data(), descale.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
          const unsigned q_blocks = static_cast<unsigned>((elems + 255) / 256);
          const unsigned kv_blocks = static_cast<unsigned>((kv_elems + 255) / 256);
          fill_random<<<q_blocks, 256>>>(q, elems, 1, e4m3);
          fill_random<<<kv_blocks, 256>>>(k, kv_elems, 2, e4m3);
          fill_random<<<kv_blocks, 256>>>(v, kv_elems, 3, e4m3);
          Params p;
          p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
          if (e4m3) {
            p.vt = vt;
            p.q_descale = p.k_descale = p.v_descale = desc;
          }
          p.batch = batch; p.heads_q = p.heads_kv = heads; p.seq_q = sq; p.seq_k = n; p.head_dim = d;
          p.align = !causal ? flashlab::CausalAlign::None
                    : sq < n ? flashlab::CausalAlign::BottomRight : flashlab::CausalAlign::TopLeft;
          p.scale = 1.0f / std::sqrt(static_cast<float>(d));
          p.scale_log2 = p.scale * 1.4426950408889634f;
          p.tile_counter = counter;
          check(cudaDeviceSynchronize(), "inputs");
          const double flops = flashlab::forward_flops(
              flashlab::Shape{.batch = batch, .heads_q = heads, .heads_kv = heads, .seq_q = sq, .seq_k = n, .head_dim = d},
              p.align);
          std::vector<__nv_bfloat16> first(elems), mine(elems);
          bool have_first = false;
          cudaEvent_t e0, e1;
          check(cudaEventCreate(&e0), "event");
          check(cudaEventCreate(&e1), "event");
          for (const Candidate& c : kCandidates) {
            if (c.e4m3 != e4m3 || c.d != d) continue;
            Params pc = p;
            if (c.vt_smem) pc.vt = nullptr;  // it must not need the scratch
            check(cudaMemset(o, 0xff, elems * sizeof(__nv_bfloat16)), "poison O");  // NaN: an unwritten O fails
            std::vector<float> ms;
            for (int r = 0; r < 18; ++r) {
              check(cudaEventRecord(e0), "record");
              c.launch(pc, 0);
              check(cudaEventRecord(e1), "record");
              check(cudaEventSynchronize(e1), c.name);
              float t = 0;
              check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
              if (r >= 3) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const double tflops = flops / (ms[ms.size() / 2] * 1e-3) / 1e12;
            check(cudaMemcpy(mine.data(), o, elems * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost), "download");
            double max_diff = 0;
            bool finite = true;
            for (std::size_t i = 0; i < elems; ++i) {
              const float x = __bfloat162float(mine[i]);
              if (!std::isfinite(x)) finite = false;
              if (have_first) max_diff = std::max(max_diff, double(std::fabs(x - __bfloat162float(first[i]))));
            }
            if (!have_first) { first = mine; have_first = true; }
            // O of these inputs is an average of values in (-1, 1) with |O| well below 0.1 past the first rows: 0.02 is
            // several steps of P's rounding away from any honest difference, and far below a wrong block's.
            const bool ok = finite && max_diff <= 0.02;
            failures += ok ? 0 : 1;
            std::printf("%-24s %4s %4d %6d %7s %10.1f %10.2e %s%s\n", c.name, e4m3 ? "e4m3" : "bf16", d, n,
                        causal ? "yes" : "no", tflops, max_diff, c.what, ok ? "" : "   <-- FAILED");
            std::fflush(stdout);
          }
          cudaEventDestroy(e0);
          cudaEventDestroy(e1);
          for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)vt, (void*)o, (void*)lse, (void*)desc, (void*)counter})
            cudaFree(ptr);
        }
      }
    }
  }
  std::printf("RESULT %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
