// cuda-fa3-ws backward: FlashAttention's gradients (Algorithm 2 of FlashAttention-2) on Hopper (sm_90a),
// with the forward's tools: TMA into 128B-swizzled shared memory, wgmma, producer / consumer warpgroups.
// fp16/bf16 in, fp32 accumulation, dQ, dK, dV in the input dtype.
//
// What changed from cuda-fa2's backward (fa2_backward.cu: 8 warps on mma.sync, cp.async copies, P and dS
// through shared memory for their transposes, dQ added with fp32 atomics from the registers), and why:
//  * One thread block per K/V block j, as before: K_j and V_j stay in shared memory, dK_j and dV_j in the
//    registers, while the block walks the query blocks i that see them (and, under GQA, the query heads
//    of its group, so dK and dV sum over the group without atomics).
//  * The products are computed transposed. Each consumer warpgroup owns 64 keys (wgmma's M), so it
//    computes S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T (both operands K-major in shared memory, the
//    forward's S GEMM with Q and K swapped). Their accumulators then hold P_ij^T and dS_ij^T with keys
//    as rows, which is exactly the A operand dV_j += P_ij^T dO_i and dK_j += dS_ij^T Q_i take from the
//    registers (as the forward's P V): P and dS need no trip through shared memory for these two.
//  * dQ_i += dS_ij K_j needs dS with queries as rows: each consumer writes its dS_ij^T to shared memory
//    (keys, queries), and wgmma reads it back as a transposed (MN-major) A operand, with K_j as a
//    transposed B. At d = 128 each consumer computes 64 of dQ_i's columns over all 128 keys (after a
//    barrier of both consumers); at d = 64 all 64 columns over its own 64 keys (DqSplit).
//  * At d = 128 both consumers' halves of dS_ij^T feed each one's piece of dQ_i, so they must wait for each other.
//    Step n's dQ GEMM runs at step n + 1, after the other consumer has finished step n, rather than after a
//    barrier in the middle of step n: the consumers then drift apart, and one's exponentials overlap the other's
//    GEMMs (BwdConfig::kDeferDq; +4-10% on the H100). A consumer tells the other it is through step n as soon as
//    its dQ GEMM has read the tiles, not after its dV_j and dK_j GEMMs (-1% to +9%, +3% on average).
//  * dQ leaves through the copy engine: each consumer stages its piece in shared memory (two buffers) and
//    hands it to a dQ writer warp, which adds it to dQ_accum in global memory with one bulk reduction
//    (cp.reduce.async.bulk .add.f32, 16 KiB) instead of 64 x 64 / 128 fp32 atomics per thread, and hands the
//    buffer back once the copy engine has read it. The consumers never wait on the copy engine (measured on
//    the H100: +6-13% over a consumer thread issuing the reduction itself, side by side). The piece's GEMM is
//    issued before dV_j's and dK_j's, so that it is staged while they run (not timed apart from the writer). dQ_accum holds the pieces in the
//    consumers' register order (a 16-byte vector per thread per four registers, conflict-free to stage);
//    convert_dq_kernel reads that order back and writes dQ = scale dQ_accum in the input dtype. Each addition
//    is counted once complete, and the conversion, launched to start while the main kernel still runs, takes
//    each piece as soon as its count is full: it runs on the SMs the main kernel's last wave leaves idle
//    instead of after it.
//  * d = 256 (KvSplit::Columns): dK_j and dV_j of 64 keys would take 256 registers a thread, so a block holds 64
//    keys, both consumers see all of them, and they split dK_j, dV_j by columns (128 each) and S^T, dP^T by
//    queries (32 each). P^T and dS^T then go through shared memory for dV_j and dK_j (SS, as dS^T already does
//    for dQ_i). K_j, V_j and the Q_i, dO_i stages take 192 KiB, which leaves no room to stage dQ_i: there the
//    consumers add their pieces from the registers with red.global.add.v4.f32, in the same layout.
//  * Deterministic mode (Params::deterministic): before adding a piece of dQ_i, the writer waits on a
//    per-piece counter until the K/V blocks before it (j' < j, all of which see Q_i when block j does)
//    have added theirs, adds, waits for its reduction to complete and counts itself. The sum is then
//    taken in one order, j = 0, 1, ... (causal: from the last K/V block down, with the blocks launched in that
//    order so that none waits for a block that cannot start), and two runs give bit-identical dQ.
//  * A producer warpgroup (24 registers) issues every copy. Its first warp loads K_j and V_j once, then per
//    step Q_i, dO_i (TMA tiles) and L_i, D_i (bulk copies from padded scratch) into one of two stages; its
//    second is the dQ writer. The stages are released by the
//    consumers (240 registers: dK_j and dV_j of 64 keys, S^T, dP^T and the dQ piece) when the step's
//    GEMMs are done.
//  * The pre-pass (row_stats_kernel) clears dQ_accum and writes D_i = rowsum(dO_i o O_i) and L_i log2(e) into scratch padded
//    to whole query blocks, with +inf for padding rows and rows that saw no key, so exp2(S - L) = 0 there
//    and no mask is needed for them; keys past the end of the sequence are zero-filled by TMA, so their
//    dS_ij contributes K = 0 to dQ_i, and their dK, dV rows are never written.
// Parts, in file order: configuration, pre-pass, producer, consumer (per step: the five products; then
// the dQ piece out; the dK, dV epilogue), kernel, dQ conversion, host launcher. Notation as the paper's:
// Q_i, dO_i (Br, d), K_j, V_j (Bc, d), S_ij, P_ij, dP_ij, dS_ij (Br, Bc), L_i, D_i (Br).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>

#include "core/mask.hpp"
#include "core/philox.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/host_checks.hpp"
#include "cuda/fa3_ws/timeline_lane.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kKeysPerConsumer = 64;  // wgmma's M: each consumer warpgroup owns 64 keys of the block
static_assert(kConsumers == 2, "two consumer warpgroups (cuda/tilings.hpp), as in the forward");
constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
constexpr int kElemBytes = 2;
constexpr int kStages = 2;  // Q_i, dO_i, L_i, D_i stages
// Named hardware barriers (0 is __syncthreads): "both consumers have written dS_ij^T" (256 threads; also where
// both meet before the epilogue reuses the Q_i, dO_i stages), and each consumer's own (128).
constexpr int kBarDsWritten = 1;
constexpr int kBarConsumerBase = 2;
// Consumer c's dQ staging buffer b is full (kBarDqFull + 2 c + b) / empty again (kBarDqEmpty + 2 c + b): a
// hand-over between the consumer's 128 threads and the dQ writer warp (160 threads).
constexpr int kBarDqFull = 4;
constexpr int kBarDqEmpty = 8;
constexpr int kDqHandoffThreads = kWarpgroupThreads + 32;
constexpr int kDqBuffers = 2;  // staging buffers per consumer
// Deferred dQ (BwdConfig::kDeferDq): consumer c is done with step n's shared tiles, i.e. has written its half of dS^T
// of step n and its dQ GEMM has read both halves of step n - 1's; its dV_j and dK_j GEMMs may still run
// (kBarStepDone + 2 c + n % 2, 256 threads: c arrives, the other consumer syncs;
// two ids, since c may finish step n + 1 before the other has synced on step n). Consumer 1 also starts behind
// consumer 0 (kBarDsWritten, not needed otherwise then).
constexpr int kBarStepDone = 12;

// Query rows per step (Br). 64: at d = 128, dK_j and dV_j take 128 registers of a consumer's 240 beside S^T and
// dP^T (32 each); at d = 64, Br = 128 would make S^T and dP^T 64 registers each, and ptxas spilled 28 bytes
// (with dQ split by rows between the consumers; 272 before S^T and dP^T were packed before the dV and dK GEMMs).
// The one definition the host's scratch sizes use.
__host__ __device__ constexpr int backward_block_rows(int head_dim) { return head_dim > 0 ? 64 : 0; }
// dQ_accum's pieces (64 x 64 fp32 each) per query block: one at d = 64 (both consumers add to it), d / 64 above.
__host__ __device__ constexpr int dq_pieces(int head_dim) { return head_dim <= 64 ? 1 : head_dim / 64; }

// How the two consumers share a step's dK_j, dV_j and S^T, dP^T:
//  * Keys (d = 64, 128): Bc = 128 and consumer c owns keys 64 c .. 64 c + 63: their S^T and dP^T over all Br
//    queries, and their rows of dK_j and dV_j (64 x d), accumulated from P^T and dS^T in its registers (RS).
//  * Columns (d = 256): dK_j and dV_j of 64 keys would take 2 x 64 x 256 / 128 = 256 registers a thread. Bc = 64
//    and both consumers see all 64 keys: consumer c computes S^T and dP^T for queries 32 c .. 32 c + 31, writes
//    its half of P^T and dS^T to shared memory, and owns columns 128 c .. 128 c + 127 of dK_j and dV_j, whose
//    GEMMs read both halves from there (SS).
enum class KvSplit { Keys, Columns };

