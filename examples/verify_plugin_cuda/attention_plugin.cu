/* A small CUDA attention kernel as a `flashlab verify` plugin on device memory (include/flashlab/plugin.h,
 * FLASHLAB_MEMORY_CUDA): the CPU example (examples/verify_plugin_cpu/attention_plugin.c) moved to the GPU, one
 * warp per row, written to be read and copied rather than to be fast.
 *
 * Forward: one warp per query row (b, h, i). The 32 lanes split the head dim (lane l holds elements l, l + 32,
 * ...), so a dot product is each lane's partial sum and a warp reduction. Keys come in blocks of kKeyBlock: the
 * block's scores S_ij go to shared memory, then the online softmax: a running max m_i, a running sum l_i and an
 * accumulator O_i, rescaled whenever the max moves. Arithmetic is f32 whatever the inputs' type (f32, f16, bf16).
 * Backward: P_ij recomputed from the LSE L_i. One warp per query row for dQ, and one warp per key row of a K/V
 * head for dK and dV, which sum over the query heads of that head's group (GQA), each over the pairs the mask keeps.
 *
 * Built with -DFLASHLAB_PLANTED_BUG=BUG_xxx, the same source becomes a kernel with one planted bug, which verify
 * must catch: the CPU example's bugs, planted in the same places. Each bug is one marked `#if` below.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <flashlab/plugin.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>

#define BUG_NONE 0
#define BUG_MASK 1       /* the causal mask is ignored */
#define BUG_ALIGNMENT 2  /* bottom-right causal is treated as top-left */
#define BUG_TAIL 3       /* the last partial key block is skipped */
#define BUG_RESCALE 4    /* O_i is not rescaled when the running max moves */
#define BUG_LSE_BASE2 5  /* the LSE is written in base 2 */
#define BUG_GROUP_SUM 6  /* GQA: dK, dV of a K/V head hold one query head's share, not the group's sum */
#define BUG_SCALE 7      /* the scale is 1 / head_dim, not problem->scale */

#ifndef FLASHLAB_PLANTED_BUG
#define FLASHLAB_PLANTED_BUG BUG_NONE
#endif

#if FLASHLAB_PLANTED_BUG == BUG_NONE
#define KERNEL_NAME "example-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_MASK
#define KERNEL_NAME "planted-mask-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_ALIGNMENT
#define KERNEL_NAME "planted-alignment-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_TAIL
#define KERNEL_NAME "planted-tail-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_RESCALE
#define KERNEL_NAME "planted-rescale-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_LSE_BASE2
#define KERNEL_NAME "planted-lse-base2-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_GROUP_SUM
#define KERNEL_NAME "planted-group-sum-cuda"
#elif FLASHLAB_PLANTED_BUG == BUG_SCALE
#define KERNEL_NAME "planted-scale-cuda"
#else
#error "FLASHLAB_PLANTED_BUG names no known bug"
#endif

namespace {

constexpr int kWarpSize = 32;
constexpr int kKeyBlock = 64;                         // keys per block of the online softmax (as the CPU example)
constexpr int kMaxHeadDim = 256;                      // the largest head dim the plugin ABI's problems have
constexpr int kDimsPerLane = kMaxHeadDim / kWarpSize;  // head-dim elements each lane holds: 8
constexpr int kWarpsPerBlock = 4;                     // rows per thread block
constexpr unsigned kFullWarp = 0xffffffffu;

// ---- plain helpers ----------------------------------------------------------------------------------------

// Writes one sentence into message, if there is room for any.
void say(char* message, size_t message_size, const char* format, ...) {
  if (message == nullptr || message_size == 0) return;
  va_list ap;
  va_start(ap, format);
  vsnprintf(message, message_size, format, ap);
  va_end(ap);
}

const char* dtype_name(flashlab_dtype dtype) {
  switch (dtype) {
    case FLASHLAB_DTYPE_F32: return "f32";
    case FLASHLAB_DTYPE_F16: return "f16";
    case FLASHLAB_DTYPE_BF16: return "bf16";
  }
  return "an unknown type";
}

// 0 if this kernel runs the problem, else nonzero and why.
int check_problem(const flashlab_problem* p, char* message, size_t message_size) {
  if (p->dtype != FLASHLAB_DTYPE_F32 && p->dtype != FLASHLAB_DTYPE_F16 && p->dtype != FLASHLAB_DTYPE_BF16) {
    say(message, message_size, "this example kernel takes f32, f16 or bf16, not %s", dtype_name(p->dtype));
    return 1;
  }
  if (p->head_dim < 1 || p->head_dim > kMaxHeadDim) {
    say(message, message_size, "this example kernel takes head dims 1 to %d (8 elements per lane), not %d", kMaxHeadDim,
        p->head_dim);
    return 1;
  }
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0) {
    say(message, message_size, "H_q (%d) is not a multiple of H_kv (%d)", p->heads_q, p->heads_kv);
    return 1;
  }
  return 0;
}

