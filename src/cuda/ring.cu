// Ring attention's forward on one GPU (ring.hpp): the P ranks of model/ring.hpp's schedule as P CUDA
// streams. What a multi-GPU ring does is all here, only the link is a device-to-device copy:
//  * Each rank packs its own tokens, range by range (one range for contiguous and striped, two for zigzag),
//    each range a (B, count, H, D) tensor: a block kernel then sees every range as an ordinary problem of
//    `count` tokens. Its K/V share is packed the same way, into slot 0 of two.
//  * At step s rank r computes its queries against the share in hand (slot s % 2), pair by pair: each pair
//    is one launch of cuda-fa3-ws's forward (block_launch decides how: no mask, or bottom-right on the keys its
//    last row sees), whose O and L the rank folds into its running fp32 (O, L) with the CPU reference's
//    logsumexp merge (core/logsumexp.hpp). Meanwhile the link stream into rank r + 1 copies that share into
//    r + 1's other slot, so the copy overlaps the compute, as NCCL's send / recv would.
//  * At the end each rank writes O (in the input dtype) and L back to their tokens' places in the global
//    tensors.
// Events order it, the way a multi-GPU ring's messages would: rank r's copy for step s + 1 waits until the
// share has arrived at r - 1 (the copy of step s) and until r is done with the slot it overwrites (its compute
// of step s - 1, and the copy out of that slot into r + 1).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "core/logsumexp.hpp"
#include "cuda/common.cuh"
#include "cuda/constraints.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/host_checks.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/ring.hpp"

namespace flashlab {
namespace {

namespace fa3 = cuda::fa3ws;

// ---- kernels: packing, merging, unpacking ----------------------------------------------------------------

// dst (B, count, H, D) <- the rows token(0..count) of src (B, S, H, D); 16-byte vectors, one per thread.
__global__ void gather_rows_kernel(uint4* dst, const uint4* src, int batch, int seq, int row_vecs, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, a, vec)
  const std::int64_t total = std::int64_t(batch) * range.count * row_vecs;
  if (i >= total) return;
  const int vec = static_cast<int>(i % row_vecs);
  const std::int64_t row = i / row_vecs;
  const int a = static_cast<int>(row % range.count), b = static_cast<int>(row / range.count);
  dst[i] = src[(std::int64_t(b) * seq + range.token(a)) * row_vecs + vec];
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

// The range's rows of the global O (B, S_q, H, D) in T and L (B, H, S_q) from the running fp32 ones.
template <class T>
__global__ void scatter_rows_kernel(T* o, float* lse, const float* o_run, const float* l_run, int batch, int seq, int heads,
                                    int head_dim, TokenRange range) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // over (b, a, h, column)
  const std::int64_t row_elems = std::int64_t(heads) * head_dim;
  if (i >= std::int64_t(batch) * range.count * row_elems) return;
  const std::int64_t row = i / row_elems, within = i % row_elems;
  const int a = static_cast<int>(row % range.count), b = static_cast<int>(row / range.count);
  o[(std::int64_t(b) * seq + range.token(a)) * row_elems + within] = static_cast<T>(o_run[i]);
  if (within % head_dim == 0) {
    const int h = static_cast<int>(within / head_dim);
    lse[(std::int64_t(b) * heads + h) * seq + range.token(a)] = l_run[(std::int64_t(b) * heads + h) * range.count + a];
  }
}

__global__ void fill_kernel(float* x, std::int64_t n, float value) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = value;
}

