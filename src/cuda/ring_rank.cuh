#pragma once
// One rank of ring attention on a GPU: what it keeps, and what it computes at a step with the K/V share in
// hand. Nothing here moves data between ranks: a transport does (ring.cu: the P ranks of one GPU as streams,
// shares moved by device-to-device copies). Each rank keeps its own tokens packed range by range (one range
// for contiguous and striped, two for zigzag), each range a (B, count, H, D) tensor, so that a block kernel
// sees every range as an ordinary problem of `count` tokens; the K/V share it holds is packed the same way.
//
//   ForwardRank   Q, two K/V slots, the running fp32 (O, L); step() folds each pair's forward (O_b, L_b) into
//                 (O, L) with the logsumexp merge (core/logsumexp.hpp, as the CPU reference merges)
//   BackwardRank  Q, O, dO, L of its queries, two K/V slots, dQ's fp32 sum, and the travelling dK/dV partial
//                 sums of the share in hand (fp32: they add P terms); step() adds each pair's backward into dQ
//                 and the partials (the kernel's accumulate mode, one rounding to the input dtype at the end)
// Each pair is one launch (or one a batch) of the block kernel, cuda-fa3-ws or cuda-fa2 (BlockKernel).
//
// Packed offsets: a pair's queries start at row q_offset of the rank's packed tokens, so its (B, m, H, D) block
// starts at element B * q_offset * H * D (and its L at B * H * q_offset); the same for keys with k_offset.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/logsumexp.hpp"
#include "core/problem.hpp"
#include "cuda/common.cuh"
#include "cuda/fa2_launch.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/ring.hpp"
#include "model/ring.hpp"

namespace flashlab::cuda::ring {

namespace fa2 = ::flashlab::cuda::fa2;

// Everything here is internal to each .cu file that includes it (the kernels especially): each transport has its own copy.
namespace {

// ---- kernels: packing, merging, unpacking (one thread an element or a 16-byte vector) ---------------------

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

// dst (B, count, row) <- the rows token(0..count) of src (B, S, row); 16-byte vectors, row_vecs a row.
__global__ void gather_rows_kernel(uint4* dst, const uint4* src, int batch, int seq, int row_vecs, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, a, vec)
  if (i >= std::int64_t(batch) * range.count * row_vecs) return;
  const int vec = static_cast<int>(i % row_vecs);
  const std::int64_t row = i / row_vecs;
  const int a = static_cast<int>(row % range.count), b = static_cast<int>(row / range.count);
  dst[i] = src[(std::int64_t(b) * seq + range.token(a)) * row_vecs + vec];
}

// dst (B, H, count) <- src (B, H, S) at the tokens of the range: an L of packed queries.
__global__ void gather_lse_kernel(float* dst, const float* src, int batch, int heads, int seq, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, h, a)
  if (i >= std::int64_t(batch) * heads * range.count) return;
  const int a = static_cast<int>(i % range.count);
  const std::int64_t bh = i / range.count;
  dst[i] = src[bh * seq + range.token(a)];
}

// The rows token(0..count) of dst (B, S, row) in T <- src (B, count, row) in fp32.
template <class T>
__global__ void scatter_rows_kernel(T* dst, const float* src, int batch, int seq, std::int64_t row_elems, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, a, element)
  if (i >= std::int64_t(batch) * range.count * row_elems) return;
  const std::int64_t row = i / row_elems, within = i % row_elems;
  const int a = static_cast<int>(row % range.count), b = static_cast<int>(row / range.count);
  dst[(std::int64_t(b) * seq + range.token(a)) * row_elems + within] = static_cast<T>(src[i]);
}

// dst (B, H, S) at the tokens of the range <- src (B, H, count).
__global__ void scatter_lse_kernel(float* dst, const float* src, int batch, int heads, int seq, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, h, a)
  if (i >= std::int64_t(batch) * heads * range.count) return;
  const int a = static_cast<int>(i % range.count);
  dst[i / range.count * seq + range.token(a)] = src[i];
}

