#pragma once
// cuda-fa3-ws backward, its configuration: the block shape per head dim (how the two consumers share the keys, dK_j,
// dV_j and dQ_i), the shared-memory layout and mbarriers that follow, and the named barrier ids. Compile-time
// constants only; backward_kernel.cuh says what the design is and lists the other parts.
#include <cstdint>

#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "cuda/fa3_ws/named_barriers.cuh"
#include "cuda/fa3_ws/warp_roles.cuh"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

constexpr int kKeysPerConsumer = 64;  // wgmma's M: each consumer warpgroup owns 64 keys of the block
constexpr int kStages = 2;  // Q_i, dO_i, L_i, D_i stages
// The backward's tiles hold 16-bit elements (fp16, bf16): there is no 8-bit backward (a training step's gradients
// want more than e4m3's three mantissa bits), so one tile layout serves both types. The kernel asserts its T.
constexpr int kBackwardElemBytes = 2;
constexpr int kBackwardPanelCols = kPanelRowBytes / kBackwardElemBytes;  // 64 columns per 128-byte panel row

// Query rows per step (Br). 64: at d = 128, dK_j and dV_j take 128 registers of a consumer's 240 beside S^T and
// dP^T (32 each). At d = 64 a build may take 128 (FLASHLAB_FA3_BACKWARD_D64_ROWS, a CMake cache variable): half the
// steps, each twice as long, so that a step's fixed costs (its barrier and GEMM waits, the dQ hand-over) weigh half
// as much. S^T and dP^T are then 64 registers each, so P^T and dS^T go to shared memory as they are packed and dV_j,
// dK_j read them from there (BwdConfig::kDqRowPieces).
#ifndef FLASHLAB_FA3_BACKWARD_D64_ROWS
#define FLASHLAB_FA3_BACKWARD_D64_ROWS 64
#endif
constexpr int kBackwardD64Rows = FLASHLAB_FA3_BACKWARD_D64_ROWS;
static_assert(kBackwardD64Rows == 64 || kBackwardD64Rows == 128, "FLASHLAB_FA3_BACKWARD_D64_ROWS is 64 or 128");
// The one definition the host's scratch sizes use.
__host__ __device__ constexpr int backward_block_rows(int head_dim) {
  return head_dim == 64 ? kBackwardD64Rows : head_dim > 0 ? 64 : 0;
}
// Consumer warpgroups of a thread block: two (cuda/tilings.hpp's kConsumers, as in the forward), or at d = 64 (Br =
// 64) three, Bc = 192, where the problem's grid keeps them busy (backward_plan, backward.cu, chooses per problem).
// A step is one chain of waits (S^T, the pointwise part, dS^T's barrier, the dQ, dV and dK products), and two
// consumers leave the tensor cores idle while both are inside theirs; a third chain fills more of that time. Three
// take 512 threads, so a consumer has 160 registers (kThreeConsumerRegs, the producer keeping 24): dK_j, dV_j, S^T and
// dP^T fit there only with dQ_i's piece issued after dV_j and dK_j (BwdConfig::kDqFirst; first, ptxas spilled 164
// bytes), and the named barriers fit 16 only with one dQ staging buffer per consumer. Their timeline build spills
// (8 bytes), so the backward's timeline records two consumers.
__host__ __device__ constexpr int backward_max_consumers(int head_dim) {
  return head_dim == 64 && kBackwardD64Rows == 64 ? 3 : kConsumers;
}
// Keys per K/V block (Bc; KvSplit below says why) with `consumers` consumer warpgroups: the host's grid and scratch
// sizes use it too.
__host__ __device__ constexpr int backward_block_keys(int head_dim, int consumers = kConsumers) {
  return head_dim == 256 ? kKeysPerConsumer : consumers * kKeysPerConsumer;
}
// dQ_accum's pieces (64 x 64 fp32 each) per query block: at d = 64 one per 64 rows (both consumers add to each),
// d / 64 above (one per 64 columns).
__host__ __device__ constexpr int dq_pieces(int head_dim) {
  return head_dim == 64 ? kBackwardD64Rows / 64 : head_dim < 64 ? 1 : head_dim / 64;
}

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
//    (only its own warpgroup's barrier), and both add their partial sums into the same piece of dQ_accum: one
//    piece at Br = 64, two (the block's two 64-row halves) at Br = 128.
enum class DqSplit { Columns, Keys };

