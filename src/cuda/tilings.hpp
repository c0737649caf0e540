#pragma once
// How the CUDA forward kernels cut their work, as data: tile sizes, warps, the thread blocks one SM
// holds, and the order in which the grid takes the work. The kernels compile from these numbers (or
// static_assert against them), and the registry hands them to the GPU level of the traffic model
// (model/gpu.hpp), which keeps no copy of its own. Plain C++ with no CUDA in it: a CPU-only build reads
// it too, so `flashlab trace --gpu` needs no nvcc. constexpr functions are callable from device code
// (the CUDA layer compiles with --expt-relaxed-constexpr).
//
// blocks_per_sm is stated for a Hopper SM (compute capability 9.0, the H100 and H200): 64K registers,
// 228 KiB of shared memory (1 KiB of it reserved per block), 2048 threads. Each kernel enforces the
// lower side: __launch_bounds__(threads, blocks_per_sm) caps its registers, and a static_assert checks
// its shared memory. The upper side (that no more blocks fit) follows from the register counts ptxas
// reports; `scripts/record_dram_counters.sh` records Nsight Compute's occupancy limits beside the DRAM
// counters, and tests/test_gpu_counters.cpp holds these numbers to them.
#include <cstdint>

#include "core/problem.hpp"

namespace flashlab::cuda {

// One kernel's tiles: Br query rows by Bc keys; warps per thread block; thread blocks per SM.
struct KernelTiling {
  int Br = 0, Bc = 0, warps = 0, blocks_per_sm = 0;
};

inline constexpr int kWarpSize = 32;
inline constexpr int kSharedMemoryPerSm = 228 * 1024;
inline constexpr int kSharedMemoryReservedPerBlock = 1024;
// Whether `blocks` thread blocks of `bytes_per_block` dynamic shared memory fit one Hopper SM together.
constexpr bool shared_memory_fits(std::int64_t bytes_per_block, int blocks) {
  return blocks * (bytes_per_block + kSharedMemoryReservedPerBlock) <= kSharedMemoryPerSm;
}

// cuda-naive (naive.cu): three kernels per (batch, query head of a group), S = scale QK^T and O = PV on
// simple_gemm (one thread per element of a 16 x 16 tile of C, 8 warps), and a row softmax between them
// (one warp per row, 8 rows per block) that reads each row of S three times (its max, its sum, then
// P = exp(S - max) / sum written beside it).
namespace unfused {
inline constexpr KernelTiling kGemmTiling{.Br = 16, .Bc = 16, .warps = 8, .blocks_per_sm = 8};
inline constexpr int kSoftmaxRowsPerBlock = 8;
inline constexpr int kSoftmaxBlocksPerSm = 5;  // 48 registers x 256 threads: 5 blocks of the 64K
inline constexpr int kSoftmaxReadsOfS = 3;
}  // namespace unfused

// The head dim the fused fp32 kernels (cuda-fa1, cuda-fa2-simt) are compiled for: d rounded up to 32, 64,
// 96 or 128 (simt::kPaddedHeadDims of cuda/constraints.hpp).
constexpr int padded_head_dim(int d) { return (d + 31) / 32 * 32; }

// cuda-fa1 (fa1.cu): one thread block of 128 threads per (batch, query head), walking K/V blocks of 64
// keys (outer) and Q blocks of 64 rows (inner). Blocks per SM by the head dim its tiles are padded to
// (simt::kPaddedHeadDims): shared memory holds one block at d = 128; registers (~230-254 per thread)
// hold two at d = 64 and 96, three at d = 32.
namespace fa1 {
constexpr KernelTiling forward_tiling(int padded_head_dim) {
  return {.Br = 64, .Bc = 64, .warps = 4, .blocks_per_sm = padded_head_dim <= 32 ? 3 : padded_head_dim <= 96 ? 2 : 1};
}
}  // namespace fa1

// cuda-fa2 (fa2_forward.cu): 4 warps, each owning 2 x 16 query rows (d <= 128) or 16 (d = 256: O alone
// takes 128 registers per m-tile); Bc = 64 keys (32 at d = 256), the largest tile for which S_ij and O_i
// share 255 registers without spills. Two blocks per SM at every head dim (~236-255 registers).
namespace fa2 {
constexpr KernelTiling forward_tiling(int head_dim) {
  return {.Br = head_dim <= 128 ? 128 : 64, .Bc = head_dim <= 128 ? 64 : 32, .warps = 4, .blocks_per_sm = 2};
}
// The grid is (query blocks, batch * query heads), x fastest; block x takes query block
// (count - 1 - x): the heaviest first (under a causal mask the last rows see the most keys).
constexpr int forward_query_block(int block_x, int query_blocks) { return query_blocks - 1 - block_x; }
}  // namespace fa2

// cuda-fa3-ws (fa3_ws/forward_kernel.cuh), the shipped ladder step 5: a persistent grid of one block per
// SM (a producer warpgroup and two consumer warpgroups of 64 rows each), taking tiles of Br = 128 query
// rows from a global counter; Bc = 128 keys (64 at d = 256, so that O_i, S_ij and P_ij fit 240 registers).
// For long keys, d = 128 takes wider K/V blocks (160) and d = 64 192 keys; at d = 64 the persistent kernel takes three
// consumer warpgroups instead (Br = 192, Bc = 128) wherever their taller tiles pad the queries little
// (fa3_ws/forward_config.cuh, HeadConfig, says why; forward_choice below, where).
namespace fa3_ws {
inline constexpr int kRowsPerConsumer = 64;  // wgmma's M
inline constexpr int kConsumers = 2;
// From this many keys on, d = 64 and 128 take the wide K/V blocks, from ladder step 2 on and without
// dropout (measured on the H100: the wide block wins from N = 2k on and loses below).
inline constexpr int kWideBcMinKeys = 2048;
constexpr bool takes_wide_blocks(int head_dim, int seq_k, bool dropout, int ladder_step) {
  return head_dim != 256 && ladder_step >= 2 && !dropout && seq_k >= kWideBcMinKeys;
}
// Consumer warpgroups of a schedule: three where the persistent kernel (steps 5-7) takes the wide schedule at d = 64,
// else two (a schedule may set its own: forward_config.cuh, WithConsumers; forward_choice says which a problem gets).
constexpr int forward_consumers(int head_dim, bool wide, bool persistent) {
  return persistent && wide && head_dim == 64 ? 3 : 2;
}
// Keys per K/V block: with three consumers (160 registers each) 128, since 192 spilled.
constexpr int block_cols(int head_dim, bool wide, int consumers = kConsumers) {
  return head_dim == 256 ? 64 : !wide || consumers == 3 ? 128 : head_dim == 128 ? 160 : 192;
}
// Whether d = 64's three consumer warpgroups (Br = 192) pay over two (Br = 128) for seq_q queries. A padding row costs
// what a real one does, so it is their speed per row against the rows each pads the queries to, ceil(seq_q / 192) 192
// against ceil(seq_q / 128) 128. Where both pad alike, three are well ahead of two on the same 128-key blocks without
// a mask, less so with one, and less against two on the long keys' 192-key blocks; so three take the queries while
// their rows exceed two's by at most 1/8 against the short-key two without a mask, 1/32 otherwise. That leaves two
// for 128 or 256 queries, for one (a decode step) and for 512 on long keys, where three lost; 512 and 1024 queries on
// short keys without a mask, and 2048, sit on the line and went to three. The races:
// bench/results/h200-fa3-ws-race-d64-consumers-by-rows_2026-11-29.txt, h200-fa3-ws-race-d64-three-consumers_2026-11-29.txt
// (bench/results/h100-fa3-ws-fa4-ideas-notes.md reads them).
constexpr bool three_consumers_pay(int seq_q, bool against_short_unmasked) {
  const std::int64_t rows3 = (std::int64_t{seq_q} + 191) / 192 * 192, rows2 = (std::int64_t{seq_q} + 127) / 128 * 128;
  return against_short_unmasked ? 8 * rows3 <= 9 * rows2 : 32 * rows3 <= 33 * rows2;
}
// The forward block a problem gets at ladder step `ladder_step` (what fa3_ws/forward_kernel.cuh's launcher takes):
// whether its K/V blocks are the wide ones, and its consumer warpgroups (three: d = 64, steps 5-7, no dropout, where
// three_consumers_pay; their blocks are 128 keys whatever `wide` says).
struct ForwardChoice {
  bool wide = false;
  int consumers = kConsumers;
};
constexpr ForwardChoice forward_choice(int head_dim, int seq_q, int seq_k, bool causal, bool dropout, int ladder_step) {
  const bool wide = takes_wide_blocks(head_dim, seq_k, dropout, ladder_step);
  const bool three = head_dim == 64 && ladder_step >= 5 && !dropout && three_consumers_pay(seq_q, !wide && !causal);
  return {.wide = wide, .consumers = three ? 3 : 2};
}
// Whether the forward's timeline build (`flashlab bench --timeline`) has the kernel forward_choice picks: not a
// three-consumer one, whose 160 registers a consumer leave none for the recording (it spilled 56 bytes, ptxas -v).
// Its timeline build has no dropout, so neither does this.
constexpr bool forward_timeline_records(int head_dim, int seq_q, int seq_k, bool causal, int ladder_step) {
  return forward_choice(head_dim, seq_q, seq_k, causal, false, ladder_step).consumers == 2;
}
// The persistent kernel's block for a choice, and for the choice a problem gets.
constexpr KernelTiling forward_tiling(int head_dim, ForwardChoice c) {
  return {.Br = c.consumers * kRowsPerConsumer, .Bc = block_cols(head_dim, c.wide, c.consumers),
          .warps = (c.consumers + 1) * 4, .blocks_per_sm = 1};
}
constexpr KernelTiling forward_tiling(const Shape& s, bool causal, bool dropout) {
  return forward_tiling(s.head_dim, forward_choice(s.head_dim, s.seq_q, s.seq_k, causal, dropout, 5));
}
// Heads per group of the tile order: as many K/V heads as have their K and V fit in half the L2 (the
// H100's L2 is two partitions; data every SM reads is held in both), times the query heads sharing each;
// four times as many under a causal mask over 4096 keys or more (fa3_ws/forward_kernel.cuh, launch_config).
constexpr int heads_per_group(std::int64_t l2_bytes, const Shape& s, int bytes_per_element, bool causal) {
  const std::int64_t kv_head_bytes = 2 * std::int64_t{s.seq_k} * s.head_dim * bytes_per_element;
  const std::int64_t group_bytes = (causal && s.seq_k >= 4096 ? 4 : 1) * (l2_bytes / 2);
  const std::int64_t per_group = group_bytes / (kv_head_bytes > 0 ? kv_head_bytes : 1);
  const std::int64_t kv_heads = per_group > 1 ? per_group : 1;
  const std::int64_t heads = kv_heads * (s.heads_q / s.heads_kv), all = std::int64_t{s.batch} * s.heads_q;
  return static_cast<int>(heads < all ? heads : all);
}
// Tile t of the order: groups of `group` (batch, head)s, within a group the heaviest query block first
// (counted from the last), heads fastest. The last group may hold fewer heads.
struct TileAt {
  int bh = 0;           // batch * heads_q + head
  int query_block = 0;  // 0 .. query_blocks - 1
};
constexpr TileAt tile_at(int t, int query_blocks, int bh_total, int group) {
  const int group_tiles = group * query_blocks;
  const int first_bh = t / group_tiles * group, in_group = t % group_tiles;
  const int heads = group < bh_total - first_bh ? group : bh_total - first_bh;
  return {.bh = first_bh + in_group % heads, .query_block = query_blocks - 1 - in_group / heads};
}
}  // namespace fa3_ws

}  // namespace flashlab::cuda