// The running (O, L) of a range's rows, fp32 (B, count, H, D) and (B, H, count), folded with a block's (O_b in T,
// L_b) as the CPU reference folds them (core/logsumexp.hpp): O += sigmoid(L_b - L) (O_b - O), L = log(e^L + e^L_b).
// A row with L = -inf takes the block's, a block row with L_b = -inf changes nothing. One warp per (b, a, h) row,
// 8 columns a lane.
template <class T>
__global__ void merge_block_kernel(float* o, float* l, const T* o_b, const float* l_b, int batch, int count, int heads,
                                   int head_dim) {
  const std::int64_t row = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // over (b, a, h)
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= std::int64_t(batch) * count * heads) return;
  const int h = static_cast<int>(row % heads);
  const int a = static_cast<int>(row / heads % count), b = static_cast<int>(row / heads / count);
  const std::int64_t at_l = (std::int64_t(b) * heads + h) * count + a;
  const float l_run = l[at_l], l_blk = l_b[at_l];
  if (l_blk == -INFINITY) return;
  // The block's weight, 1 when the row has seen nothing yet.
  const float w = l_run == -INFINITY ? 1.f : stable_sigmoid(l_blk - l_run);
  for (int c = lane * 8; c < head_dim; c += 32 * 8) {
    float* out = o + row * head_dim + c;
    const T* in = o_b + row * head_dim + c;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] += w * (static_cast<float>(in[e]) - out[e]);
  }
  if (lane == 0) l[at_l] = l_run == -INFINITY ? l_blk : log_add_exp(l_run, l_blk);
}

// dst = src in T, n elements.
template <class T>
__global__ void to_element_type_kernel(T* dst, const float* src, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = static_cast<T>(src[i]);
}