// 0 if the launch just made went in, else 1 and a sentence naming the kernel and CUDA's error. (An error raised
// while the kernel runs surfaces when verify synchronizes the stream.)
int launched(const char* kernel, char* message, size_t message_size) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return 0;
  say(message, message_size, "launching the %s kernel failed: %s (%s)", kernel, cudaGetErrorName(status),
      cudaGetErrorString(status));
  return 1;
}

// ---- device helpers -----------------------------------------------------------------------------------------

// Elements are read and written as f32 whatever their type.
__device__ float to_float(float x) { return x; }
__device__ float to_float(__half x) { return __half2float(x); }
__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ T from_float(float x);
template <>
__device__ float from_float<float>(float x) { return x; }
template <>
__device__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The sum of x over the warp, in every lane.
__device__ float warp_sum(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

// Row (b, s, h) of a (B, S, H, D) tensor; its element d is row[d * st.d].
template <class T>
__device__ T* row_at(T* t, flashlab_strides st, int b, int s, int h) {
  return t + b * st.b + s * st.s + h * st.h;
}

// This lane's share of a row: elements lane, lane + 32, ... below D, as f32 (0 past D).
template <class T>
__device__ void load_row(float (&x)[kDimsPerLane], const T* row, int64_t step, int D, int lane) {
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    x[t] = d < D ? to_float(row[d * step]) : 0.0f;
  }
}
template <class T>
__device__ void store_row(T* row, int64_t step, const float (&x)[kDimsPerLane], float factor, int D, int lane) {
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    if (d < D) row[d * step] = from_float<T>(x[t] * factor);
  }
}
// x . row over the head dim: this lane's partial sum, then the warp's.
template <class T>
__device__ float dot(const float (&x)[kDimsPerLane], const T* row, int64_t step, int D, int lane) {
  float sum = 0.0f;
#pragma unroll
  for (int t = 0; t < kDimsPerLane; ++t) {
    const int d = lane + t * kWarpSize;
    if (d < D) sum += x[t] * to_float(row[d * step]);
  }
  return warp_sum(sum);
}

// The softmax scale.
__device__ float softmax_scale(const flashlab_problem& p) {
#if FLASHLAB_PLANTED_BUG == BUG_SCALE
  return 1.0f / (float)p.head_dim; /* planted: ignores problem->scale, uses 1 / head_dim */
#else
  return (float)p.scale;
#endif
}

// Query i sees keys 0 .. end-1; this returns end (0: the row sees no key). Every mask here is a prefix.
__device__ int key_end(const flashlab_problem& p, int i) {
  flashlab_causal causal = p.causal;
  int end = p.seq_k;
#if FLASHLAB_PLANTED_BUG == BUG_MASK
  causal = FLASHLAB_CAUSAL_NONE; /* planted: ignores the causal mask, every key is visible */
#endif
#if FLASHLAB_PLANTED_BUG == BUG_TAIL
  if (p.seq_k >= kKeyBlock) end = p.seq_k / kKeyBlock * kKeyBlock; /* planted: whole blocks only, the tail is dropped */
#endif
  int last = end; /* one past the last key the mask lets through */
  if (causal == FLASHLAB_CAUSAL_TOP_LEFT) {
    last = i + 1;
  } else if (causal == FLASHLAB_CAUSAL_BOTTOM_RIGHT) {
#if FLASHLAB_PLANTED_BUG == BUG_ALIGNMENT
    last = i + 1; /* planted: bottom-right aligned like top-left, the S_k - S_q offset dropped */
#else
    last = i + 1 + p.seq_k - p.seq_q;
#endif
  }
  if (last < end) end = last;
  return end > 0 ? end : 0;
}