// How the two consumers share dQ_i += dS_ij K_j (Br = 64 rows, d columns, Bc keys to sum over):
//  * Columns (d = 128, 256): consumer c computes columns d c / 2 .. d (c + 1) / 2 - 1 over all Bc keys, in pieces of
//    64 columns, so it reads the other consumer's half of dS_ij^T: both write theirs, then meet at a barrier.
//  * Keys (d = 64): each consumer computes all 64 columns over its own 64 keys, from its own rows of dS_ij^T
//    (only its own warpgroup's barrier), and both add their partial sums into the same piece of dQ_accum.
enum class DqSplit { Columns, Keys };

template <int D, bool kDropout = false>
struct BwdConfig {
  static constexpr KvSplit kKvSplit = D == 256 ? KvSplit::Columns : KvSplit::Keys;
  static constexpr bool kKvByKeys = kKvSplit == KvSplit::Keys;
  static constexpr int kBc = kKvByKeys ? kConsumers * kKeysPerConsumer : kKeysPerConsumer;  // 128 or 64 keys per block
  static constexpr int kBr = backward_block_rows(D);
  static constexpr int kSQueries = kKvByKeys ? kBr : kBr / kConsumers;  // queries of a consumer's S^T, dP^T (wgmma N)
  static constexpr int kKvCols = kKvByKeys ? D : D / kConsumers;        // columns of a consumer's dK_j, dV_j
  static constexpr DqSplit kDqSplit = D == 64 ? DqSplit::Keys : DqSplit::Columns;
  static constexpr int kDqPieces = dq_pieces(D);  // per query block
  static constexpr int kDqPiecesPerConsumer = kDqSplit == DqSplit::Columns ? kDqPieces / kConsumers : 1;
  static constexpr int kDqCols = 64;
  static_assert(kBr == 64 && kDqCols == kPanelCols && D == kDqPieces * kDqCols,
                "a dQ piece is 64 x 64: one panel of K_j, wgmma_ss_tt's N");
  // dQ's way out. Keys: staged in shared memory and added by the writer warp's bulk reductions. Columns: K_j, V_j
  // and two stages of Q_i, dO_i take 192 KiB of the 227, P^T and dS^T 32 more, which leaves no room to stage dQ_i's
  // 64 KiB: each thread adds its registers with red.global.add.v4.f32 (16 bytes a vector, coalesced per warp).
  static constexpr bool kDqWriter = kKvByKeys;
  // dQ_i's pieces are issued before dV_j and dK_j, so that they are waited for and sent out while those two run.
  // With dropout at d = 128 the keep bits leave no registers for that order (ptxas spilled 20 bytes): there dV and
  // dK go first, and the piece is staged after all three.
  static constexpr bool kDqFirst = !(kDropout && D == 128);
  // At d = 128 (DqSplit::Columns, dS^T from both consumers) step n's dQ_i is computed at step n + 1, after the other
  // consumer has finished step n, instead of after a barrier in the middle of step n: the consumers need not
  // reach their pointwise parts at the same moment, so one's exponentials overlap the other's GEMMs (measured
  // on the H100 at N = 1k-16k, backward alone: +3-9%, and +4-10% with consumer 1 started behind consumer 0). The
  // registers are those of kDqFirst's order; with dropout it is not done (kDqFirst is false there).
  static constexpr bool kDeferDq = D == 128 && !kDropout;
  static constexpr int kDqPieceFloats = kBr * kDqCols;
  static constexpr int kNS = kSQueries / 2;  // S^T, dP^T accumulator floats per thread: (64 keys, kSQueries)
  static constexpr int kNKV = kKvCols / 2;   // dK, dV accumulator floats per thread: (64 keys, kKvCols)
  static constexpr int kNQ = kDqCols / 2;    // dQ piece accumulator floats per thread: (64, 64)
  static constexpr int kPackSteps = kSQueries / 16;  // 16-query groups of a consumer's P^T, dS^T (RS: A fragments)
  static constexpr int kKSteps = kBr / 16;           // k-steps of dV += P^T dO and dK += dS^T Q

  // Shared memory: K_j, V_j (Bc, d); kStages x Q_i, dO_i (Br, d); two dS^T buffers (Bc, Br) and, Columns, two P^T
  // buffers; Keys: each consumer's dQ staging (2 x 64 x 64 fp32); kStages x L_i, D_i (Br fp32); then the mbarriers.
  static constexpr int kKVBytes = kBc * D * kElemBytes;
  static constexpr int kQBytes = kBr * D * kElemBytes;
  static constexpr int kDsBytes = kBc * kBr * kElemBytes;
  static constexpr int kDqBytes = kDqPieceFloats * 4;
  static constexpr int kRowStatBytes = kBr * 4;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVBytes;
  static constexpr int kQOffset = kVOffset + kKVBytes;
  static constexpr int kDOOffset = kQOffset + kStages * kQBytes;
  static constexpr int kDsOffset = kDOOffset + kStages * kQBytes;
  static constexpr int kPtOffset = kDsOffset + 2 * kDsBytes;
  static constexpr int kDqOffset = kPtOffset + (kKvByKeys ? 0 : 2 * kDsBytes);
  static constexpr int kLOffset = kDqOffset + (kDqWriter ? kConsumers * kDqBuffers * kDqBytes : 0);
  static constexpr int kDiOffset = kLOffset + kStages * kRowStatBytes;
  static constexpr int kBarOffset = kDiOffset + kStages * kRowStatBytes;
  // Barriers: K_j and V_j full (once); per stage full and empty.
  static constexpr int kKVFull = 0, kFull = 1, kEmpty = kFull + kStages, kNumBarriers = kEmpty + kStages;
  static constexpr int kBytes = kBarOffset + kNumBarriers * 8 + kSwizzleAtomBytes;  // + the alignment slack
  static constexpr std::uint32_t kStepTxBytes = 2 * kQBytes + 2 * kRowStatBytes;
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kDsBytes % kSwizzleAtomBytes == 0, "tiles stay 1024-aligned");
  static_assert(kBytes <= kMaxSmemBytes, "the tiles, stages and barriers must fit 227 KiB");
};

// What a block works on: K/V block j of (batch b, K/V head h_kv), and its steps: every (query head of the
// group, query block i >= i_first), heads outer.
struct KeyBlock {
  int b, h_kv, j, key0, group, n_q, i_first, n_i, n_steps;
  __device__ int head(int step) const { return h_kv * group + step / n_i; }
  __device__ int q_block(int step) const { return i_first + step % n_i; }
};

template <int kBr, int kBc>
__device__ KeyBlock key_block(const Params& p) {
  KeyBlock kb;
  // Deterministic and causal, the K/V blocks add to dQ_i from the last to the first (dq_turn), and they are
  // launched in that order too: a block then waits only for blocks launched before it, which run or are done.
  // Launched the other way round, once a head has more K/V blocks than the GPU holds at once, every resident block
  // would wait for one that has no SM to run on.
  const int n_kv = (p.seq_k + kBc - 1) / kBc;
  kb.j = p.deterministic && p.align != CausalAlign::None ? n_kv - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  kb.b = static_cast<int>(blockIdx.y) / p.heads_kv;
  kb.h_kv = static_cast<int>(blockIdx.y) % p.heads_kv;
  kb.key0 = kb.j * kBc;
  kb.group = p.heads_q / p.heads_kv;
  kb.n_q = (p.seq_q + kBr - 1) / kBr;
  const int first_row = first_row_seeing_key(p.align, kb.key0, p.seq_q, p.seq_k);
  kb.i_first = first_row < p.seq_q ? first_row / kBr : kb.n_q;
  kb.n_i = kb.n_q - kb.i_first;
  kb.n_steps = kb.group * kb.n_i;
  return kb;
}

// ---- pre-pass ---------------------------------------------------------------------------------------------