template <int D, bool kDropout = false, int kC = kConsumers>
struct BwdConfig {
  static constexpr int kConsumers = kC;
  static_assert(kC == 2 || (kC == 3 && backward_max_consumers(D) == 3),
                "two consumer warpgroups, or three at d = 64 with 64 query rows per step");
  static constexpr int kD = D;
  static constexpr int kThreads = (kConsumers + 1) * kWarpgroupThreads;
  static constexpr int kConsumerRegs = kConsumers == 3 ? kThreeConsumerRegs : ::flashlab::cuda::fa3_ws::kConsumerRegs;
  static constexpr KvSplit kKvSplit = D == 256 ? KvSplit::Columns : KvSplit::Keys;
  static constexpr bool kKvByKeys = kKvSplit == KvSplit::Keys;
  static_assert(kKvByKeys || kConsumers == 2, "the split by columns (d = 256) is between two consumers");
  static constexpr int kBc = kKvByKeys ? kConsumers * kKeysPerConsumer : kKeysPerConsumer;  // 128, 192 or 64 keys
  static constexpr int kBr = backward_block_rows(D);
  static_assert(kBc == backward_block_keys(D, kC), "one definition of Bc for the kernel and the host");
  static constexpr int kSQueries = kKvByKeys ? kBr : kBr / kConsumers;  // queries of a consumer's S^T, dP^T (wgmma N)
  static constexpr int kKvCols = kKvByKeys ? D : D / kConsumers;        // columns of a consumer's dK_j, dV_j
  static constexpr DqSplit kDqSplit = D == 64 ? DqSplit::Keys : DqSplit::Columns;
  static constexpr int kDqPieces = dq_pieces(D);  // per query block
  // Br = 128 at d = 64: dQ_i's pieces are its 64-row halves (not 64-column ones), each consumer computes both over
  // its keys, P^T and dS^T go through shared memory (one buffer each, each consumer its own rows), and a consumer's
  // second piece is staged in its rows of P^T once dV_j has read them (the shared memory holds one staging buffer
  // per consumer beside them).
  static constexpr bool kDqRowPieces = kDqSplit == DqSplit::Keys && kBr == 128;
  static constexpr int kDqPiecesPerConsumer = kDqSplit == DqSplit::Columns ? kDqPieces / kConsumers : kDqPieces;
  static constexpr int kDqAddsPerBlock = kDqSplit == DqSplit::Keys ? kConsumers : 1;  // additions to a piece per step
  static constexpr int kDqCols = 64;
  static_assert(kDqCols == kBackwardPanelCols && (kDqRowPieces ? kBr == kDqPieces * 64 && D == kDqCols
                                                               : kBr == 64 && D == kDqPieces * kDqCols),
                "a dQ piece is 64 x 64: one panel of K_j, wgmma_ss_tt's N");
  // dQ's way out. Keys: staged in shared memory and added by the writer warp's bulk reductions. Columns: K_j, V_j
  // and two stages of Q_i, dO_i take 192 KiB of the 227, P^T and dS^T 32 more, which leaves no room to stage dQ_i's
  // 64 KiB: each thread adds its registers with red.global.add.v4.f32 (16 bytes a vector, coalesced per warp).
  static constexpr bool kDqWriter = kKvByKeys;
  // dQ_i's pieces are issued before dV_j and dK_j, so that they are waited for and sent out while those two run.
  // With dropout at d = 128 the keep bits leave no registers for that order (ptxas spilled 20 bytes): there dV and
  // dK go first, and the piece is staged after all three.
  // Three consumers (160 registers) take the second order too.
  static constexpr bool kDqFirst = !(kDropout && D == 128) && kConsumers == 2;
  // At d = 128 (DqSplit::Columns, dS^T from both consumers) step n's dQ_i is computed at step n + 1, after the other
  // consumer has finished step n, instead of after a barrier in the middle of step n: the consumers need not
  // reach their pointwise parts at the same moment, so one's exponentials overlap the other's GEMMs (faster on the
  // H100 at N = 1k-16k, backward alone, more so with consumer 1 started behind consumer 0). The
  // registers are those of kDqFirst's order; with dropout it is not done (kDqFirst is false there).
  static constexpr bool kDeferDq = D == 128 && !kDropout;
  static constexpr int kDqPieceFloats = 64 * kDqCols;
  static constexpr int kNS = kSQueries / 2;  // S^T, dP^T accumulator floats per thread: (64 keys, kSQueries)
  static constexpr int kNKV = kKvCols / 2;   // dK, dV accumulator floats per thread: (64 keys, kKvCols)
  static constexpr int kNQ = kDqCols / 2;    // dQ piece accumulator floats per thread: (64, 64)
  static constexpr int kPackSteps = kSQueries / 16;  // 16-query groups of a consumer's P^T, dS^T (RS: A fragments)
  static constexpr int kKSteps = kBr / 16;           // k-steps of dV += P^T dO and dK += dS^T Q

