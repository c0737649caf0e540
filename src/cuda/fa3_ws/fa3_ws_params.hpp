#pragma once
// What the host side of cuda-fa3-ws hands to its kernel (fa3_ws/forward_kernel.cuh): raw device pointers in
// layout (B, S, H, D), the problem's extents and derived constants (as cuda-fa2's Params), the TMA
// descriptors, the ablation-ladder step, and the optional timeline buffer.
#include <cuda.h>  // CUtensorMap (the type only: the encoder is fetched at run time, no libcuda link)
#include <cuda_runtime.h>

#include <cstdint>

#include "core/problem.hpp"
#include "cuda/constraints.hpp"
#include "model/timeline.hpp"  // TimelineRecord: what the timeline build writes, one definition

namespace flashlab::cuda::fa3_ws {

// Blocks (blockIdx.x < this) that record, when the timeline is compiled in.
inline constexpr int kTimelineBlocks = 4;
// The event of a record slot no lane wrote: the host fills the buffer with 0xff bytes before a run, and
// each recording lane takes its slots in chunks, so a run leaves holes (timeline_lane.cuh, TimelineLane).
inline constexpr std::uint16_t kTimelineHole = 0xffff;

struct Params {
  const void* q = nullptr;  // (B, S_q, H_q, D)
  const void* k = nullptr;  // (B, S_k, H_kv, D)
  const void* v = nullptr;  // (B, S_k, H_kv, D)
  void* o = nullptr;        // (B, S_q, H_q, D)
  float* lse = nullptr;     // (B, H_q, S_q), natural log
  int batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  CausalAlign align = CausalAlign::None;
  float scale = 0;       // softmax scale
  float scale_log2 = 0;  // scale * log2(e): exp(scale * s) = exp2(scale_log2 * s)
  bool dropout = false;
  std::uint32_t drop_threshold = 0;  // core/philox.hpp dropout_threshold(p)
  float drop_rescale = 1;            // 1 / (1 - p)
  std::uint64_t seed = 0;
  // The persistent grid (step 5) hands out tiles from a counter: two ints of device memory, zero before
  // the first launch (the kernel leaves them zero). Launches that may run at the same time need their own.
  int* tile_counter = nullptr;
  // Step 5's tile order: heads whose K/V share the L2 (half the L2's worth of K/V). The launcher sets it; a
  // caller leaves it 0.
  int heads_per_group = 0;
  // Timeline (read only by the kernels built with the timeline hook): records and an atomic record counter.
  ::flashlab::TimelineRecord* timeline = nullptr;
  unsigned* timeline_count = nullptr;
  int timeline_capacity = 0;

  // ---- the backward only (launch_backward, fa3_ws/backward.cu); o and lse are then read, not written ----
  const void* d_o = nullptr;  // (B, S_q, H_q, D)
  void* dq = nullptr;         // (B, S_q, H_q, D)
  void* dk = nullptr;         // (B, S_k, H_kv, D)
  void* dv = nullptr;         // (B, S_k, H_kv, D)
  // Accumulate mode (a ring's block, cuda/ring.cu): with all three set, dq, dk and dv are not written; instead
  // the block's dQ, dK and dV are added, in fp32, into these (B, S, H, D) fp32 tensors of the same extents, so
  // that partial sums over many K/V (or Q) blocks are rounded to the input dtype once, at the end. Without
  // dropout, outside the timeline build.
  float* dq_sum = nullptr;
  float* dk_sum = nullptr;
  float* dv_sum = nullptr;
  // Scratch the caller allocates with the sizes backward_scratch gives:
  float* lse_log2 = nullptr;  // (B, H_q, padded S_q): L_i log2(e); +inf past the end and for rows that saw no key
  float* D_i = nullptr;       // (B, H_q, padded S_q): rowsum(dO_i o O_i); 0 past the end
  float* dq_accum = nullptr;  // fp32 sums of dQ's partials, one chunk per (batch, head, query block, consumer)
  int* dq_semaphore = nullptr;  // per chunk: how many additions to it have completed; then the conversion's ticket
  // Add the dQ partials of the K/V blocks in a fixed order (block 0 first), so that two runs give
  // bit-identical dQ; otherwise in whatever order they arrive.
  bool deterministic = false;
  // The backward's consumer warpgroups (backward_plan): 2, or 3 at d = 64 (K/V blocks of 64 keys a consumer).
  int consumers = 2;
  // Grouped-query attention on too few K/V blocks to fill the GPU (backward_split): the query heads of each K/V
  // head's group are shared among group_splits thread blocks per K/V block. Each writes its partial dK_j and dV_j
  // in fp32 (dK scaled) to its slice of dk_partial, dv_partial; the last of them to finish a warp's rows (counted in
  // kv_tickets, which the pre-pass zeroes) adds the slices in split order and writes dK_j, dV_j. 1: one thread
  // block takes the whole group, and the three buffers are not used.
  int group_splits = 1;
  // The order the backward's thread blocks are launched in (backward_key_blocks_outer): false, row by row, every K/V
  // block j of (batch, K/V head, split) row 0, then of row 1, ...; true, K/V block by K/V block, block 0 of every
  // row, then block 1 of every row, ... Under a causal mask the larger j, the fewer steps (top-left and
  // bottom-right alike), so the second order launches the longest blocks of every row first.
  bool key_blocks_outer = false;
  float* dk_partial = nullptr;  // (group_splits, B, S_k, H_kv, D)
  float* dv_partial = nullptr;  // (group_splits, B, S_k, H_kv, D)
  int* kv_tickets = nullptr;    // per (batch, K/V head, K/V block, consumer warp)