// D / 8 threads per (batch, query head, padded row), one 16-byte vector of O and one of dO each: D_i = sum_d
// dO[i, d] O[i, d] and L_i log2(e), or 0 and +inf for a padding row or a row that saw no key (L = -inf). The same
// threads clear dQ's counters and dQ_accum, D floats each row's group (the chunk of the same index, not the row's own floats: the
// kernel only needs every float cleared once, and this keeps the stores coalesced), so that no separate memset
// pass writes it (measured on the H100: a warp per row with 2-byte loads ran at 1 TB/s, this one near the
// bandwidth).
template <class T, int D>
__global__ void row_stats_kernel(const Params p, int padded_rows) {
  constexpr int kGroup = D / 8;  // threads per row: 8, 16, 32
  static_assert(32 % kGroup == 0, "a row's group lies within one warp");
  const std::int64_t thread = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t row_index = thread / kGroup;  // over (B, H_q, padded S_q)
  const int part = static_cast<int>(thread % kGroup);
  const bool in_grid = row_index < std::int64_t(p.batch) * p.heads_q * padded_rows;
  const int row = static_cast<int>(row_index % padded_rows);
  const std::int64_t bh = row_index / padded_rows;
  float sum = 0.f, lse2 = INFINITY;
  if (in_grid && row < p.seq_q) {
    const int b = static_cast<int>(bh / p.heads_q), h = static_cast<int>(bh % p.heads_q);
    const std::int64_t at = ((std::int64_t(b) * p.seq_q + row) * p.heads_q + h) * D + part * 8;
    const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + at);
    const uint4 d_o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.d_o) + at);
    const T* o8 = reinterpret_cast<const T*>(&o);
    const T* d_o8 = reinterpret_cast<const T*>(&d_o);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += static_cast<float>(o8[e]) * static_cast<float>(d_o8[e]);
    const float lse = p.lse[bh * p.seq_q + row];
    if (lse != -INFINITY) lse2 = lse * kLog2e;
  }
#pragma unroll
  for (int offset = kGroup / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!in_grid) return;
  float4* clear = reinterpret_cast<float4*>(p.dq_accum + row_index * D + part * 8);
  clear[0] = clear[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  // The first row of each query block's group clears the block's dQ counters, and the grid's first the
  // conversion's ticket after them.
  using Cfg = BwdConfig<D>;
  if (row % Cfg::kBr == 0 && part < Cfg::kDqPieces) p.dq_semaphore[row_index / Cfg::kBr * Cfg::kDqPieces + part] = 0;
  if (row_index == 0 && part == 0)
    p.dq_semaphore[std::int64_t(p.batch) * p.heads_q * (padded_rows / Cfg::kBr) * Cfg::kDqPieces] = 0;
  if (part == 0) {
    p.D_i[row_index] = sum;
    p.lse_log2[row_index] = lse2;
  }
}

// ---- producer ---------------------------------------------------------------------------------------------

struct BwdMaps {
  CUtensorMap q, k, v, d_o;
};

// One elected thread: K_j and V_j once, then each step's Q_i, dO_i, L_i and D_i into stage step % kStages,
// once the consumers have released it.
template <int D, bool kDropout, bool kTimeline>
__device__ void produce(const Params& p, const BwdMaps& maps, const KeyBlock& kb, unsigned char* smem, std::uint64_t* bars,
                        TimelineLane<kTimeline>& tl) {
  using Cfg = BwdConfig<D, kDropout>;
  using TL = TimelineLane<kTimeline>;
  constexpr int kPanels = D / kPanelCols;
  if (kb.n_steps == 0) return;  // no query sees the block: dK_j = dV_j = 0, nothing to load
  tl.instant(p, PipelineEvent::TmaIssue, TL::now());
  mbar_arrive_expect_tx(&bars[Cfg::kKVFull], 2 * Cfg::kKVBytes);
#pragma unroll
  for (int pnl = 0; pnl < kPanels; ++pnl) {
    tma_load_4d(smem + Cfg::kKOffset + pnl * Cfg::kBc * kPanelRowBytes, &maps.k, pnl * kPanelCols, kb.h_kv, kb.key0, kb.b,
                &bars[Cfg::kKVFull]);
    tma_load_4d(smem + Cfg::kVOffset + pnl * Cfg::kBc * kPanelRowBytes, &maps.v, pnl * kPanelCols, kb.h_kv, kb.key0, kb.b,
                &bars[Cfg::kKVFull]);
  }
  const int padded_rows = kb.n_q * Cfg::kBr;
  for (int step = 0; step < kb.n_steps; ++step) {
    const int stage = step % kStages;
    const std::uint64_t t0 = TL::now();
    mbar_wait(&bars[Cfg::kEmpty + stage], ((step / kStages) & 1) ^ 1);
    const std::uint64_t t1 = TL::now();
    tl.waited(p, t0, t1);
    tl.instant(p, PipelineEvent::TmaIssue, t1);
    const int h = kb.head(step), row0 = kb.q_block(step) * Cfg::kBr;
    std::uint64_t* full = &bars[Cfg::kFull + stage];
    mbar_arrive_expect_tx(full, Cfg::kStepTxBytes);
#pragma unroll
    for (int pnl = 0; pnl < kPanels; ++pnl) {
      tma_load_4d(smem + Cfg::kQOffset + stage * Cfg::kQBytes + pnl * Cfg::kBr * kPanelRowBytes, &maps.q, pnl * kPanelCols, h,
                  row0, kb.b, full);
      tma_load_4d(smem + Cfg::kDOOffset + stage * Cfg::kQBytes + pnl * Cfg::kBr * kPanelRowBytes, &maps.d_o, pnl * kPanelCols,
                  h, row0, kb.b, full);
    }
    const std::int64_t stats = (std::int64_t(kb.b) * p.heads_q + h) * padded_rows + row0;
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + Cfg::kLOffset + stage * Cfg::kRowStatBytes,
                       p.lse_log2 + stats, Cfg::kRowStatBytes, full);
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + Cfg::kDiOffset + stage * Cfg::kRowStatBytes,
                       p.D_i + stats, Cfg::kRowStatBytes, full);
  }
}

// ---- consumer ---------------------------------------------------------------------------------------------

// Spins until *counter == value (acquire: the K/V blocks counted there have finished their additions), with
// kSleepNs of __nanosleep between polls where the poller has nothing else to do (dQ's conversion).
template <unsigned kSleepNs = 0>
__device__ __forceinline__ void wait_counter(const int* counter, int value) {
  int seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
    if (seen == value) return;
    if constexpr (kSleepNs > 0) __nanosleep(kSleepNs);
  }
}
// Orders this thread's async-proxy (bulk copy) global accesses with its generic ones.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// How many additions to consumer c's dQ piece of Q_i come before its own in deterministic mode (DqSplit::Keys:
// both consumers of a block add to the same piece, consumer 0 first). Without a causal mask K/V block 0 adds
// first, then 1, 2, ...: every block walks the query blocks from the first. Under a causal mask block j
// starts at query block i_first(j), later than block j - 1 does, so in that order it would reach every query
// block before its predecessor and wait there, and the blocks would run one after another: the order is
// reversed instead (the last K/V block that sees Q_i adds first), so that each block's predecessor in the
// order is ahead of it in its walk (and key_block launches the blocks in that order).
template <int kBr, int kBc, int kDqPieces>
__device__ int dq_turn(const Params& p, const KeyBlock& kb, int i, int c) {
  int turn = kb.j;
  if (p.align != CausalAlign::None) {
    const int last_row = min((i + 1) * kBr, p.seq_q) - 1;
    turn = last_visible_key(p.align, last_row, p.seq_q, p.seq_k) / kBc - kb.j;
  }
  return kDqPieces > 1 ? turn : kConsumers * turn + c;
}

// How many additions a piece of dQ_i receives in all, and so the count its counter reaches once its sum is
// complete: one per K/V block that sees query block i (every block without a causal mask; with one, blocks
// 0 .. the one holding the block's last row's last visible key), and at d = 64 (one piece, both consumers add
// to it) one per consumer of each. dq_turn numbers them 0 .. this - 1 in deterministic mode.
template <int kBr, int kBc, int kDqPieces>
__device__ int dq_additions(const Params& p, int i) {
  int blocks = (p.seq_k + kBc - 1) / kBc;
  if (p.align != CausalAlign::None) {
    const int key = last_visible_key(p.align, min((i + 1) * kBr, p.seq_q) - 1, p.seq_q, p.seq_k);
    blocks = key < 0 ? 0 : key / kBc + 1;
  }
  return kDqPieces > 1 ? blocks : kConsumers * blocks;
}

// Counts one completed addition to dQ_accum's piece `piece` (release: the conversion that reads the count
// sees the sum it counts).
__device__ __forceinline__ void count_dq_addition(const Params& p, std::int64_t piece) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(p.dq_semaphore + piece) : "memory");
}