  // Shared memory: K_j, V_j (Bc, d); kStages x Q_i, dO_i (Br, d); two dS^T buffers (Bc, Br) and, Columns, two P^T
  // buffers (row pieces: one of each); Keys: each consumer's dQ staging (two 64 x 64 fp32 buffers; row pieces: one);
  // kStages x L_i, D_i (Br fp32); then the mbarriers.
  static constexpr int kKVBytes = kBc * D * kBackwardElemBytes;
  static constexpr int kQBytes = kBr * D * kBackwardElemBytes;
  static constexpr int kDsBytes = kBc * kBr * kBackwardElemBytes;
  static constexpr int kDqBytes = kDqPieceFloats * 4;
  static constexpr int kRowStatBytes = kBr * 4;
  static constexpr int kDsBuffers = kDqRowPieces ? 1 : 2;
  static constexpr int kPtBuffers = kDqRowPieces ? 1 : kKvByKeys ? 0 : 2;
  // dQ staging buffers per consumer: two, so that a consumer stages step n's piece while the writer still adds step
  // n - 1's; one where the row pieces need the room, and with three consumers, whose hand-over ids would not fit the
  // 16 named barriers twice (Barriers).
  static constexpr int kDqStagingBuffers = kDqRowPieces || kConsumers == 3 ? 1 : 2;
  using Barriers = BackwardBarriers<kConsumers, kDqRowPieces ? kDqPieces : kDqStagingBuffers>;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVBytes;
  static constexpr int kQOffset = kVOffset + kKVBytes;
  static constexpr int kDOOffset = kQOffset + kStages * kQBytes;
  static constexpr int kDsOffset = kDOOffset + kStages * kQBytes;
  static constexpr int kPtOffset = kDsOffset + kDsBuffers * kDsBytes;
  static constexpr int kDqOffset = kPtOffset + kPtBuffers * kDsBytes;
  static constexpr int kLOffset = kDqOffset + (kDqWriter ? kConsumers * kDqStagingBuffers * kDqBytes : 0);
  static constexpr int kDiOffset = kLOffset + kStages * kRowStatBytes;
  static constexpr int kBarOffset = kDiOffset + kStages * kRowStatBytes;
  // Barriers: K_j and V_j full (once); per stage full and empty.
  static constexpr int kKVFull = 0, kFull = 1, kEmpty = kFull + kStages, kNumBarriers = kEmpty + kStages;
  static constexpr int kBytes = kBarOffset + kNumBarriers * 8 + kSmemAlignSlack;  // (swizzle_atom_pad)
  static constexpr std::uint32_t kStepTxBytes = 2 * kQBytes + 2 * kRowStatBytes;
  static_assert(kQBytes % kSwizzleAtomBytes == 0 && kDsBytes % kSwizzleAtomBytes == 0, "tiles stay 1024-aligned");
  static_assert(kBytes <= kMaxSmemBytes, "the tiles, stages and barriers must fit 227 KiB");
};

}  // namespace
}  // namespace flashlab::cuda::fa3_ws
