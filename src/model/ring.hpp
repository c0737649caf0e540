#pragma once
// The ring of ring attention (sequence parallelism), written once. P ranks each keep their share of
// the queries; the K/V shares travel around a ring, one hop per step, so that after P steps every
// rank has seen every key. This schedule is the only place that decides who computes what, when, and
// what goes over which link: the CPU reference (cpu_reference/ring.hpp) runs it for the numbers, the
// cost model below reads it for bytes, FLOPs and time, and a picture or a GPU ring replays it.
//
//   layout      how the tokens of the sequence are shared out over the P ranks
//   RingSchedule   for each step s and rank r: the K/V share it holds (the one that started on rank
//                  (r - s) mod P), and the (query range, key range) pairs it computes, each with its
//                  causal relationship: fully visible, fully masked (skipped) or on the diagonal
//   ring_cost   per step: bytes on each link, FLOPs per rank, the step's time when compute and
//               transfer overlap, idle time per rank, imbalance
#include <cstdint>
#include <string>
#include <vector>

#include "core/hd.hpp"
#include "core/problem.hpp"
#include "model/traffic.hpp"  // Pass

namespace flashlab {

// How the sequence is shared out (queries and keys alike, each over its own length):
//  * Contiguous: rank r holds the r-th of P consecutive chunks (sizes differ by at most one).
//  * Zigzag: the sequence is cut into 2P equal chunks; rank r holds chunks r and 2P-1-r, so under a
//    causal mask every rank gets one cheap early chunk and one expensive late one.
//  * Striped: token t belongs to rank t mod P, which also balances causal work.
enum class RingLayout { Contiguous, Zigzag, Striped };
const char* to_string(RingLayout);                // "contiguous", "zigzag", "striped"
RingLayout parse_ring_layout(const std::string&);  // throws InputError naming the supported ones

// An arithmetic progression of token indices: first, first + stride, ..., count of them. A contiguous
// range has stride 1; a striped share has stride P.
struct TokenRange {
  int first = 0, count = 0, stride = 1;
  FLASHLAB_HD int token(int local) const { return first + local * stride; }  // (the GPU ring packs by it)
  friend bool operator==(const TokenRange&, const TokenRange&) = default;
};

// How a pair of ranges meets the causal mask. Diagonal: local key c is visible from local query a iff
// c <= a + causal_offset (a and c count from 0 within each range; both ranges have the same stride).
enum class Visibility { Full, Skipped, Diagonal };
const char* to_string(Visibility);  // "full", "skipped", "diagonal"

// One block of work: the queries `q` of a rank against the keys `k` of the K/V share it holds.
struct BlockPair {
  TokenRange q, k;
  int q_offset = 0;  // where q starts among the rank's own query tokens (its ranges in order)
  int k_offset = 0;  // where k starts among the tokens of the K/V share
  Visibility visibility = Visibility::Full;
  int causal_offset = 0;              // Diagonal only
  std::int64_t visible_scores = 0;    // (query, key) pairs the mask leaves: q.count * k.count when Full, 0 when Skipped
};

// What rank r does at one step: attend its queries to the K/V share that started on rank kv_origin,
// then pass that share on to rank send_to.
struct RankStep {
  int kv_origin = 0;
  int send_to = 0;
  std::vector<BlockPair> pairs;  // every pair of (own query range, held key range), skipped ones included
};

struct RingSchedule {
  RingLayout layout = RingLayout::Contiguous;
  int ranks = 1;  // P
  int seq_q = 1, seq_k = 1;
  CausalAlign causal = CausalAlign::None;
  std::vector<std::vector<TokenRange>> q_ranges;   // [rank]: the query tokens it keeps
  std::vector<std::vector<TokenRange>> kv_ranges;  // [rank]: the K/V tokens that start there
  std::vector<std::vector<RankStep>> steps;        // [step][rank], P steps

  int q_tokens(int rank) const;   // how many query tokens the rank keeps
  int kv_tokens(int origin) const;  // how many tokens the K/V share that started on `origin` holds
  // Whether the K/V share held at `step` is still needed after it: false at the last step. (The
  // backward pass's dK/dV partials travel at every step: the last hop takes them home.)
  bool kv_travels_on(int step) const { return step + 1 < ranks; }
};

// The schedule of P ranks for a problem's lengths and causal alignment. Throws InputError, in one
// sentence, when P < 1, when a rank would hold no query or no key (each length must be at least P),
// or for zigzag when a length is not a multiple of 2P.
RingSchedule ring_schedule(RingLayout, int ranks, int seq_q, int seq_k, CausalAlign);

// ---------------------------------------------------------------------------------------------
// A pair on a block kernel that knows only the two usual alignments (the GPU ring, cuda/ring.hpp): the
// pair's m queries against the first `keys` keys of its range, with `align`. A Diagonal pair's rule
// c <= a + causal_offset is bottom-right on m queries and m + causal_offset keys, so keys past that are
// dropped; rows that would see the range's every key (when it has fewer than m + causal_offset) would need
// a block of their own, and block_launch refuses them instead.
struct BlockLaunch {
  bool skip = false;  // no (query, key) pair of it is visible: nothing to compute
  int keys = 0;       // the first `keys` of the pair's key range
  CausalAlign align = CausalAlign::None;
};

// Throws InputError, in one sentence, for a Diagonal pair whose last rows see all of its keys (this only
// happens with seq_q != seq_k under a causal mask).
BlockLaunch block_launch(const BlockPair&);

// ---------------------------------------------------------------------------------------------
// The cost model: what each step moves and computes, and how long it takes when every rank computes
// while it sends (a step lasts as long as its slowest rank's compute or its slowest link).

struct RingMachine {
  double flops_per_second = 400e12;       // what one rank's attention kernel sustains
  double link_bytes_per_second = 400e9;   // one direction of the link from a rank to the next
  int kv_bytes_per_element = 2;           // K and V as stored (bf16)
  int grad_bytes_per_element = 4;         // the travelling dK/dV partial sums (fp32: they add P terms)
};

struct RingStepCost {
  std::vector<std::int64_t> link_bytes;  // [rank]: bytes rank sends to the next over this step
  std::vector<double> flops;             // [rank]
  std::vector<double> idle_seconds;      // [rank]: the step's time minus the rank's compute time
  double seconds = 0;                    // max over ranks of max(compute, transfer)
  double imbalance = 1;                  // max flops / mean flops (1 when no rank computes)
};

struct RingCost {
  Pass pass = Pass::Forward;
  std::vector<RingStepCost> steps;
  std::vector<double> flops_per_rank;  // over all steps
  double total_flops = 0;
  std::int64_t total_link_bytes = 0;
  double seconds = 0;    // the sum of the steps' times
  double imbalance = 1;  // max over ranks of total flops / mean
};

// Bytes of one K (or V) share: B * H_kv * tokens * d elements.
std::int64_t kv_share_bytes(const Shape&, int tokens, int bytes_per_element);

// The schedule's costs for a problem of `shape` (its seq_q and seq_k must be the schedule's). Forward:
// each step but the last sends K and V on; FLOPs are core/flops.hpp's per visible score. Backward:
// 2.5x those FLOPs; each step sends the dK/dV partials (the last hop brings them home) and, but for
// the last, K and V.
RingCost ring_cost(const RingSchedule&, const Shape&, Pass, const RingMachine&);

}  // namespace flashlab