  // ---- the FP8 forward only (launch_forward_e4m3): q, k, v hold e4m3 bytes, o bf16 ----
  // Descale factors, one float per (batch, head), row-major: the real value of an input element is its e4m3 value
  // times its head's descale (cpu_reference/fp8.hpp, quantize_e4m3_per_head).
  const float* q_descale = nullptr;  // (B, H_q)
  const float* k_descale = nullptr;  // (B, H_kv)
  const float* v_descale = nullptr;  // (B, H_kv)
  // Scratch of fp8_vt_bytes(...) bytes, 16-byte aligned: the launcher writes V^T there (transpose_v_e4m3) before
  // the forward reads it.
  void* vt = nullptr;
};

// Element counts of the backward's scratch for a problem: lse_log2 and D_i (row_stats each), dq_accum,
// dq_semaphore. Query rows are padded to whole query blocks of the backward kernel.
struct BackwardScratchSizes {
  std::int64_t row_stats = 0, dq_accum = 0, semaphores = 0;
};
BackwardScratchSizes backward_scratch(int batch, int heads_q, int seq_q, int head_dim);
// How many thread blocks share each K/V block's group of query heads (Params::group_splits), and the scratch that
// takes: where the problem has fewer K/V blocks than two per SM (of `sms`), the fewest splits (a divisor of the group)
// that reach two, or the whole group where none does; else 1. Without splits each thread block walks every query head of its group: with
// few (batch, K/V head) rows and short keys the grid leaves most SMs idle, and under a causal mask the block of
// the first keys, with the most steps, sets the time.
// `consumers`: the thread blocks' consumer warpgroups (Params::consumers), which set the keys of a K/V block.
struct BackwardSplit {
  int group_splits = 1;
  std::int64_t partials = 0;  // floats in each of dk_partial and dv_partial
  std::int64_t tickets = 0;   // ints in kv_tickets
};
BackwardSplit backward_split(int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int sms, int consumers = 2);
// The order to launch the backward's thread blocks in (Params::key_blocks_outer): K/V block by K/V block under a
// causal mask where the grid is that small (before backward_split shares the groups), else row by row. With few
// blocks, each thread block's steps weigh on the total: under the mask block j has its share of the group's query
// heads times (its query blocks, fewer the larger j is) steps, and launched row by row the last row's longest
// blocks start when most of the GPU is done, and run alone. With many blocks the tail is short, and row by row
// keeps one head's Q, dO and dQ sums in the L2 while its K/V blocks walk them.
bool backward_key_blocks_outer(bool causal, int batch, int heads_kv, int seq_k, int head_dim, int sms, int consumers = 2);
// The backward's grid for a problem on a GPU of `sms` SMs: its consumer warpgroups, the splits of each group and
// their scratch, and the launch order (Params::consumers, group_splits, key_blocks_outer). The plan estimates a
// grid's time by replaying its launch on `sms` SMs (each thread block to the SM that frees first, for its steps and a
// fixed cost). Two consumers start from backward_split's splits and backward_key_blocks_outer's order; under a causal
// mask, where the thread blocks are unequal, the plan also replays each split of the group in either order and takes
// the shortest where it beats that by a margin. At d = 64 it weighs three consumers (Bc = 192) against two: their
// steps cover a block's keys in less time (measured, kThreeConsumersTimePerKey in backward.cu), but a block of 192
// keys leaves fewer and longer thread blocks, which a causal mask makes unequal, and the last of them can run alone
// at the end. So it replays three's grids too, and takes three where their best estimate is the shorter by a
// margin. `timeline`: two, always (the timeline build of three spills registers). `consumers` > 0: that
// many, whatever the estimates say (three: with the best of their splits), for the tests and A/B runs.
struct BackwardPlan {
  int consumers = 2;
  BackwardSplit split;
  bool key_blocks_outer = false;
};
BackwardPlan backward_plan(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, CausalAlign align,
                           bool timeline, int sms, int consumers = 0);
// One grid of the caller's, whatever the plan would choose: `consumers`, each group of query heads shared among
// `group_splits` thread blocks (a divisor of the group; 1: not shared), and the launch order, with the split's scratch
// sizes. For the tests, which hold every grid the plan can choose to the reference on small problems.
BackwardPlan backward_grid(int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int consumers, int group_splits,
                           bool key_blocks_outer);
// (Head dims the backward is compiled for: kBackwardHeadDims, cuda/constraints.hpp.)

// The TMA descriptors of Q, K and V: 4-D (D, H, S, B) views with 128B swizzle, boxes of
// (64 columns, 1 head, rows, 1 batch). Passed to the kernel as a __grid_constant__ parameter.
struct TmaMaps {
  CUtensorMap q, k, v;
};

// The ablation ladder: each step adds one scheduling idea to the one before (flashlab bench runs them
// one at a time; the shipped kernel is step 5). Two more rungs flip one of FlashAttention-4's softmax ideas on the
// shipped step, so that each can be timed and its timeline recorded on its own (Schedule::kLazyRescale and
// kExp2PolyEvery, forward_config.cuh): the lazy rescale ships, so its rung takes it away; the exponential emulation
// does not, so its rung adds it.
enum class LadderStep : int {
  OneWarpgroup = 1,     // one warpgroup, 64 query rows; it issues its own TMA; TMA + wgmma
  WarpSpecialized = 2,  // + a producer warpgroup (TMA) and two consumer warpgroups, setmaxnreg
  PingPong = 3,         // + the consumers take turns for their GEMMs (named barriers)
  IntraOverlap = 4,     // + softmax of block j overlaps P_{j-1} V_{j-1} inside each consumer
  Persistent = 5,       // + one block per SM walking a tile list, heaviest tiles first
  EagerRescale = 6,     // step 5 without the lazy rescale: O_i rescaled whenever a row's max rises
  Exp2Emulated = 7,     // step 5 + 1 column group of P in kExp2PolyGroups by exp2_poly on the FMA pipes
};
inline constexpr LadderStep kShippedStep = LadderStep::Persistent;
inline constexpr int kLadderSteps = 7;
// The exponential-emulation rung's share: one S column group of 8 in this many (1 in 8 was the share that lost least
// in the race, bench/results/h100-fa3-ws-fa4-ideas-notes.md; every larger share lost more at every head dim).
inline constexpr int kExp2PolyGroups = 8;

// Head dims with a compiled kernel: kHeadDims, the one list of cuda/constraints.hpp (the registry checks
// problems against it). The launchers assert what the registry checked (fa3_ws/host_checks.hpp): a head dim,
// dtype or GPU it would refuse reaching them is a bug of the caller, std::logic_error.

// A 4-D (D, H, S, B) TMA descriptor over a (B, S, H, D) tensor of 16-bit `dtype` with boxes of
// (64, 1, box_rows, 1) and 128B swizzle; throws std::runtime_error naming the failing driver call.
CUtensorMap make_bshd_tensor_map(const void* base, DType dtype, int batch, int seq, int heads, int head_dim,
                                 int box_rows);
// The same for any element type by its TMA data type and width (2 bytes, or 1 for e4m3): boxes one panel row wide,
// 128 bytes (64 or 128 columns) under the 128-byte swizzle, or the whole 64-byte row of e4m3 at d = 64 under the
// 64-byte swizzle (hopper.cuh, panel_row_bytes); the head dim is a multiple of the panel.
CUtensorMap make_bshd_tensor_map(const void* base, CUtensorMapDataType type, int element_bytes, int batch, int seq,
                                 int heads, int head_dim, int box_rows);

// Launch on `stream`; dtype is F16 or BF16, the head dim one of kHeadDims, the GPU compute capability 9.0 (asserted:
// std::logic_error). Checks the launch, does not synchronize.
void launch_forward(DType dtype, const Params&, cudaStream_t stream, LadderStep step = kShippedStep);

// The timeline build (forward_timeline.cu): the kernel of ladder step `step` with the shipped schedule and
// the timeline hook compiled in. With p.timeline set, the blocks blockIdx.x < kTimelineBlocks write
// TimelineRecords into it: p.timeline_capacity slots, taken in chunks through the counter
// *p.timeline_count, which the caller zeroes first (it ends at the slots the lanes asked for, which may
// exceed the capacity: those events were not recorded). Slots no lane wrote keep what the caller left
// there: fill the buffer with 0xff bytes and drop records whose event is kTimelineHole. With
// p.timeline == nullptr the same build runs without recording. f16 or bf16, without dropout; otherwise
// as launch_forward (and asserted like it). Checks the launch, does not synchronize.
void launch_forward_timeline(DType dtype, const Params&, cudaStream_t stream, LadderStep step);

// The backward: the pre-pass (L_i log2 e and D_i into their padded scratch, dQ's sums and counters
// zeroed), the main kernel (one block per K/V block) and dQ's conversion to the input dtype, which starts
// while the main kernel runs and converts each piece of dQ once its sum is complete, on `stream`.
// Reads q, k, v, o, lse, d_o; writes dq, dk, dv and the scratch. Checks the launches, does not
// synchronize. Asserted (std::logic_error): a head dim with a backward, compute capability 9.0, the scratch, and
// an accumulate mode with all three of its sums.
void launch_backward(DType dtype, const Params&, cudaStream_t stream);

// The backward with the timeline hook compiled in (fa3_ws/timeline_lane.cuh; its kernels are instantiated beside
// launch_backward's): with p.timeline set, the K/V blocks blockIdx.x < kTimelineBlocks of the first (batch, K/V
// head) record their producer's loads and their consumers' waits, GEMMs, pointwise work (P, dS) and epilogue, as
// launch_forward_timeline's do (the dQ writer warp is not recorded). Without dropout; otherwise as launch_backward.
void launch_backward_timeline(DType dtype, const Params&, cudaStream_t stream);

// The FP8 forward's V^T (fa3_ws/fp8_transpose_v.cu): e4m3 V (B, S_k, H_kv, d) into V^T (B, H_kv, d, fp8_vt_keys(S_k)),
// column k of each row holding key fp8_v_key(k) (fa3_ws/fp8_layout.cuh), zero where that key is past S_k. The head
// dim is a multiple of 64 and both pointers are 16-byte aligned (asserted). Checks the launch, does not synchronize.
int fp8_vt_keys(int seq_k);  // S_k rounded up to 32
// Its TMA map: boxes of panel_keys keys (128: one 128-byte panel row of e4m3, 128B-swizzled; or 64 under the 64-byte
// swizzle) by box_rows dims, to be read as the K-major B operand of O += P V (desc_k_major with box_rows rows).
CUtensorMap make_vt_tensor_map(const void* vt, int batch, int heads_kv, int head_dim, int vt_keys, int box_rows,
                               int panel_keys = 128);
void transpose_v_e4m3(const void* v, void* vt, int batch, int seq_k, int heads_kv, int head_dim, cudaStream_t stream);
// Bytes of V^T for a problem: B H_kv d fp8_vt_keys(S_k).
std::int64_t fp8_vt_bytes(int batch, int heads_kv, int head_dim, int seq_k);

// The FP8 forward (fa3_ws/forward_e4m3.cu), the shipped step's kernel on e4m3 operands: q, k, v e4m3 in the layouts
// above with their descales, O bf16 (B, S_q, H_q, d), LSE fp32 (natural log, of the real scores). S = Q K^T and
// O = P V run on the FP8 tensor cores with fp32 accumulation; P is rounded to e4m3 as 448 P (P <= 1: the running
// max is never allowed to lag). First the pre-pass writes V^T into p.vt, then the forward runs; both on `stream`.
// Causal in either alignment, any lengths, seq_q != seq_k, GQA. Asserted (std::logic_error): a head dim of
// kE4m3HeadDims, compute capability 9.0, no dropout, the descales and p.vt set. Checks the launches, does not
// synchronize.
void launch_forward_e4m3(const Params&, cudaStream_t stream);
// The same forward with V transposed in shared memory by the producer warpgroup instead of by the pre-pass (no V^T
// scratch: p.vt is not read), to race against it (tools/fa3_harness/race.sh) and test it; not what ships. At d = 256
// its two consumers take one O buffer in turn (forward_config.cuh, WithFp8TransposeInKernel). Asserted as
// launch_forward_e4m3 is, less p.vt.
void launch_forward_e4m3_vt_in_smem(const Params&, cudaStream_t stream);
// The same with the timeline hook compiled in (forward_timeline.cu), recording as launch_forward_timeline does.
void launch_forward_e4m3_timeline(const Params&, cudaStream_t stream);

}  // namespace flashlab::cuda::fa3_ws
