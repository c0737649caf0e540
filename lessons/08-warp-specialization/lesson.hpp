#pragma once
// Lesson 08: the two pieces of bookkeeping that a warp-specialized Hopper kernel gets wrong first.
// Everything here runs on the CPU.
//
// Part 1, the pipeline: a ring of S shared-memory stages, each guarded by two mbarriers, "full"
// (the copy engine has landed the tile) and "empty" (every consumer is done with it). A producer
// and its consumers walk the ring with a cursor (stage, phase) and wait on barrier phases by
// parity. MBarrier below is the hardware, given; you write advance, try_wait_parity and the two
// wait parities. test.cpp runs them in a simulated kernel.
//
// Part 2, the shared-memory layout: where element (row, col) of a (rows x 64) bf16 tile sits under
// the 128-byte swizzle that TMA writes and wgmma reads, and the 64-bit matrix descriptor that tells
// wgmma where the tile is and how it is laid out.
//
// Part 3, FlashAttention-4's two ideas for the softmax (README section 9): an exp2 computed with a polynomial on the
// FMA units instead of the exponential unit, and the lazy rescale of O.
#include <cstddef>
#include <cstdint>

#include "core/exp2_poly.hpp"  // the cubic's coefficients, range and bound

namespace flashlab::lesson08 {

// ---- Part 1: mbarrier pipeline ------------------------------------------------------------------

// The hardware's mbarrier, as a plain struct (given; you do not write it). A barrier lives in phases
// 0, 1, 2, ...; the hardware keeps only the parity of the phase in progress. A phase completes when
// all `arrival_count` arrivals have come AND every byte announced with expect_tx has landed; the
// parity then flips and the next phase starts with the full arrival count again.
struct MBarrier {
  int arrival_count = 0;      // arrivals per phase, fixed by init (mbarrier.init)
  int pending_arrivals = 0;   // arrivals still missing in the phase in progress
  std::int64_t tx_bytes = 0;  // bytes announced by expect_tx and not yet completed by the copy engine
  std::uint32_t phase = 0;    // parity (0 or 1) of the phase in progress
};

inline void init(MBarrier& bar, int count) { bar = {.arrival_count = count, .pending_arrivals = count}; }

inline void complete_phase_if_done(MBarrier& bar) {
  if (bar.pending_arrivals == 0 && bar.tx_bytes == 0) {
    bar.phase ^= 1u;
    bar.pending_arrivals = bar.arrival_count;
  }
}

// mbarrier.arrive: one arrival.
inline void arrive(MBarrier& bar) {
  --bar.pending_arrivals;
  complete_phase_if_done(bar);
}

// mbarrier.arrive.expect_tx: announce `bytes` that a bulk copy will deliver, then arrive. The phase
// cannot complete before those bytes land, even though the arrival count is already reached.
inline void arrive_expect_tx(MBarrier& bar, std::int64_t bytes) {
  bar.tx_bytes += bytes;
  arrive(bar);
}

// The copy engine's complete_tx: `bytes` of a cp.async.bulk.tensor have landed in shared memory.
inline void complete_tx(MBarrier& bar, std::int64_t bytes) {
  bar.tx_bytes -= bytes;
  complete_phase_if_done(bar);
}

// Where a producer or a consumer stands in the ring: the stage it uses next, and the parity of the
// ring pass it is on (0 on the first pass through the S stages, 1 on the second, 0 on the third...).
struct RingCursor {
  int stage = 0;
  std::uint32_t phase = 0;
  bool operator==(const RingCursor&) const = default;
};

// The cursor after using one stage of a ring of `stages` stages.
RingCursor advance(RingCursor cursor, int stages);

// mbarrier.try_wait.parity: true when the phase of parity `parity` has completed, that is, when the
// barrier is no longer in a phase of that parity. (The hardware only knows the parity bit, so it
// cannot tell "completed one phase ago" from "completed three phases ago": the protocol must keep
// every waiter within one phase of the barrier.)
bool try_wait_parity(const MBarrier& bar, std::uint32_t parity);

// The parity a consumer at `cursor` waits for on full[cursor.stage] before reading the stage.
std::uint32_t consumer_full_parity(RingCursor cursor);
// The parity the producer at `cursor` waits for on empty[cursor.stage] before refilling the stage.
std::uint32_t producer_empty_parity(RingCursor cursor);

// ---- Part 2: 128-byte swizzle and the wgmma descriptor ------------------------------------------

// A tile of `rows` x 64 bf16 values, row major: each row is 128 bytes, eight 16-byte chunks of 8
// values. The tile starts at a 1024-byte-aligned shared-memory address.
inline constexpr int kTileCols = 64;
inline constexpr int kRowBytes = kTileCols * 2;  // 128
inline constexpr int kChunkBytes = 16;

// Byte offset of element (row, col), col in [0, 64), from the tile's start, under the 128-byte
// swizzle: chunk col / 8 of row `row` is stored at chunk (col / 8) XOR (row % 8) of the same row.
std::size_t swizzled_offset(int row, int col);

// The swizzle mode, with the value the descriptor's bits 62-63 hold for it.
enum class Swizzle : std::uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// wgmma's 64-bit shared-memory matrix descriptor:
//   bits  0-13  start address >> 4 (the 18-bit shared-memory address in 16-byte units)
//   bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset (0 for a tile aligned to the swizzle pattern's 1024 bytes)
//   bits 62-63  swizzle mode
// Every other bit is 0. `address`, `lbo` and `sbo` are byte values, multiples of 16.
std::uint64_t make_descriptor(std::uint32_t address, std::uint32_t lbo, std::uint32_t sbo, Swizzle swizzle);

// ---- Part 3: FlashAttention-4's two softmax ideas -----------------------------------------------

// 2^x without the exponential unit, for x >= kPolyMinInput: round x to the nearest integer j, f = x - j in
// [-1/2, 1/2], 2^f by the cubic p(f) = 1 + f (c1 + f (c2 + f c3)) (Horner: three multiply-adds), then 2^x = 2^j p(f)
// (std::ldexp does the 2^j exactly). Below kPolyMinInput, and at -inf, the result is 0: a masked score's P.
// The coefficients, the range and the bound are the project's (src/core/exp2_poly.hpp, which the kernel uses): fitted
// for the least maximum relative error on [-1/2, 1/2]; the test holds the result to kPolyMaxRelError of std::exp2
// over every input the kernel's softmax can see.
inline constexpr float kPolyC1 = kExp2PolyCubicC1, kPolyC2 = kExp2PolyCubicC2, kPolyC3 = kExp2PolyCubicC3;
inline constexpr float kPolyMinInput = kExp2PolyMinInput;
inline constexpr double kPolyMaxRelError = kExp2PolyMaxRelError<3>;
float exp2_by_polynomial(float x);

// The lazy rescale, for one row: the maxima of its K/V blocks in order (log2 units; -inf for a block it sees no key
// of). The running max m starts at -inf and moves to a block's max only when that max exceeds m + lag; every move
// after the first one (while O is still 0) rescales O. Returns how many times O is rescaled. lag = 0 is the exact
// online softmax, which rescales whenever the max rises.
int count_rescales(const float* block_maxes, int blocks, float lag);

}  // namespace flashlab::lesson08