// ---- the forward ----------------------------------------------------------------------------------------------

// Grid (ceil(S_q / kWarpsPerBlock), H_q, B); warp w of a block computes O_i and L_i of query row
// i = blockIdx.x * kWarpsPerBlock + w of head blockIdx.y of batch blockIdx.z.
template <class T>
__global__ void forward_kernel(flashlab_problem p, flashlab_forward_args a) {
  __shared__ float scores[kWarpsPerBlock][kKeyBlock];  // each warp's S_ij, then P_ij, for one block of keys
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int i = blockIdx.x * kWarpsPerBlock + warp, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;  // the whole warp: every lane has the same row
  const int D = p.head_dim, hk = h / (p.heads_q / p.heads_kv);  // hk: the K/V head this query head reads
  const float scale = softmax_scale(p);
  const T* K = static_cast<const T*>(a.k);
  const T* V = static_cast<const T*>(a.v);
  float* s = scores[warp];

  float q[kDimsPerLane], acc[kDimsPerLane];  // this lane's share of Q_i and of O_i (unnormalized)
  load_row(q, row_at(static_cast<const T*>(a.q), a.q_strides, b, i, h), a.q_strides.d, D, lane);
  for (float& x : acc) x = 0.0f;
  float m = -INFINITY, l = 0.0f;  // running max m_i and running sum l_i, the same in every lane
  const int end = key_end(p, i);

  for (int j0 = 0; j0 < end; j0 += kKeyBlock) {
    const int j1 = min(j0 + kKeyBlock, end);
    // S_ij = scale * Q_i . K_j for the block's keys, and the new max.
    float m_new = m;
    for (int j = j0; j < j1; ++j) {
      const float sij = scale * dot(q, row_at(K, a.k_strides, b, j, hk), a.k_strides.d, D, lane);
      if (lane == 0) s[j - j0] = sij;
      m_new = fmaxf(m_new, sij);
    }
    __syncwarp();
    // The max moved: what l_i and O_i hold was weighted by exp(-m_old), now by exp(-m_new).
    if (m_new > m) {
      const float alpha = expf(m - m_new); /* 0 on the first block, where m = -inf */
      l *= alpha;
#if FLASHLAB_PLANTED_BUG != BUG_RESCALE /* planted: rescales l_i but not O_i */
      for (float& x : acc) x *= alpha;
#endif
      m = m_new;
    }
    // P_ij = exp(S_ij - m_i): add it to l_i, and P_ij V_j to O_i.
    for (int j = j0; j < j1; ++j) {
      const float pij = expf(s[j - j0] - m);
      l += pij;
      const T* v = row_at(V, a.v_strides, b, j, hk);
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) {
        const int d = lane + t * kWarpSize;
        if (d < D) acc[t] += pij * to_float(v[d * a.v_strides.d]);
      }
    }
    __syncwarp();  // every lane has read s before lane 0 writes the next block's scores
  }

  // O_i = acc / l_i and L_i = m_i + log(l_i); a row that sees no key gets O_i = 0, L_i = -inf.
  store_row(row_at(static_cast<T*>(a.o), a.o_strides, b, i, h), a.o_strides.d, acc, end > 0 ? 1.0f / l : 0.0f, D, lane);
  if (a.lse != nullptr && lane == 0) {
    float lse = end > 0 ? m + logf(l) : -INFINITY;
#if FLASHLAB_PLANTED_BUG == BUG_LSE_BASE2
    lse = lse / logf(2.0f); /* planted: writes the LSE in base 2 */
#endif
    a.lse[((int64_t)b * p.heads_q + h) * p.seq_q + i] = lse;
  }
}

// ---- the backward ---------------------------------------------------------------------------------------------
// With P_ij = exp(scale Q_i . K_j - L_i), dP_ij = dO_i . V_j and D_i = dO_i . O_i:
//   dS_ij = P_ij (dP_ij - D_i),  dQ_i = scale sum_j dS_ij K_j,  dK_j = scale sum_i dS_ij Q_i,  dV_j = sum_i P_ij dO_i.