// Where consumer c's piece of dQ_i (head h) lies in dQ_accum (in pieces) and among the counters: over (B, H_q, query
// block i, piece), the one piece of a query block at d = 64.
template <class Cfg>
__device__ std::int64_t dq_piece_index(const Params& p, const KeyBlock& kb, int h, int i, int c) {
  return ((std::int64_t(kb.b) * p.heads_q + h) * kb.n_q + i) * Cfg::kDqPieces + (Cfg::kDqPieces > 1 ? c : 0);
}

// Adds staged piece `staging` (consumer c, query block i of head h) to dQ_accum with one bulk reduction. In
// deterministic mode after the pieces before it in dq_turn's order, then waits for it to complete and counts
// it; otherwise write_dq counts it a step later.
template <class Cfg>
__device__ void reduce_dq_piece(const Params& p, const KeyBlock& kb, const float* staging, int h, int i, int c) {
  const std::int64_t piece = dq_piece_index<Cfg>(p, kb, h, i, c);
  if (p.deterministic) {
    wait_counter(p.dq_semaphore + piece, dq_turn<Cfg::kBr, Cfg::kBc, Cfg::kDqPieces>(p, kb, i, c));
    fence_proxy_async_global();
  }
  ptx::cp_reduce_async_bulk(ptx::space_global, ptx::space_shared, ptx::op_add, p.dq_accum + piece * Cfg::kDqPieceFloats,
                            staging, Cfg::kDqBytes);
  ptx::cp_async_bulk_commit_group();
  if (p.deterministic) {
    ptx::cp_async_bulk_wait_group(ptx::n32_t<0>{});  // the addition is done in global memory
    fence_proxy_async_global();
    count_dq_addition(p, piece);
  }
}

// Default mode: counts the additions of steps [from, to) once they are complete, that is once at most kPending
// bulk groups issued after them are pending: one fence, then a relaxed addition per piece (release by the fence).
// Lane 0.
constexpr int kDqCountSteps = 8;  // steps counted at a time
template <class Cfg, int kPending>
__device__ void count_dq_steps(const Params& p, const KeyBlock& kb, int from, int to) {
  ptx::cp_async_bulk_wait_group(ptx::n32_t<kPending>{});
  fence_proxy_async_global();
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
#pragma unroll 1
  for (int m = from; m < to; ++m) {
    const std::int64_t first = dq_piece_index<Cfg>(p, kb, kb.head(m), kb.q_block(m), 0);
#pragma unroll
    for (int c = 0; c < Cfg::kDqPieces; ++c)  // d = 64: one piece, both consumers' additions
      asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;\n" ::"l"(p.dq_semaphore + first + c), "r"(kConsumers / Cfg::kDqPieces)
                   : "memory");
  }
}

// The dQ writer (the producer warpgroup's second warp): per step, takes each consumer's staged piece
// as it is handed over, adds it, and hands the buffer back once the copy engine has read it. Every addition is
// counted once complete, and convert_dq_kernel converts a piece once its count is full. Deterministic mode
// counts at once; otherwise kDqCountSteps steps at a time, with one fence, once the last of them is a step old.
template <int D, bool kDropout>
__device__ void write_dq(const Params& p, const KeyBlock& kb, unsigned char* smem, int lane) {
  using Cfg = BwdConfig<D, kDropout>;
#pragma unroll 1
  for (int n = 0; n < kb.n_steps; ++n) {
    if (lane == 0 && !p.deterministic && n > kDqCountSteps && (n - 1) % kDqCountSteps == 0)  // step n - 1's may pend
      count_dq_steps<Cfg, kConsumers>(p, kb, n - 1 - kDqCountSteps, n - 1);
    const int b = n % kDqBuffers, h = kb.head(n), i = kb.q_block(n);
#pragma unroll
    for (int c = 0; c < kConsumers; ++c) {
      named_barrier_sync(kBarDqFull + 2 * c + b, kDqHandoffThreads);
      if (lane == 0)
        reduce_dq_piece<Cfg>(p, kb, reinterpret_cast<const float*>(smem + Cfg::kDqOffset + (c * kDqBuffers + b) * Cfg::kDqBytes), h, i, c);
      __syncwarp();
    }
    if (n + kDqBuffers < kb.n_steps) {
      if (lane == 0) ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kConsumers; ++c) named_barrier_arrive(kBarDqEmpty + 2 * c + b, kDqHandoffThreads);
    }
  }
  if (lane == 0) {
    if (!p.deterministic) count_dq_steps<Cfg, 0>(p, kb, (kb.n_steps - 2) / kDqCountSteps * kDqCountSteps, kb.n_steps);
    ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{});  // staging read before the block exits
  }
}

// kAccumulate: dK_j, dV_j added to p.dk_sum, p.dv_sum in fp32 (a ring's block) rather than written to p.dk, p.dv. A
// template parameter, so that the shipped kernel's code is what it was without the mode.
template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false>
struct Consumer {
  using Cfg = BwdConfig<D, kDropout>;
  static constexpr bool kDefer = Cfg::kDeferDq;
  using TL = TimelineLane<kTimeline>;
  static constexpr int kBr = Cfg::kBr, kBc = Cfg::kBc, kNS = Cfg::kNS, kNKV = Cfg::kNKV, kNQ = Cfg::kNQ,
                       kKSteps = Cfg::kKSteps, kPackSteps = Cfg::kPackSteps, kPieces = Cfg::kDqPiecesPerConsumer;
  static constexpr bool kKvByKeys = Cfg::kKvByKeys;
  static constexpr int kKeepWords = (kNS / 2 + 31) / 32;
  const Params& p;
  const KeyBlock& kb;
  unsigned char* smem;
  std::uint64_t* bars;
  int c;           // consumer index: keys 64 c .. 64 c + 63 of the block (KvSplit::Keys), or its half (Columns)
  int tid;         // thread index within the warpgroup
  int warp, g, t;  // warp in the warpgroup, lane / 4, lane % 4
  mutable TL tl{};  // this warpgroup's timeline lane (thread 0 records)

  __device__ std::uint32_t k_addr() const { return smem_u32(smem + Cfg::kKOffset); }
  __device__ std::uint32_t q_addr(int stage) const { return smem_u32(smem + Cfg::kQOffset + stage * Cfg::kQBytes); }
  __device__ std::uint32_t do_addr(int stage) const { return smem_u32(smem + Cfg::kDOOffset + stage * Cfg::kQBytes); }
  __device__ unsigned char* ds_tile(int buffer) const { return smem + Cfg::kDsOffset + buffer * Cfg::kDsBytes; }
  __device__ unsigned char* pt_tile(int buffer) const { return smem + Cfg::kPtOffset + buffer * Cfg::kDsBytes; }
  // This consumer's keys of the block: its 64 rows (Keys), or all 64 (Columns).
  __device__ int key_row0() const { return kKvByKeys ? c * kKeysPerConsumer : 0; }
  __device__ std::uint32_t my_rows(std::uint32_t tile) const { return tile + key_row0() * kPanelRowBytes; }
  // This consumer's first query of the step's S^T, dP^T (within the block of Br), and first column of dK_j, dV_j.
  __device__ int query0() const { return kKvByKeys ? 0 : c * Cfg::kSQueries; }
  __device__ int kv_col0() const { return kKvByKeys ? 0 : c * Cfg::kKvCols; }
  // Key of this thread's accumulator rows (half hf): 16 warp + g + 8 hf of the consumer's 64.
  __device__ int key_of(int hf) const { return kb.key0 + key_row0() + 16 * warp + g + 8 * hf; }

  // One arrival per consumer warp (the empty barriers count 4 per consumer).
  __device__ void release(int bar) const {
    __syncwarp();
    if (tid % 32 == 0) mbar_arrive(&bars[bar]);
  }