// sum += x, n floats, a float4 a thread (n a multiple of 4: rows of head_dim >= 64).
__global__ void add_kernel(float4* sum, const float4* x, std::int64_t n4) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const float4 a = sum[i], b = x[i];
  sum[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__global__ void fill_kernel(float* x, std::int64_t n, float value) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

// ---- ordering ------------------------------------------------------------------------------------------------

// Events that order a ring's streams (a transport's: which copy or message may start), recorded again at every
// run, each before anything of that run waits on it.
struct Events {
  std::vector<cudaEvent_t> at;
  explicit Events(int n) : at(n) {
    for (cudaEvent_t& e : at) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~Events() {
    for (cudaEvent_t e : at) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// Where a transport may record events inside a forward step (ring_nccl.cu's timeline): on the step's stream
// before a pair's block kernel, between it and the merge that folds it in, and after that merge.
enum class PairMark { BlockBegin, BlockEnd, MergeEnd };
using PairMarker = std::function<void(std::size_t pair, PairMark)>;

// ---- the rank ----------------------------------------------------------------------------------------------

// Where each range of a rank's packed tokens starts, in tokens (ranges in order).
std::vector<int> range_starts(const std::vector<TokenRange>& ranges) {
  std::vector<int> starts;
  int at = 0;
  for (const TokenRange& r : ranges) {
    starts.push_back(at);
    at += r.count;
  }
  return starts;
}

int largest_range(const std::vector<TokenRange>& ranges) {
  int largest = 0;
  for (const TokenRange& r : ranges) largest = std::max(largest, r.count);
  return largest;
}

int largest_share(const RingSchedule& ring) {
  int largest = 0;
  for (int origin = 0; origin < ring.ranks; ++origin) largest = std::max(largest, ring.kv_tokens(origin));
  return largest;
}

// How every pair of every step runs on a block kernel ([step][rank][pair]), made before any work so that a
// refusal (block_launch's) comes first.
using LaunchPlans = std::vector<std::vector<std::vector<BlockLaunch>>>;
LaunchPlans launch_plans(const RingSchedule& ring) {
  LaunchPlans plans(ring.ranks, std::vector<std::vector<BlockLaunch>>(ring.ranks));
  for (int step = 0; step < ring.ranks; ++step)
    for (int r = 0; r < ring.ranks; ++r)
      for (const BlockPair& pair : ring.steps[step][r].pairs) plans[step][r].push_back(block_launch(pair));
  return plans;
}

// Elements per token: a query row (H_q D) and a key row (H_kv D).
struct RowElems {
  std::int64_t q = 0, kv = 0;
  explicit RowElems(const Shape& s) : q(std::int64_t(s.heads_q) * s.head_dim), kv(std::int64_t(s.heads_kv) * s.head_dim) {}
};

// Packs the tokens of `ranges` of the global (B, S, row) tensor src into dst, range after range.
template <class T>
void pack_rows(T* dst, const void* src, int batch, int seq, std::int64_t row_elems, const std::vector<TokenRange>& ranges,
               cudaStream_t st) {
  const int row_vecs = static_cast<int>(row_elems * sizeof(T) / 16);
  const std::vector<int> at = range_starts(ranges);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    gather_rows_kernel<<<blocks_for(std::int64_t(batch) * ranges[i].count * row_vecs), kThreads, 0, st>>>(
        reinterpret_cast<uint4*>(dst + std::int64_t(batch) * at[i] * row_elems), static_cast<const uint4*>(src), batch,
        seq, row_vecs, ranges[i]);
    CUDA_CHECK_LAUNCH();
  }
}

// Writes the packed fp32 rows src back to the tokens of `ranges` of the global (B, S, row) dst, in T.
template <class T>
void unpack_rows(void* dst, const float* src, int batch, int seq, std::int64_t row_elems,
                 const std::vector<TokenRange>& ranges, cudaStream_t st) {
  const std::vector<int> at = range_starts(ranges);
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    scatter_rows_kernel<T><<<blocks_for(std::int64_t(batch) * ranges[i].count * row_elems), kThreads, 0, st>>>(
        static_cast<T*>(dst), src + std::int64_t(batch) * at[i] * row_elems, batch, seq, row_elems, ranges[i]);
    CUDA_CHECK_LAUNCH();
  }
}

// A pair's block of packed rows: its first element and, for launches of one batch each, the batch stride.
struct PairRows {
  std::int64_t at = 0, batch_stride = 0;
};
PairRows pair_rows(int batch, int offset, int count, std::int64_t row_elems) {
  return {std::int64_t(batch) * offset * row_elems, std::int64_t(count) * row_elems};
}

// The block kernel's parameters that every pair shares: the problem's extents, scale and alignment.
struct BlockKernel {
  RingBlockKernel kernel = RingBlockKernel::Fa3Ws;
  fa3_ws::Params fa3;
  fa2::Params fa2;
  BlockKernel(RingBlockKernel k, const Problem& p) : kernel(k) {
    set_extents(fa3, p.shape);
    set_softmax_and_dropout(fa3, p);
    set_extents(fa2, p.shape);
    set_softmax_and_dropout(fa2, p);
  }
};

// A pair on the block kernel: one launch, or one a batch when its keys are a prefix of the range (each batch's
// keys are then a prefix of that batch's rows). `launch(prm, b)` fills in the batch's pointers and launches; prm
// is the kernel's own Params, whose tensor fields share their names.
template <class Params, class Launch>
void for_each_launch(const Params& base, const BlockPair& pair, const BlockLaunch& plan, int batch, Launch launch) {
  Params prm = base;
  prm.align = plan.align;
  prm.seq_q = pair.q.count;
  prm.seq_k = plan.keys;
  const int launches = plan.keys < pair.k.count ? batch : 1;
  prm.batch = batch / launches;
  for (int b = 0; b < launches; ++b) launch(prm, b);
}

template <class T>
struct ForwardRank {
  DeviceBuffer<T> q;                       // its query tokens, packed by range
  DeviceBuffer<T> k[2], v[2];              // two slots: the K/V share in hand and the one arriving
  DeviceBuffer<float> o_run, l_run;        // running O (B, tokens, H, D) and L (B, H, tokens) per range, packed
  DeviceBuffer<T> o_blk;                   // a block's O and L, the largest range's size
  DeviceBuffer<float> l_blk;
  DeviceBuffer<int> tile_counter;          // cuda-fa3-ws's persistent grid: one per stream that launches it

  ForwardRank(const RingSchedule& ring, int rank, const Shape& s, RingBlockKernel kernel) {
    const RowElems row(s);
    const std::size_t B = s.batch, tokens = ring.q_tokens(rank), largest = largest_range(ring.q_ranges[rank]);
    q = DeviceBuffer<T>(B * tokens * row.q);
    for (int slot = 0; slot < 2; ++slot) {
      k[slot] = DeviceBuffer<T>(B * largest_share(ring) * row.kv);
      v[slot] = DeviceBuffer<T>(B * largest_share(ring) * row.kv);
    }
    o_run = DeviceBuffer<float>(B * tokens * row.q);
    l_run = DeviceBuffer<float>(B * s.heads_q * tokens);
    o_blk = DeviceBuffer<T>(B * largest * row.q);
    l_blk = DeviceBuffer<float>(B * s.heads_q * largest);
    if (kernel == RingBlockKernel::Fa3Ws) {
      tile_counter = DeviceBuffer<int>(2);
      zero(tile_counter);
    }
  }

  // Its queries and its own K/V share (into slot 0) from the global tensors; (O, L) = (0, -inf).
  void pack(const RingSchedule& ring, int rank, const Shape& s, const DeviceForwardIo& io, cudaStream_t st) {
    const RowElems row(s);
    pack_rows(q.data(), io.q, s.batch, s.seq_q, row.q, ring.q_ranges[rank], st);
    pack_rows(k[0].data(), io.k, s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
    pack_rows(v[0].data(), io.v, s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
    reset(st);
  }

  // (O, L) = (0, -inf): the running result before the first block.
  void reset(cudaStream_t st) {
    CUDA_CHECK(cudaMemsetAsync(o_run.data(), 0, o_run.bytes(), st));
    fill_kernel<<<blocks_for(l_run.size()), kThreads, 0, st>>>(l_run.data(), l_run.size(), -INFINITY);
    CUDA_CHECK_LAUNCH();
  }

  // Timed runs with no global tensors (ring_nccl.cu): random queries and K/V slots (both, whole), made in place;
  // then reset() before each pass. The slots keep whatever shares a pass leaves in them, which changes values, not
  // the work. (On the legacy stream: synchronize before use.)
  void fill_random(int rank) {
    const std::uint64_t seed = 8 * std::uint64_t(rank);
    cuda::fill_random(q, seed + 1);
    for (int slot = 0; slot < 2; ++slot) {
      cuda::fill_random(k[slot], seed + 2 + slot);
      cuda::fill_random(v[slot], seed + 4 + slot);
    }
  }

  // Its queries against the share in slot `slot`, pair by pair, each folded into (O, L); `mark`, if given, at
  // each PairMark of a pair that runs.
  void step(const RankStep& rs, const std::vector<BlockLaunch>& plans, int slot, const BlockKernel& base, const Shape& s,
            DType dtype, cudaStream_t st, const PairMarker& mark = {}) {
    const RowElems row(s);
    const int B = s.batch, H = s.heads_q;
    for (std::size_t i = 0; i < rs.pairs.size(); ++i) {
      const BlockPair& pair = rs.pairs[i];
      if (plans[i].skip) continue;
      const PairRows qr = pair_rows(B, pair.q_offset, pair.q.count, row.q);
      const PairRows kr = pair_rows(B, pair.k_offset, pair.k.count, row.kv);
      const int m = pair.q.count;
      const auto tensors = [&](auto& prm, int b) {
        prm.q = q.data() + qr.at + b * qr.batch_stride;
        prm.k = k[slot].data() + kr.at + b * kr.batch_stride;
        prm.v = v[slot].data() + kr.at + b * kr.batch_stride;
        prm.o = o_blk.data() + b * qr.batch_stride;
        prm.lse = l_blk.data() + std::int64_t(b) * H * m;
      };
      if (mark) mark(i, PairMark::BlockBegin);
      if (base.kernel == RingBlockKernel::Fa2) {
        for_each_launch(base.fa2, pair, plans[i], B, [&](fa2::Params prm, int b) {
          tensors(prm, b);
          fa2::launch_forward(dtype, prm, st);
        });
      } else {
        for_each_launch(base.fa3, pair, plans[i], B, [&](fa3_ws::Params prm, int b) {
          tensors(prm, b);
          prm.tile_counter = tile_counter.data();
          fa3_ws::launch_forward(dtype, prm, st);
        });
      }
      if (mark) mark(i, PairMark::BlockEnd);
      merge_block_kernel<T><<<blocks_for(std::int64_t(B) * m * H * 32), kThreads, 0, st>>>(
          o_run.data() + qr.at, l_run.data() + std::int64_t(B) * H * pair.q_offset, o_blk.data(), l_blk.data(), B, m, H,
          s.head_dim);
      CUDA_CHECK_LAUNCH();
      if (mark) mark(i, PairMark::MergeEnd);
    }
  }

  // O (in T) and L back to their tokens' places in the global tensors.
  void unpack(const RingSchedule& ring, int rank, const Shape& s, const DeviceForwardIo& io, cudaStream_t st) const {
    const RowElems row(s);
    const std::vector<TokenRange>& ranges = ring.q_ranges[rank];
    unpack_rows<T>(io.o, o_run.data(), s.batch, s.seq_q, row.q, ranges, st);
    const std::vector<int> at = range_starts(ranges);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      scatter_lse_kernel<<<blocks_for(std::int64_t(s.batch) * s.heads_q * ranges[i].count), kThreads, 0, st>>>(
          io.lse, l_run.data() + std::int64_t(s.batch) * s.heads_q * at[i], s.batch, s.heads_q, s.seq_q, ranges[i]);
      CUDA_CHECK_LAUNCH();
    }
  }
};

template <class T>
struct BackwardRank {
  DeviceBuffer<T> q, o, d_o;               // its queries' Q, final O and dO, packed by range
  DeviceBuffer<float> l;                   // and their final L (B, H, tokens) per range
  DeviceBuffer<T> k[2], v[2];              // two slots: the K/V share in hand and the one arriving
  DeviceBuffer<float> dq;                  // dQ's fp32 sum over every share
  DeviceBuffer<float> dk[2], dv[2];        // the partial dK/dV of the share in hand (slot of the step), fp32
  DeviceBuffer<float> dk_in, dv_in;        // the share's partials from the ranks before, arriving
  DeviceBuffer<float> lse_log2, D_i, dq_accum;  // the block kernel's backward scratch, the largest range's size
  DeviceBuffer<int> dq_semaphore;

  BackwardRank(const RingSchedule& ring, int rank, const Shape& s, RingBlockKernel kernel) {
    const RowElems row(s);
    const std::size_t B = s.batch, tokens = ring.q_tokens(rank), share = largest_share(ring);
    q = DeviceBuffer<T>(B * tokens * row.q);
    o = DeviceBuffer<T>(B * tokens * row.q);
    d_o = DeviceBuffer<T>(B * tokens * row.q);
    l = DeviceBuffer<float>(B * s.heads_q * tokens);
    dq = DeviceBuffer<float>(B * tokens * row.q);
    for (int slot = 0; slot < 2; ++slot) {
      k[slot] = DeviceBuffer<T>(B * share * row.kv);
      v[slot] = DeviceBuffer<T>(B * share * row.kv);
      dk[slot] = DeviceBuffer<float>(B * share * row.kv);
      dv[slot] = DeviceBuffer<float>(B * share * row.kv);
    }
    dk_in = DeviceBuffer<float>(B * share * row.kv);
    dv_in = DeviceBuffer<float>(B * share * row.kv);
    const int largest = largest_range(ring.q_ranges[rank]);
    if (kernel == RingBlockKernel::Fa2) {  // D_i (B, H, m) and dQ's fp32 atomics (B, m, H, D)
      D_i = DeviceBuffer<float>(B * s.heads_q * largest);
      dq_accum = DeviceBuffer<float>(B * largest * row.q);
      return;
    }
    const fa3_ws::BackwardScratchSizes n = fa3_ws::backward_scratch(s.batch, s.heads_q, largest, s.head_dim);
    lse_log2 = DeviceBuffer<float>(n.row_stats);
    D_i = DeviceBuffer<float>(n.row_stats);
    dq_accum = DeviceBuffer<float>(n.dq_accum);
    dq_semaphore = DeviceBuffer<int>(n.semaphores);
  }

  // Q, O, dO, L of its queries and its own K/V share (into slot 0) from the global tensors; dQ = 0.
  void pack(const RingSchedule& ring, int rank, const Shape& s, const DeviceBackwardIo& io, cudaStream_t st) {
    const RowElems row(s);
    const std::vector<TokenRange>& ranges = ring.q_ranges[rank];
    pack_rows(q.data(), io.q, s.batch, s.seq_q, row.q, ranges, st);
    pack_rows(o.data(), io.o, s.batch, s.seq_q, row.q, ranges, st);
    pack_rows(d_o.data(), io.d_o, s.batch, s.seq_q, row.q, ranges, st);
    const std::vector<int> at = range_starts(ranges);
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      gather_lse_kernel<<<blocks_for(std::int64_t(s.batch) * s.heads_q * ranges[i].count), kThreads, 0, st>>>(
          l.data() + std::int64_t(s.batch) * s.heads_q * at[i], io.lse, s.batch, s.heads_q, s.seq_q, ranges[i]);
      CUDA_CHECK_LAUNCH();
    }
    pack_rows(k[0].data(), io.k, s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
    pack_rows(v[0].data(), io.v, s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
    reset(st);
  }

  // Its queries against the share in slot `slot`: the pairs' dQ into dq, their dK/dV into the slot's partials,
  // which start from zero. (The partials of the ranks before are added by add_arrived, once they are in.)
  void step(const RankStep& rs, const std::vector<BlockLaunch>& plans, int slot, const BlockKernel& base, const Shape& s,
            DType dtype, cudaStream_t st) {
    const RowElems row(s);
    const int B = s.batch, H = s.heads_q;
    CUDA_CHECK(cudaMemsetAsync(dk[slot].data(), 0, dk[slot].bytes(), st));
    CUDA_CHECK(cudaMemsetAsync(dv[slot].data(), 0, dv[slot].bytes(), st));
    for (std::size_t i = 0; i < rs.pairs.size(); ++i) {
      const BlockPair& pair = rs.pairs[i];
      if (plans[i].skip) continue;
      const PairRows qr = pair_rows(B, pair.q_offset, pair.q.count, row.q);
      const PairRows kr = pair_rows(B, pair.k_offset, pair.k.count, row.kv);
      const std::int64_t l_at = std::int64_t(B) * H * pair.q_offset, l_stride = std::int64_t(H) * pair.q.count;
      const auto tensors = [&](auto& prm, int b) {
        prm.q = q.data() + qr.at + b * qr.batch_stride;
        prm.o = o.data() + qr.at + b * qr.batch_stride;
        prm.d_o = d_o.data() + qr.at + b * qr.batch_stride;
        prm.lse = l.data() + l_at + b * l_stride;
        prm.k = k[slot].data() + kr.at + b * kr.batch_stride;
        prm.v = v[slot].data() + kr.at + b * kr.batch_stride;
        prm.dq_sum = dq.data() + qr.at + b * qr.batch_stride;
        prm.dk_sum = dk[slot].data() + kr.at + b * kr.batch_stride;
        prm.dv_sum = dv[slot].data() + kr.at + b * kr.batch_stride;
        prm.D_i = D_i.data();
        prm.dq_accum = dq_accum.data();
      };
      if (base.kernel == RingBlockKernel::Fa2) {
        for_each_launch(base.fa2, pair, plans[i], B, [&](fa2::Params prm, int b) {
          tensors(prm, b);
          CUDA_CHECK(cudaMemsetAsync(dq_accum.data(), 0, dq_accum.bytes(), st));  // its dQ atomics start from 0
          fa2::launch_backward(dtype, prm, st);
        });
      } else {
        for_each_launch(base.fa3, pair, plans[i], B, [&](fa3_ws::Params prm, int b) {
          tensors(prm, b);
          prm.lse_log2 = lse_log2.data();
          prm.dq_semaphore = dq_semaphore.data();
          fa3_ws::launch_backward(dtype, prm, st);
        });
      }
    }
  }

  // Timed runs with no global tensors (ring_nccl.cu): Q, the K/V slots and the final O (in T) and L taken from the
  // rank's forward, which has just run, and a random dO. (On the legacy stream: synchronize before use.)
  void take_forward(const ForwardRank<T>& f, int rank) {
    CUDA_CHECK(cudaMemcpy(q.data(), f.q.data(), q.bytes(), cudaMemcpyDeviceToDevice));
    for (int slot = 0; slot < 2; ++slot) {
      CUDA_CHECK(cudaMemcpy(k[slot].data(), f.k[slot].data(), k[slot].bytes(), cudaMemcpyDeviceToDevice));
      CUDA_CHECK(cudaMemcpy(v[slot].data(), f.v[slot].data(), v[slot].bytes(), cudaMemcpyDeviceToDevice));
    }
    to_element_type_kernel<T><<<blocks_for(o.size()), kThreads>>>(o.data(), f.o_run.data(), o.size());
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpy(l.data(), f.l_run.data(), l.bytes(), cudaMemcpyDeviceToDevice));
    cuda::fill_random(d_o, 8 * std::uint64_t(rank) + 6);
  }

  // dQ = 0: the sum before the first block.
  void reset(cudaStream_t st) { CUDA_CHECK(cudaMemsetAsync(dq.data(), 0, dq.bytes(), st)); }

  // The slot's partials += the ones that arrived from the rank before (dk_in, dv_in): tokens of the share.
  void add_arrived(int slot, std::int64_t elements, cudaStream_t st) {
    for (auto [sum, in] : {std::pair{&dk[slot], &dk_in}, std::pair{&dv[slot], &dv_in}}) {
      add_kernel<<<blocks_for(elements / 4), kThreads, 0, st>>>(reinterpret_cast<float4*>(sum->data()),
                                                                reinterpret_cast<const float4*>(in->data()), elements / 4);
      CUDA_CHECK_LAUNCH();
    }
  }

  // dQ (in T) to its queries' places; and, once its own share's complete partials have come home into
  // dk_in / dv_in, dK and dV to the share's places.
  void unpack(const RingSchedule& ring, int rank, const Shape& s, const DeviceBackwardIo& io, cudaStream_t st) const {
    const RowElems row(s);
    unpack_rows<T>(io.dq, dq.data(), s.batch, s.seq_q, row.q, ring.q_ranges[rank], st);
    unpack_rows<T>(io.dk, dk_in.data(), s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
    unpack_rows<T>(io.dv, dv_in.data(), s.batch, s.seq_k, row.kv, ring.kv_ranges[rank], st);
  }
};

}  // namespace
}  // namespace flashlab::cuda::ring