constexpr int kThreads = 256;
unsigned blocks_for(std::int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

// ---- the ring ---------------------------------------------------------------------------------------------

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

struct Streams {
  std::vector<cudaStream_t> compute, link;  // [rank]; link[r] carries the copies into rank r
  explicit Streams(int ranks) : compute(ranks), link(ranks) {
    for (int r = 0; r < ranks; ++r) {
      CUDA_CHECK(cudaStreamCreate(&compute[r]));  // blocking: ordered with the legacy default stream
      CUDA_CHECK(cudaStreamCreate(&link[r]));
    }
  }
  ~Streams() {
    for (cudaStream_t s : compute) cudaStreamDestroy(s);
    for (cudaStream_t s : link) cudaStreamDestroy(s);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
};

// Events [rank][step], recorded once each, before anything waits on them.
struct EventGrid {
  std::vector<std::vector<cudaEvent_t>> at;
  EventGrid(int ranks, int steps) : at(ranks, std::vector<cudaEvent_t>(steps)) {
    for (auto& row : at)
      for (cudaEvent_t& e : row) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~EventGrid() {
    for (auto& row : at)
      for (cudaEvent_t e : row) cudaEventDestroy(e);
  }
  EventGrid(const EventGrid&) = delete;
  EventGrid& operator=(const EventGrid&) = delete;
};

template <class T>
struct Rank {
  cuda::DeviceBuffer<T> q;                // its query tokens, packed by range
  cuda::DeviceBuffer<T> k[2], v[2];       // two slots for the K/V share in hand and the one arriving
  cuda::DeviceBuffer<float> o_run, l_run;  // running O (B, tokens, H, D) and L (B, H, tokens) per range, packed
  cuda::DeviceBuffer<T> o_blk;            // a block's O and L, the largest range's size
  cuda::DeviceBuffer<float> l_blk;
  cuda::DeviceBuffer<int> tile_counter;   // cuda-fa3-ws's persistent grid: one per stream that launches it
};

template <class T>
void ring_forward(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceForwardIo& io) {
  const Shape& s = p.shape;
  const int P = ring.ranks, B = s.batch, H = s.heads_q, Hkv = s.heads_kv, D = s.head_dim;
  const std::int64_t q_row = std::int64_t(H) * D, kv_row = std::int64_t(Hkv) * D;  // elements per token
  const int q_vecs = static_cast<int>(q_row * sizeof(T) / 16), kv_vecs = static_cast<int>(kv_row * sizeof(T) / 16);

  // Plans first, so that a refusal comes before any work.
  std::vector<std::vector<std::vector<BlockLaunch>>> plans(P, std::vector<std::vector<BlockLaunch>>(P));
  for (int step = 0; step < P; ++step)
    for (int r = 0; r < P; ++r)
      for (const BlockPair& pair : ring.steps[step][r].pairs) plans[step][r].push_back(block_launch(pair));

  int max_share = 0;
  for (int origin = 0; origin < P; ++origin) max_share = std::max(max_share, ring.kv_tokens(origin));
  std::vector<Rank<T>> ranks(P);
  for (int r = 0; r < P; ++r) {
    Rank<T>& rk = ranks[r];
    const int tokens = ring.q_tokens(r);
    int largest = 0;
    for (const TokenRange& range : ring.q_ranges[r]) largest = std::max(largest, range.count);
    rk.q = cuda::DeviceBuffer<T>(std::size_t(B) * tokens * q_row);
    for (int slot = 0; slot < 2; ++slot) {
      rk.k[slot] = cuda::DeviceBuffer<T>(std::size_t(B) * max_share * kv_row);
      rk.v[slot] = cuda::DeviceBuffer<T>(std::size_t(B) * max_share * kv_row);
    }
    rk.o_run = cuda::DeviceBuffer<float>(std::size_t(B) * tokens * q_row);
    rk.l_run = cuda::DeviceBuffer<float>(std::size_t(B) * H * tokens);
    rk.o_blk = cuda::DeviceBuffer<T>(std::size_t(B) * largest * q_row);
    rk.l_blk = cuda::DeviceBuffer<float>(std::size_t(B) * H * largest);
    rk.tile_counter = cuda::DeviceBuffer<int>(2);
    cuda::zero(rk.tile_counter);
  }

  Streams streams(P);
  EventGrid arrived(P, P), computed(P, P);  // share of step s in rank r's slot s % 2; rank r done with step s
  // Packing: queries, the own K/V share into slot 0, the running (O, L) = (0, -inf).
  for (int r = 0; r < P; ++r) {
    Rank<T>& rk = ranks[r];
    cudaStream_t st = streams.compute[r];
    const std::vector<int> q_at = range_starts(ring.q_ranges[r]), kv_at = range_starts(ring.kv_ranges[r]);
    for (std::size_t i = 0; i < ring.q_ranges[r].size(); ++i) {
      const TokenRange& range = ring.q_ranges[r][i];
      gather_rows_kernel<<<blocks_for(std::int64_t(B) * range.count * q_vecs), kThreads, 0, st>>>(
          reinterpret_cast<uint4*>(rk.q.data() + std::int64_t(B) * q_at[i] * q_row), static_cast<const uint4*>(io.q), B,
          s.seq_q, q_vecs, range);
      CUDA_CHECK_LAUNCH();
    }
    for (std::size_t i = 0; i < ring.kv_ranges[r].size(); ++i) {
      const TokenRange& range = ring.kv_ranges[r][i];
      for (const auto& [dst, src] : {std::pair{rk.k[0].data(), io.k}, std::pair{rk.v[0].data(), io.v}}) {
        gather_rows_kernel<<<blocks_for(std::int64_t(B) * range.count * kv_vecs), kThreads, 0, st>>>(
            reinterpret_cast<uint4*>(dst + std::int64_t(B) * kv_at[i] * kv_row), static_cast<const uint4*>(src), B,
            s.seq_k, kv_vecs, range);
        CUDA_CHECK_LAUNCH();
      }
    }
    CUDA_CHECK(cudaMemsetAsync(rk.o_run.data(), 0, rk.o_run.bytes(), st));
    fill_kernel<<<blocks_for(rk.l_run.size()), kThreads, 0, st>>>(rk.l_run.data(), rk.l_run.size(), -INFINITY);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(arrived.at[r][0], st));
  }

  fa3::Params base;
  cuda::set_extents(base, s);
  cuda::set_softmax_and_dropout(base, p);
  for (int step = 0; step < P; ++step) {
    // The link: every share moves one rank on, into the slot the receiver is done with.
    if (ring.kv_travels_on(step))
      for (int r = 0; r < P; ++r) {
        const int from = (r - 1 + P) % P, to_slot = (step + 1) % 2;
        cudaStream_t link = streams.link[r];
        CUDA_CHECK(cudaStreamWaitEvent(link, arrived.at[from][step]));
        if (step > 0) {
          CUDA_CHECK(cudaStreamWaitEvent(link, computed.at[r][step - 1]));  // r is done reading the slot
          CUDA_CHECK(cudaStreamWaitEvent(link, arrived.at[(r + 1) % P][step]));  // and r + 1 has its copy of it
        }
        const std::size_t bytes = std::size_t(B) * ring.kv_tokens(ring.steps[step][from].kv_origin) * kv_row * sizeof(T);
        CUDA_CHECK(cudaMemcpyAsync(ranks[r].k[to_slot].data(), ranks[from].k[step % 2].data(), bytes,
                                   cudaMemcpyDeviceToDevice, link));
        CUDA_CHECK(cudaMemcpyAsync(ranks[r].v[to_slot].data(), ranks[from].v[step % 2].data(), bytes,
                                   cudaMemcpyDeviceToDevice, link));
        CUDA_CHECK(cudaEventRecord(arrived.at[r][step + 1], link));
      }
    // The compute: each rank's pairs against the share in hand.
    for (int r = 0; r < P; ++r) {
      Rank<T>& rk = ranks[r];
      cudaStream_t st = streams.compute[r];
      CUDA_CHECK(cudaStreamWaitEvent(st, arrived.at[r][step]));
      const RankStep& rs = ring.steps[step][r];
      for (std::size_t i = 0; i < rs.pairs.size(); ++i) {
        const BlockPair& pair = rs.pairs[i];
        const BlockLaunch& plan = plans[step][r][i];
        if (plan.skip) continue;
        const int m = pair.q.count, n = pair.k.count;
        fa3::Params prm = base;
        prm.tile_counter = rk.tile_counter.data();
        prm.align = plan.align;
        prm.seq_q = m;
        prm.seq_k = plan.keys;
        const T* q = rk.q.data() + std::int64_t(B) * pair.q_offset * q_row;
        const T* k = rk.k[step % 2].data() + std::int64_t(B) * pair.k_offset * kv_row;
        const T* v = rk.v[step % 2].data() + std::int64_t(B) * pair.k_offset * kv_row;
        // Fewer keys than the range holds: each batch's keys are a prefix of its own rows, so one launch a batch.
        const int launches = plan.keys < n ? B : 1;
        prm.batch = B / launches;
        for (int b = 0; b < launches; ++b) {
          prm.q = q + std::int64_t(b) * m * q_row;
          prm.k = k + std::int64_t(b) * n * kv_row;
          prm.v = v + std::int64_t(b) * n * kv_row;
          prm.o = rk.o_blk.data() + std::int64_t(b) * m * q_row;
          prm.lse = rk.l_blk.data() + std::int64_t(b) * H * m;
          fa3::launch_forward(dtype, prm, st);
        }
        merge_block_kernel<T><<<blocks_for(std::int64_t(B) * m * H * 32), kThreads, 0, st>>>(
            rk.o_run.data() + std::int64_t(B) * pair.q_offset * q_row, rk.l_run.data() + std::int64_t(B) * H * pair.q_offset,
            rk.o_blk.data(), rk.l_blk.data(), B, m, H, D);
        CUDA_CHECK_LAUNCH();
      }
      CUDA_CHECK(cudaEventRecord(computed.at[r][step], st));
    }
  }
  // Unpacking: O and L to their tokens' places.
  for (int r = 0; r < P; ++r) {
    const std::vector<int> q_at = range_starts(ring.q_ranges[r]);
    for (std::size_t i = 0; i < ring.q_ranges[r].size(); ++i) {
      const TokenRange& range = ring.q_ranges[r][i];
      scatter_rows_kernel<T><<<blocks_for(std::int64_t(B) * range.count * q_row), kThreads, 0, streams.compute[r]>>>(
          static_cast<T*>(io.o), io.lse, ranks[r].o_run.data() + std::int64_t(B) * q_at[i] * q_row,
          ranks[r].l_run.data() + std::int64_t(B) * H * q_at[i], B, s.seq_q, H, D, range);
      CUDA_CHECK_LAUNCH();
    }
  }
  for (cudaStream_t st : streams.compute) CUDA_CHECK(cudaStreamSynchronize(st));
  for (cudaStream_t st : streams.link) CUDA_CHECK(cudaStreamSynchronize(st));
}

}  // namespace

void cuda_ring_forward_on_device(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceForwardIo& io) {
  if (ring.seq_q != p.shape.seq_q || ring.seq_k != p.shape.seq_k || ring.causal != p.options.causal)
    throw InputError("the ring's schedule was made for seq_q = " + std::to_string(ring.seq_q) + ", seq_k = " +
                     std::to_string(ring.seq_k) + ", causal " + to_string(ring.causal) + ", not for this problem's " +
                     std::to_string(p.shape.seq_q) + ", " + std::to_string(p.shape.seq_k) + ", " +
                     to_string(p.options.causal));
  if (p.options.dropout_p > 0)
    throw InputError("the GPU ring has no dropout: each rank would need the global token indices in its mask");
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw InputError(std::string("the GPU ring's blocks are cuda-fa3-ws's, which take f16 or bf16, not ") +
                     to_string(dtype));
  const auto& dims = cuda::fa3_ws::kHeadDims;
  if (std::find(std::begin(dims), std::end(dims), p.shape.head_dim) == std::end(dims)) {
    std::string supported;
    for (int d : dims) supported += (supported.empty() ? "" : ", ") + std::to_string(d);
    throw InputError("the GPU ring's blocks are cuda-fa3-ws's, which support head dims " + supported + ", not " +
                     std::to_string(p.shape.head_dim));
  }
  fa3::require_hopper();  // before any work, rather than at the first block
  if (p.shape.batch == 0 || p.shape.heads_q == 0) return;
  if (dtype == DType::BF16) ring_forward<__nv_bfloat16>(ring, p, dtype, io);
  else ring_forward<__half>(ring, p, dtype, io);
}

ForwardOut cuda_ring_forward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in) {
  const auto run = [&ring](const Problem& problem, DType t, const DeviceForwardIo& io) {
    cuda_ring_forward_on_device(ring, problem, t, io);
  };
  return cuda::forward_from_host(run, p, dtype, in);
}

}  // namespace flashlab