  // A^T-form products of this consumer's 64 keys: acc = X_c Y^T with X_c its rows of K_j or V_j and Y its queries
  // of Q_i or dO_i (both K-major): S_ij^T or dP_ij^T, (64, kSQueries).
  __device__ void issue_transposed(float (&acc)[kNS], std::uint32_t x_tile, std::uint32_t y_tile) const {
    const std::uint32_t xa = opaque(my_rows(x_tile)), ya = opaque(y_tile + query0() * kPanelRowBytes);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_ss<T, Cfg::kSQueries>(acc, desc_k_major(xa, kBc, kk), desc_k_major(ya, kBr, kk), kk > 0 ? 1 : 0);
  }
  // acc (64, kKvCols) += A (64, Br) Y (Br, kKvCols), Y = this consumer's columns of dO_i or Q_i, MN-major. Keys: A
  // (P^T or dS^T) from the registers; Columns: from its (Bc, Br) tile in shared memory, K-major.
  __device__ void issue_accumulate(float (&acc)[kNKV], const std::uint32_t (&a)[kPackSteps][4], std::uint32_t a_tile,
                                   std::uint32_t y_tile) const {
    const std::uint32_t ya = opaque(y_tile + kv_col0() / kPanelCols * kBr * kPanelRowBytes);
    if constexpr (kKvByKeys) {
      (void)a_tile;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) wgmma_rs<T, Cfg::kKvCols>(acc, a[ks], desc_mn_major(ya, kBr, ks), 1);
    } else {
      (void)a;
      const std::uint32_t aa = opaque(a_tile);
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        wgmma_ss_nt<T, Cfg::kKvCols>(acc, desc_k_major(aa, kBc, ks), desc_mn_major(ya, kBr, ks), 1);
    }
  }
  // This consumer's 64 x 64 piece pc of dQ_i = dS_ij K_j (DqSplit): dS from the dS^T tile (keys, queries), K_j
  // from its (keys, d) tile, both MN-major. Columns: K_j's panel c kPieces + pc, summed over all Bc keys; Keys:
  // this consumer's 64 rows of both tiles.
  __device__ void issue_dq(float (&dq)[kNQ], int buffer, int pc) const {
    constexpr bool kByKeys = Cfg::kDqSplit == DqSplit::Keys;
    constexpr int kKeys = kByKeys ? kKeysPerConsumer : kBc;
    const std::uint32_t ds = smem_u32(ds_tile(buffer)) + (kByKeys ? c * kKeysPerConsumer * kPanelRowBytes : 0);
    const std::uint32_t k =
        k_addr() + (kByKeys ? c * kKeysPerConsumer * kPanelRowBytes : (c * kPieces + pc) * kBc * kPanelRowBytes);
    const std::uint32_t dsa = opaque(ds), ka = opaque(k);
#pragma unroll
    for (int s = 0; s < kKeys / 16; ++s) wgmma_ss_tt<T, 64>(dq, desc_mn_major(dsa, kBc, s), desc_mn_major(ka, kBc, s), s > 0 ? 1 : 0);
  }
  // Where the tiles are complete enough for this consumer's GEMMs: both consumers' halves (P^T and dS^T under
  // KvSplit::Columns; dS^T under DqSplit::Columns), or its own.
  __device__ void sync_tiles_written() const {
    if constexpr (Cfg::kDqSplit == DqSplit::Columns || !kKvByKeys) named_barrier_sync(kBarDsWritten, kConsumers * kWarpgroupThreads);
    else named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);
  }

  // Keep bits of this thread's elements of P_ij^T (bit 2 i + e of word hf: query column query0 + 8 i + 2 t + e, key
  // key_of(hf)): one Philox draw per element, as the forward's mask (core/philox.hpp) has it. Transposed, a
  // thread's keys are not four in a row, so each draw serves one element (slower, and exact).
  __device__ void keep_bits(int h, int row0, std::uint32_t (&keep)[2][kKeepWords]) const {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int key = key_of(hf);
#pragma unroll
      for (int w = 0; w < kKeepWords; ++w) keep[hf][w] = 0u;
#pragma unroll 1
      for (int i = 0; i < kNS / 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int bit = 2 * i + e;
          if (dropout_keep(p.seed, p.drop_threshold, kb.b, h, row0 + query0() + 8 * i + 2 * t + e, key))
            keep[hf][bit / 32] |= 1u << (bit % 32);
        }
    }
  }

  // Writes this consumer's packed (64 keys, kSQueries) part of P^T or dS^T into a (Bc, Br) tile: register pair
  // x[ks][q] is key row key_row0 + 16 warp + g + 8 (q % 2), query columns query0 + 16 ks + 8 (q / 2) + 2 t, + 1.
  __device__ void store_tile(std::uint32_t tile, const std::uint32_t (&x)[kPackSteps][4]) const {
#pragma unroll
    for (int ks = 0; ks < kPackSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = key_row0() + 16 * warp + g + 8 * (q % 2), col = query0() + 16 * ks + 8 * (q / 2) + 2 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(tile + swizzle128_offset(row, col, kBc)), "r"(x[ks][q]) : "memory");
      }
  }

  // Stages this consumer's dQ piece in shared memory in register order (thread tid's registers 4 q .. 4 q + 3 at
  // float4 q * 128 + tid).
  __device__ void stage_dq(float* staging, const float (&dq)[kNQ]) const {
    const std::uint32_t at = smem_u32(staging) + tid * 16;
#pragma unroll
    for (int q = 0; q < kNQ / 4; ++q)
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at + q * kWarpgroupThreads * 16), "f"(dq[4 * q]),
                   "f"(dq[4 * q + 1]), "f"(dq[4 * q + 2]), "f"(dq[4 * q + 3])
                   : "memory");
    fence_proxy_async_smem();
  }
  // Stages the piece of step n in buffer n % 2 (once the writer has handed it back) and hands it to the writer
  // warp.
  __device__ void hand_dq_piece(const float (&dq)[kNQ], int n) const {
    const int b = n % kDqBuffers;
    if (n >= kDqBuffers) {
      const std::uint64_t t0 = TL::now();
      named_barrier_sync(kBarDqEmpty + 2 * c + b, kDqHandoffThreads);
      tl.waited(p, t0, TL::now());
    }
    stage_dq(reinterpret_cast<float*>(smem + Cfg::kDqOffset + (c * kDqBuffers + b) * Cfg::kDqBytes), dq);
    named_barrier_arrive(kBarDqFull + 2 * c + b, kDqHandoffThreads);
  }
  // Without a writer warp (DqSplit::Columns at d = 256): adds this consumer's pieces of dQ_i (head h, query block i)
  // to dQ_accum from the registers, in the staged layout (float4 q * 128 + tid of each piece). Deterministic: after
  // the pieces' earlier additions (dq_turn), and counted once every thread's are issued (the barrier orders them
  // before thread 0's release). Without a writer the conversion waits for the whole main kernel instead: counted
  // in default mode too, the barrier and fence each step made the d = 256 backward 40% slower on the H100.
  __device__ void add_dq_pieces(const float (&dq)[kPieces][kNQ], int h, int i) const {
    const std::int64_t first = dq_piece_index<Cfg>(p, kb, h, i, 0) + c * kPieces;
    if (p.deterministic) {
      if (tid == 0) {
        const int turn = dq_turn<kBr, kBc, Cfg::kDqPieces>(p, kb, i, c);
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) wait_counter(p.dq_semaphore + first + pc, turn);
      }
      named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);
    }
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      float* at = p.dq_accum + (first + pc) * Cfg::kDqPieceFloats + tid * 4;
#pragma unroll
      for (int q = 0; q < kNQ / 4; ++q)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at + q * kWarpgroupThreads * 4),
                     "f"(dq[pc][4 * q]), "f"(dq[pc][4 * q + 1]), "f"(dq[pc][4 * q + 2]), "f"(dq[pc][4 * q + 3])
                     : "memory");
    }
    if (p.deterministic) {
      named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);
      if (tid == 0) {
        __threadfence();
#pragma unroll
        for (int pc = 0; pc < kPieces; ++pc) count_dq_addition(p, first + pc);
      }
    }
  }
  // Sends step n's pieces of dQ_i out: to the writer warp, or straight to dQ_accum.
  __device__ void send_dq(const float (&dq)[kPieces][kNQ], int n, int h, int i) const {
    if constexpr (Cfg::kDqWriter) {
      static_assert(kPieces == 1, "the writer warp takes one piece per consumer and step");
      (void)h, (void)i;
      hand_dq_piece(dq[0], n);
    } else {
      (void)n;
      add_dq_pieces(dq, h, i);
    }
  }

  // One step: query block i of query head h, stage `stage` of the pipeline.
  __device__ void step(int n, float (&dk)[kNKV], float (&dv)[kNKV]) const {
    const int stage = n % kStages;
    const int h = kb.head(n), i = kb.q_block(n), row0 = i * kBr;
    std::uint64_t t0 = TL::now();
    mbar_wait(&bars[Cfg::kFull + stage], (n / kStages) & 1);
    const std::uint64_t landed = TL::now();
    tl.waited(p, t0, landed);
    tl.instant(p, PipelineEvent::TmaLanded, landed);

    if constexpr (kDefer)  // consumer 1 starts once consumer 0 is through its first pointwise part
      if (n == 0 && c == 1) named_barrier_sync(kBarDsWritten, kConsumers * kWarpgroupThreads);
    // S_ij^T = K_j Q_i^T and dP_ij^T = V_j dO_i^T (this consumer's keys and queries), one group each.
    float st[kNS], dpt[kNS];
    tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
    wgmma_fence();
    issue_transposed(st, smem_u32(smem + Cfg::kKOffset), q_addr(stage));
    wgmma_commit_group();
    issue_transposed(dpt, smem_u32(smem + Cfg::kVOffset), do_addr(stage));
    wgmma_commit_group();
    wgmma_wait_group<1>();
    reg_fence(st);
    const std::uint64_t pointwise = TL::now();
    tl.instant(p, PipelineEvent::WgmmaWait, pointwise);

    // P_ij^T = exp2(scale log2(e) S^T - L_i log2(e)), L_i per column; the causal mask only on blocks that cross
    // the diagonal. Columns of this thread: query0 + 8 i + 2 t + e.
    const float* L = reinterpret_cast<const float*>(smem + Cfg::kLOffset + stage * Cfg::kRowStatBytes) + query0();
#pragma unroll
    for (int ii = 0; ii < kNS / 4; ++ii) {
      const float2 l = *reinterpret_cast<const float2*>(L + 8 * ii + 2 * t);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        st[4 * ii + 2 * hf] = fast_exp2(fmaf(st[4 * ii + 2 * hf], p.scale_log2, -l.x));
        st[4 * ii + 2 * hf + 1] = fast_exp2(fmaf(st[4 * ii + 2 * hf + 1], p.scale_log2, -l.y));
      }
    }
    const int q_row0 = row0 + query0();
    if (p.align != CausalAlign::None &&
        tile_needs_mask(p.align, q_row0, kb.key0 + key_row0() + kKeysPerConsumer, p.seq_q, p.seq_k)) {
#pragma unroll
      for (int ii = 0; ii < kNS / 4; ++ii)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int last = last_visible_key(p.align, q_row0 + 8 * ii + 2 * t + e, p.seq_q, p.seq_k);
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            if (key_of(hf) > last) st[4 * ii + 2 * hf + e] = 0.f;
        }
    }

    // dS_ij^T = P_ij^T o (dP_ij^T o Z - D_i), D_i per column, Z the dropout mask scaled by 1 / (1 - p). P^T o Z and
    // dS^T are packed (group ks is query columns 16 ks .. 16 ks + 15: registers 8 ks .. 8 ks + 7; under KvSplit::Keys
    // the A fragments of dV_j += (P_ij o Z)^T dO_i and dK_j += dS_ij^T Q_i), both before either GEMM is issued, so
    // that S^T and dP^T (fp32) are dead when the packed pairs and the GEMMs' accumulators are live: dK_j and dV_j
    // alone take 128 registers.
    std::uint32_t keep[2][kKeepWords] = {};
    if constexpr (kDropout) keep_bits(h, row0, keep);
    else (void)keep;
    auto z = [&](int hf, int ii, int e) {
      if constexpr (kDropout) {
        const int bit = 2 * ii + e;
        return (keep[hf][bit / 32] >> (bit % 32)) & 1u ? p.drop_rescale : 0.f;
      } else {
        (void)hf, (void)ii, (void)e;
        return 1.f;
      }
    };
    wgmma_wait_group<0>();
    reg_fence(dpt);
    const float* Di = reinterpret_cast<const float*>(smem + Cfg::kDiOffset + stage * Cfg::kRowStatBytes) + query0();
    std::uint32_t pf[kPackSteps][4], dsf[kPackSteps][4];