// Grid (ceil(S_q / kWarpsPerBlock), H_q, B): one warp per query row i of head h, summing over the keys it sees.
template <class T>
__global__ void dq_kernel(flashlab_problem p, flashlab_backward_args a) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int i = blockIdx.x * kWarpsPerBlock + warp, h = blockIdx.y, b = blockIdx.z;
  if (i >= p.seq_q) return;
  const int D = p.head_dim, hk = h / (p.heads_q / p.heads_kv);
  const float scale = softmax_scale(p);
  const flashlab_strides qs = a.q_strides, ks = a.k_strides, vs = a.v_strides, os = a.o_strides;

  float q[kDimsPerLane], d_o[kDimsPerLane], o[kDimsPerLane], dq[kDimsPerLane];
  load_row(q, row_at(static_cast<const T*>(a.q), qs, b, i, h), qs.d, D, lane);
  load_row(d_o, row_at(static_cast<const T*>(a.d_o), os, b, i, h), os.d, D, lane);  // d_o is addressed like o
  load_row(o, row_at(static_cast<const T*>(a.o), os, b, i, h), os.d, D, lane);
  for (float& x : dq) x = 0.0f;
  float Di = 0.0f;  // D_i = dO_i . O_i
  for (int t = 0; t < kDimsPerLane; ++t) Di += d_o[t] * o[t];
  Di = warp_sum(Di);
  const float lse = a.lse[((int64_t)b * p.heads_q + h) * p.seq_q + i];
  const int end = lse == -INFINITY ? 0 : key_end(p, i);  // L_i = -inf: the row saw no key

  for (int j = 0; j < end; ++j) {
    const T* k = row_at(static_cast<const T*>(a.k), ks, b, j, hk);
    const float pij = expf(scale * dot(q, k, ks.d, D, lane) - lse);
    const float dpij = dot(d_o, row_at(static_cast<const T*>(a.v), vs, b, j, hk), vs.d, D, lane);
    const float dsij = pij * (dpij - Di);
#pragma unroll
    for (int t = 0; t < kDimsPerLane; ++t) {
      const int d = lane + t * kWarpSize;
      if (d < D) dq[t] += scale * dsij * to_float(k[d * ks.d]);
    }
  }
  store_row(row_at(static_cast<T*>(a.dq), qs, b, i, h), qs.d, dq, 1.0f, D, lane);
}

// Grid (ceil(S_k / kWarpsPerBlock), H_kv, B): one warp per key row j of K/V head hk, summing over every query row
// of every query head of hk's group that sees key j. A key no query sees gets dK_j = dV_j = 0.
template <class T>
__global__ void dk_dv_kernel(flashlab_problem p, flashlab_backward_args a) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int j = blockIdx.x * kWarpsPerBlock + warp, hk = blockIdx.y, b = blockIdx.z;
  if (j >= p.seq_k) return;
  const int D = p.head_dim, group = p.heads_q / p.heads_kv;
  const float scale = softmax_scale(p);
  const flashlab_strides qs = a.q_strides, ks = a.k_strides, vs = a.v_strides, os = a.o_strides;

  float k[kDimsPerLane], v[kDimsPerLane], dk[kDimsPerLane], dv[kDimsPerLane];
  load_row(k, row_at(static_cast<const T*>(a.k), ks, b, j, hk), ks.d, D, lane);
  load_row(v, row_at(static_cast<const T*>(a.v), vs, b, j, hk), vs.d, D, lane);
  for (int t = 0; t < kDimsPerLane; ++t) dk[t] = dv[t] = 0.0f;

  for (int h = hk * group; h < (hk + 1) * group; ++h) {  // the query heads that read K/V head hk
#if FLASHLAB_PLANTED_BUG == BUG_GROUP_SUM
    for (int t = 0; t < kDimsPerLane; ++t) dk[t] = dv[t] = 0.0f; /* planted: each query head restarts the sums */
#endif
    for (int i = 0; i < p.seq_q; ++i) {
      const float lse = a.lse[((int64_t)b * p.heads_q + h) * p.seq_q + i];
      if (lse == -INFINITY || j >= key_end(p, i)) continue;  // query i does not see key j
      const T* q = row_at(static_cast<const T*>(a.q), qs, b, i, h);
      const T* d_o = row_at(static_cast<const T*>(a.d_o), os, b, i, h);
      const T* o = row_at(static_cast<const T*>(a.o), os, b, i, h);
      const float pij = expf(scale * dot(k, q, qs.d, D, lane) - lse);
      const float dpij = dot(v, d_o, os.d, D, lane);
      // D_i = dO_i . O_i, computed again for every key: simple, and the backward stays two kernels.
      float Di = 0.0f;
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) {
        const int d = lane + t * kWarpSize;
        if (d < D) Di += to_float(d_o[d * os.d]) * to_float(o[d * os.d]);
      }
      const float dsij = pij * (dpij - warp_sum(Di));
#pragma unroll
      for (int t = 0; t < kDimsPerLane; ++t) {
        const int d = lane + t * kWarpSize;
        if (d < D) {
          dv[t] += pij * to_float(d_o[d * os.d]);
          dk[t] += scale * dsij * to_float(q[d * qs.d]);
        }
      }
    }
  }
  store_row(row_at(static_cast<T*>(a.dk), ks, b, j, hk), ks.d, dk, 1.0f, D, lane);
  store_row(row_at(static_cast<T*>(a.dv), vs, b, j, hk), vs.d, dv, 1.0f, D, lane);
}