#pragma unroll
    for (int ks = 0; ks < kPackSteps; ++ks)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int r = 8 * ks + 2 * q, ii = r / 4, hf = (r / 2) % 2;
        const float2 d = *reinterpret_cast<const float2*>(Di + 8 * ii + 2 * t);
        const float z0 = z(hf, ii, 0), z1 = z(hf, ii, 1);
        dsf[ks][q] = pack2<T>(st[r] * (dpt[r] * z0 - d.x), st[r + 1] * (dpt[r + 1] * z1 - d.y));
        pf[ks][q] = pack2<T>(st[r] * z0, st[r + 1] * z1);
      }
    tl.span(p, PipelineEvent::Softmax, pointwise);  // the pointwise part: P^T, dS^T (with dP^T's wait)
    const std::uint32_t ds = smem_u32(ds_tile(n % 2)), pt = smem_u32(pt_tile(n % 2));
    if constexpr (kDefer) {
      if (n == 0 && c == 0) named_barrier_arrive(kBarDsWritten, kConsumers * kWarpgroupThreads);  // consumer 1 may start
      if (n > 0) {  // the other consumer finished step n - 1: its half of dS^T(n - 1) is there, buffer n % 2 is free
        t0 = TL::now();
        named_barrier_sync(kBarStepDone + 2 * (1 - c) + (n - 1) % 2, kConsumers * kWarpgroupThreads);
        tl.waited(p, t0, TL::now());
      }
      store_tile(ds, dsf);
      fence_proxy_async_smem();
      float dq[kNQ];
      tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
      wgmma_fence();
      // dQ of step n - 1 (at n = 0 the product of a buffer not yet written, issued so that every step runs the
      // same wgmma sequence, and dropped).
      issue_dq(dq, (n + 1) % 2, 0);
      wgmma_commit_group();
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
      wgmma_wait_group<1>();
      reg_fence(dq);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      // Step n is done as far as the other consumer is concerned (dS^T(n) written, buffer (n + 1) % 2 read): say so
      // now rather than after dV_j and dK_j, which it does not need (side by side at d = 128, N = 4k-16k on the H100:
      // -1% to +9%, +3% on average).
      named_barrier_arrive(kBarStepDone + 2 * c + n % 2, kConsumers * kWarpgroupThreads);
      if (n > 0) hand_dq_piece(dq, n - 1);
      wgmma_wait_group<0>();
      reg_fence(dk);
      reg_fence(dv);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      release(Cfg::kEmpty + stage);
      return;
    }
    if constexpr (!Cfg::kDqFirst) {  // dV_j += (P_ij o Z)^T dO_i and dK_j += dS_ij^T Q_i now (KvSplit::Keys)
      static_assert(kKvByKeys, "dV and dK read P^T and dS^T from shared memory under KvSplit::Columns: they wait for the barrier");
      wgmma_fence();
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
    }

    // dS_ij^T (and, Columns, P_ij^T) into shared memory, buffer n % 2: two buffers, one barrier per step. A
    // consumer writes buffer n % 2 only after both passed step n - 1's barrier, i.e. after the other's GEMMs of
    // step n - 2 were done.
    store_tile(ds, dsf);
    if constexpr (!kKvByKeys) store_tile(pt, pf);
    fence_proxy_async_smem();
    t0 = TL::now();
    sync_tiles_written();
    tl.waited(p, t0, TL::now());

    // dQ_i's pieces (dS_ij K_j), then (kDqFirst) dV_j and dK_j behind them: the pieces are waited for and sent out
    // while those two run.
    float dq[kPieces][kNQ];
    tl.instant(p, PipelineEvent::WgmmaIssue, TL::now());
    wgmma_fence();
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) issue_dq(dq[pc], n % 2, pc);
    wgmma_commit_group();
    if constexpr (Cfg::kDqFirst) {
      issue_accumulate(dv, pf, pt, do_addr(stage));
      issue_accumulate(dk, dsf, ds, q_addr(stage));
      wgmma_commit_group();
      wgmma_wait_group<1>();
      reg_fence(dq);
      tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
      send_dq(dq, n, h, i);
    }
    wgmma_wait_group<0>();
    reg_fence(dq);
    reg_fence(dk);
    reg_fence(dv);
    tl.instant(p, PipelineEvent::WgmmaWait, TL::now());
    release(Cfg::kEmpty + stage);  // Q_i, dO_i, L_i, D_i are read
    if constexpr (!Cfg::kDqFirst) send_dq(dq, n, h, i);
  }

  // dK_j = scale dK_j and dV_j in the input dtype: this consumer's rows and columns into the Q_i, dO_i stages, which
  // no step reads any more (dK_j, then dV_j, each (Bc, d) and swizzled like K_j), then 16-byte coalesced stores,
  // rows past the end of the keys dropped. Stored straight from the registers (two columns a thread, eight rows
  // a warp per store), they took 5.6 us of a 105-us block at d = 128, N = 2k on the H100.
  __device__ void epilogue(float (&dk)[kNKV], float (&dv)[kNKV]) const {
    if constexpr (kAccumulate) {  // add to the fp32 sums straight from the registers
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int key = key_of(hf);
        if (key >= p.seq_k) continue;
        const std::int64_t row = ((std::int64_t(kb.b) * p.seq_k + key) * p.heads_kv + kb.h_kv) * D;
#pragma unroll
        for (int ii = 0; ii < kNKV / 4; ++ii) {
          const int col = kv_col0() + 8 * ii + 2 * t;
          auto* at_k = reinterpret_cast<float2*>(p.dk_sum + row + col);
          auto* at_v = reinterpret_cast<float2*>(p.dv_sum + row + col);
          const float2 sk = *at_k, sv = *at_v;
          *at_k = make_float2(sk.x + dk[4 * ii + 2 * hf] * p.scale, sk.y + dk[4 * ii + 2 * hf + 1] * p.scale);
          *at_v = make_float2(sv.x + dv[4 * ii + 2 * hf], sv.y + dv[4 * ii + 2 * hf + 1]);
        }
      }
      return;
    }
    static_assert(2 * Cfg::kKVBytes <= 2 * kStages * Cfg::kQBytes && Cfg::kDOOffset == Cfg::kQOffset + kStages * Cfg::kQBytes,
                  "dK_j and dV_j fit the Q_i and dO_i stages");
    // The other consumer's last GEMMs may still read the stages: both meet first (the consumers' one shared barrier;
    // both have used it equally often by now, so this is a fresh round of it).
    named_barrier_sync(kBarDsWritten, kConsumers * kWarpgroupThreads);
    unsigned char* const staged = smem + Cfg::kQOffset;  // dK_j, then dV_j kKVBytes further
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = key_row0() + 16 * warp + g + 8 * hf;
#pragma unroll
      for (int ii = 0; ii < kNKV / 4; ++ii) {
        const std::uint32_t at = swizzle128_offset(r, kv_col0() + 8 * ii + 2 * t, kBc);
        *reinterpret_cast<std::uint32_t*>(staged + at) = pack2<T>(dk[4 * ii + 2 * hf] * p.scale, dk[4 * ii + 2 * hf + 1] * p.scale);
        *reinterpret_cast<std::uint32_t*>(staged + Cfg::kKVBytes + at) = pack2<T>(dv[4 * ii + 2 * hf], dv[4 * ii + 2 * hf + 1]);
      }
    }
    named_barrier_sync(kBarConsumerBase + c, kWarpgroupThreads);
    constexpr int kChunks = Cfg::kKvCols / 8;  // 16-byte chunks of a row of this consumer's columns
#pragma unroll 4
    for (int idx = tid; idx < 2 * kKeysPerConsumer * kChunks; idx += kWarpgroupThreads) {
      const int which = idx / (kKeysPerConsumer * kChunks), r = key_row0() + (idx / kChunks) % kKeysPerConsumer;
      const int col = kv_col0() + 8 * (idx % kChunks), key = kb.key0 + r;
      if (key >= p.seq_k) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(staged + which * Cfg::kKVBytes + swizzle128_offset(r, col, kBc));
      *reinterpret_cast<uint4*>(static_cast<T*>(which == 0 ? p.dk : p.dv) + ((std::int64_t(kb.b) * p.seq_k + key) * p.heads_kv + kb.h_kv) * D + col) = v;
    }
  }

  __device__ void run() const {
    float dk[kNKV], dv[kNKV];  // dK_j, dV_j  // (64 keys, d) per consumer
#pragma unroll
    for (int r = 0; r < kNKV; ++r) dk[r] = dv[r] = 0.f;
    if (kb.n_steps > 0) {
      mbar_wait(&bars[Cfg::kKVFull], 0);
#pragma unroll 1
      for (int n = 0; n < kb.n_steps; ++n) {
        // Opaque copies of the thread's indices and bases: what is derived from them (swizzled offsets,
        // descriptors) is recomputed in the step rather than held live across the loop beside dK_j and dV_j
        // (d = 128: 16 bytes spilled without).
        Consumer self = *this;
        self.smem = opaque(smem);
        self.bars = opaque(bars);
        self.c = opaque(c);
        self.tid = opaque(tid);
        self.warp = opaque(warp);
        self.g = opaque(g);
        self.t = opaque(t);
        self.step(n, dk, dv);
        tl = self.tl;  // the timeline lane's slot state goes on to the next step
      }
      if constexpr (kDefer) {  // the last step's dQ_i
        const int n = kb.n_steps;
        named_barrier_sync(kBarStepDone + 2 * (1 - c) + (n - 1) % 2, kConsumers * kWarpgroupThreads);
        float dq[kNQ];
        wgmma_fence();
        issue_dq(dq, (n - 1) % 2, 0);
        wgmma_commit_group();
        wgmma_wait_group<0>();
        reg_fence(dq);
        hand_dq_piece(dq, n - 1);
      }
    }
    const std::uint64_t t0 = TL::now();
    epilogue(dk, dv);
    tl.span(p, PipelineEvent::Epilogue, t0);
  }
};

// ---- kernel -----------------------------------------------------------------------------------------------

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false>
__global__ void __launch_bounds__(kThreads, 1)
    fa3_ws_backward_kernel(const __grid_constant__ Params p, const __grid_constant__ BwdMaps maps) {
  using Cfg = BwdConfig<D, kDropout>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSwizzleAtomBytes - smem_u32(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  auto* bars = reinterpret_cast<std::uint64_t*>(smem + Cfg::kBarOffset);
  if (threadIdx.x == 0) {
    mbar_init(&bars[Cfg::kKVFull], 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bars[Cfg::kFull + s], 1);
      mbar_init(&bars[Cfg::kEmpty + s], kConsumers * 4);  // one arrival per consumer warp
    }
    mbar_init_fence();
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // dQ's conversion may start (convert_dq_kernel)
  const KeyBlock kb = key_block<Cfg::kBr, Cfg::kBc>(p);
  const int wg = static_cast<int>(threadIdx.x) / kWarpgroupThreads;
  const int tid = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid / 32 == 0 && elect_one()) {
      TimelineLane<kTimeline> tl;
      tl.start(p, blockIdx.y == 0);
      produce<D, kDropout>(p, maps, kb, smem, bars, tl);
    }
    if constexpr (Cfg::kDqWriter)
      if (tid / 32 == 1) write_dq<D, kDropout>(p, kb, smem, tid % 32);
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const int lane = tid % 32;
    const Consumer<T, D, kDropout, kTimeline, kAccumulate> consumer{p, kb, smem, bars, wg - 1, tid, tid / 32, lane / 4, lane % 4};
    consumer.tl.start(p, tid == 0 && blockIdx.y == 0);  // the K/V blocks j < kTimelineBlocks of (batch 0, head 0)
    consumer.run();
  }
}

// ---- dQ conversion ----------------------------------------------------------------------------------------