// ---- the plugin's entry points ------------------------------------------------------------------------------

// Thread blocks of kWarpsPerBlock warps, one row each: `rows` rows of each (head, batch) pair.
dim3 grid_for(int rows, int heads, int batch) {
  return dim3((unsigned)((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), (unsigned)heads, (unsigned)batch);
}
constexpr int kThreads = kWarpsPerBlock * kWarpSize;

template <class T>
int launch_forward(const flashlab_problem* p, const flashlab_forward_args* a, char* message, size_t message_size) {
  cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
  forward_kernel<T><<<grid_for(p->seq_q, p->heads_q, p->batch), kThreads, 0, stream>>>(*p, *a);
  return launched("forward", message, message_size);
}

template <class T>
int launch_backward(const flashlab_problem* p, const flashlab_backward_args* a, char* message, size_t message_size) {
  cudaStream_t stream = static_cast<cudaStream_t>(a->stream);
  dq_kernel<T><<<grid_for(p->seq_q, p->heads_q, p->batch), kThreads, 0, stream>>>(*p, *a);
  if (launched("dQ", message, message_size) != 0) return 1;
  dk_dv_kernel<T><<<grid_for(p->seq_k, p->heads_kv, p->batch), kThreads, 0, stream>>>(*p, *a);
  return launched("dK/dV", message, message_size);
}

int supports(const flashlab_problem* problem, char* message, size_t message_size) {
  return check_problem(problem, message, message_size);
}

// The kernels are launched on args->stream, the stream verify gives, and the calls return without waiting for
// them: the caller synchronizes that stream.
int forward(const flashlab_problem* p, const flashlab_forward_args* a, char* message, size_t message_size) {
  if (check_problem(p, message, message_size) != 0) return 1;
  switch (p->dtype) {
    case FLASHLAB_DTYPE_F16: return launch_forward<__half>(p, a, message, message_size);
    case FLASHLAB_DTYPE_BF16: return launch_forward<__nv_bfloat16>(p, a, message, message_size);
    default: return launch_forward<float>(p, a, message, message_size);
  }
}

int backward(const flashlab_problem* p, const flashlab_backward_args* a, char* message, size_t message_size) {
  if (check_problem(p, message, message_size) != 0) return 1;
  if (a->lse == nullptr) {
    say(message, message_size, "the backward needs the forward's LSE");
    return 1;
  }
  switch (p->dtype) {
    case FLASHLAB_DTYPE_F16: return launch_backward<__half>(p, a, message, message_size);
    case FLASHLAB_DTYPE_BF16: return launch_backward<__nv_bfloat16>(p, a, message, message_size);
    default: return launch_backward<float>(p, a, message, message_size);
  }
}

const flashlab_attention_plugin kPlugin = {
    FLASHLAB_PLUGIN_ABI_VERSION,  // abi_version
    KERNEL_NAME,                  // name
    FLASHLAB_MEMORY_CUDA,         // memory: q, k, v, o, lse, ... are device pointers
    1,                            // writes_lse
    supports,
    forward,
    backward,
};

}  // namespace

extern "C" const flashlab_attention_plugin* flashlab_plugin(void) { return &kPlugin; }