// dQ = scale dQ_accum in the input dtype, a piece (64 x 64) at a time, each as soon as its sum is complete: the
// kernel is launched while the main kernel runs (programmatic dependent launch, once every K/V block has started),
// so it converts on the SMs the main kernel's last wave leaves idle. A block takes the pieces in order from a
// ticket, waits until the piece's counter has all its additions (dq_additions), and converts it; at the end it
// waits for the main kernel to finish, so that work queued after the backward sees dK and dV written too.
// (Measured on the H100 at d = 128, N = 4k: as a separate pass after the main kernel it took 115 us, and the
// backward runs 7-10% faster with it overlapped; at d = 64 1-2%.) Without a writer warp (d = 256) the additions
// are not counted in default mode, and the conversion waits for the main kernel first.
// stage_dq wrote thread `thread`'s registers 4 q .. 4 q + 3 of a piece as vector q * 128 + thread, and in wgmma's
// accumulator layout (thread = 32 w + 4 g + t) those are columns cc, cc + 1 of rows r and r + 8, with r = 16 w + g
// and cc = 8 q + 2 t of the piece: two 4-byte stores of dQ per vector, read in order (coalesced). (As fast as two
// columns a thread gathered from the staged order; four vectors a thread and 16-byte stores were slower.)
constexpr int kConvertThreads = 256;
template <class T, int D>
__global__ void __launch_bounds__(kConvertThreads) convert_dq_kernel(const Params p, int n_q) {
  using Cfg = BwdConfig<D>;
  constexpr int kVectors = Cfg::kDqPieceFloats / 4;  // per piece
  static_assert(kVectors % kConvertThreads == 0, "a block converts whole pieces");
  const int pieces = p.batch * p.heads_q * n_q * Cfg::kDqPieces;  // over (B, H_q, query block i, piece c)
  int* const ticket = p.dq_semaphore + pieces;
  // d = 256 (no writer warp): not counted in default mode, so wait for the whole main kernel.
  if constexpr (!Cfg::kDqWriter) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  __shared__ int taken[2];  // double-buffered: one barrier a piece
  for (int round = 0;; ++round) {
    if (threadIdx.x == 0) {
      const int piece = atomicAdd(ticket, 1);
      if (Cfg::kDqWriter && piece < pieces)  // the main kernel's blocks are still running: poll gently
        wait_counter<500>(p.dq_semaphore + piece, dq_additions<Cfg::kBr, Cfg::kBc, Cfg::kDqPieces>(p, piece / Cfg::kDqPieces % n_q));
      taken[round % 2] = piece;
    }
    __syncthreads();
    const int piece = taken[round % 2];
    if (piece >= pieces) break;
    const int c = piece % Cfg::kDqPieces, i = piece / Cfg::kDqPieces % n_q, bh = piece / Cfg::kDqPieces / n_q;
    const int h = bh % p.heads_q, b = bh / p.heads_q;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + std::int64_t(piece) * Cfg::kDqPieceFloats);
    float4 v[kVectors / kConvertThreads];
#pragma unroll
    for (int k = 0; k < kVectors / kConvertThreads; ++k) v[k] = __ldcg(src + k * kConvertThreads + threadIdx.x);
#pragma unroll
    for (int k = 0; k < kVectors / kConvertThreads; ++k) {
      const int vec = k * kConvertThreads + static_cast<int>(threadIdx.x);
      const int q = vec / kWarpgroupThreads, thread = vec % kWarpgroupThreads;
      const int r = 16 * (thread / 32) + (thread % 32) / 4, col = c * Cfg::kDqCols + 8 * q + 2 * (thread % 4);
      const float pair[2][2] = {{v[k].x, v[k].y}, {v[k].z, v[k].w}};
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int s = i * Cfg::kBr + r + 8 * hf;
        if (s >= p.seq_q) continue;
        const std::int64_t at = ((std::int64_t(b) * p.seq_q + s) * p.heads_q + h) * D + col;
        if (p.dq_sum != nullptr) {  // accumulate mode
          float2* sum = reinterpret_cast<float2*>(p.dq_sum + at);
          const float2 was = *sum;
          *sum = make_float2(was.x + pair[hf][0] * p.scale, was.y + pair[hf][1] * p.scale);
        } else {
          *reinterpret_cast<std::uint32_t*>(static_cast<T*>(p.dq) + at) = pack2<T>(pair[hf][0] * p.scale, pair[hf][1] * p.scale);
        }
      }
    }
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// ---- host launcher ----------------------------------------------------------------------------------------

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false>
void launch_config(DType dtype, const Params& p, cudaStream_t stream) {
  using Cfg = BwdConfig<D, kDropout>;
  const int n_q = (p.seq_q + Cfg::kBr - 1) / Cfg::kBr;
  const BackwardScratchSizes sizes = backward_scratch(p.batch, p.heads_q, p.seq_q, D);
  constexpr int kStatsThreads = 256;
  row_stats_kernel<T, D><<<static_cast<unsigned>((sizes.row_stats * (D / 8) + kStatsThreads - 1) / kStatsThreads), kStatsThreads, 0, stream>>>(
      p, n_q * Cfg::kBr);
  check_cuda(cudaGetLastError(), "the row statistics launch");

  BwdMaps maps;
  maps.q = make_bshd_tensor_map(p.q, dtype, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.d_o = make_bshd_tensor_map(p.d_o, dtype, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.k = make_bshd_tensor_map(p.k, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  maps.v = make_bshd_tensor_map(p.v, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  auto kernel = fa3_ws_backward_kernel<T, D, kDropout, kTimeline, kAccumulate>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kBytes),
             "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const dim3 grid((p.seq_k + Cfg::kBc - 1) / Cfg::kBc, p.batch * p.heads_kv);
  kernel<<<grid, kThreads, Cfg::kBytes, stream>>>(p, maps);
  check_cuda(cudaGetLastError(), "the backward kernel launch");

  // The conversion may start once every block of the main kernel has (griddepcontrol.launch_dependents there):
  // enough blocks to fill the GPU, each taking pieces until none are left.
  int dev = 0, sms = 0, blocks_per_sm = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, convert_dq_kernel<T, D>, kConvertThreads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(dQ conversion)");
  cudaLaunchConfig_t config{};
  const std::int64_t pieces = sizes.semaphores - 1;
  config.gridDim = dim3(static_cast<unsigned>(std::min<std::int64_t>(pieces, std::int64_t(sms) * blocks_per_sm)));
  config.blockDim = dim3(kConvertThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, convert_dq_kernel<T, D>, p, n_q), "the dQ conversion launch");
}

std::string backward_head_dims() {
  std::string dims;
  for (std::size_t i = 0; i < std::size(kBackwardHeadDims); ++i)
    dims += (i == 0 ? "" : i + 1 == std::size(kBackwardHeadDims) ? " and " : ", ") + std::to_string(kBackwardHeadDims[i]);
  return dims;
}

// The launcher of both builds: kTimeline = false, launch_backward; true, launch_backward_timeline.
template <bool kTimeline>
void launch(DType dtype, const Params& p, cudaStream_t stream) {
  if (dtype != DType::F16 && dtype != DType::BF16) throw std::invalid_argument("cuda-fa3-ws takes f16 or bf16 inputs.");
  if (std::find(std::begin(kBackwardHeadDims), std::end(kBackwardHeadDims), p.head_dim) == std::end(kBackwardHeadDims))
    throw std::invalid_argument("cuda-fa3-ws's backward supports head dims " + backward_head_dims() + ", not " +
                                std::to_string(p.head_dim) + ".");
  require_hopper();
  if (p.lse_log2 == nullptr || p.D_i == nullptr || p.dq_accum == nullptr || p.dq_semaphore == nullptr)
    throw std::invalid_argument("cuda-fa3-ws's backward needs its scratch (lse_log2, D_i, dq_accum and dq_semaphore; "
                                "sizes from backward_scratch).");
  const int sums = (p.dq_sum != nullptr) + (p.dk_sum != nullptr) + (p.dv_sum != nullptr);
  if (sums != 0 && sums != 3)
    throw std::invalid_argument("cuda-fa3-ws's backward accumulates into fp32 sums only with all three of dq_sum, dk_sum "
                                "and dv_sum set.");
  if (sums != 0 && (p.dropout || kTimeline))
    throw std::invalid_argument("cuda-fa3-ws's backward accumulates into fp32 sums only without dropout and outside the "
                                "timeline build (a ring's block has neither).");
  if (reinterpret_cast<std::uintptr_t>(p.o) % 16 != 0 || reinterpret_cast<std::uintptr_t>(p.d_o) % 16 != 0)
    throw std::invalid_argument("cuda-fa3-ws's backward reads O and dO in 16-byte vectors: both must start at a 16-byte "
                                "aligned address.");
  if (p.seq_q == 0 || p.seq_k == 0 || p.batch == 0 || p.heads_q == 0) return;
  auto go = [&]<class T>() {
    auto with_dropout = [&]<int D>() {
      if constexpr (kTimeline) launch_config<T, D, false, true>(dtype, p, stream);  // checked: no dropout
      else if (p.dropout) launch_config<T, D, true, false>(dtype, p, stream);
      else if (p.dk_sum != nullptr) launch_config<T, D, false, false, true>(dtype, p, stream);  // a ring's block
      else launch_config<T, D, false, false>(dtype, p, stream);
    };
    if (p.head_dim == 64) with_dropout.template operator()<64>();
    else if (p.head_dim == 128) with_dropout.template operator()<128>();
    else with_dropout.template operator()<256>();
  };
  if (dtype == DType::BF16) go.template operator()<__nv_bfloat16>();
  else go.template operator()<__half>();
}

}  // namespace

BackwardScratchSizes backward_scratch(int batch, int heads_q, int seq_q, int head_dim) {
  const std::int64_t br = backward_block_rows(head_dim);
  const std::int64_t n_q = (seq_q + br - 1) / br;
  BackwardScratchSizes sizes;
  sizes.row_stats = std::int64_t(batch) * heads_q * n_q * br;
  sizes.dq_accum = sizes.row_stats * head_dim;
  sizes.semaphores = std::int64_t(batch) * heads_q * n_q * dq_pieces(head_dim) + 1;  // a counter per piece, the ticket
  return sizes;
}

void launch_backward(DType dtype, const Params& p, cudaStream_t stream) { launch<false>(dtype, p, stream); }

void launch_backward_timeline(DType dtype, const Params& p, cudaStream_t stream) {
  if (p.dropout)
    throw std::invalid_argument("cuda-fa3-ws's backward timeline build has no dropout: record a run without dropout.");
  if (p.timeline != nullptr && (p.timeline_count == nullptr || p.timeline_capacity <= 0))
    throw std::invalid_argument("cuda-fa3-ws's backward timeline build needs a record counter and a capacity above 0 "
                                "beside the record buffer.");
  launch<true>(dtype, p, stream);
}

}  // namespace flashlab::cuda::fa3_ws
