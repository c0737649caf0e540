#pragma once
// The online softmax, row by row, in the order the loop nest visits the blocks. For each visit of
// score tile S_ij (taken from the recorded events, so FA1 and FA2 visit in their own orders) every
// row r of query block i updates its running max and sum:
//   m_new = max(m_old, rowmax(S_ij[r])),  rescale = exp(m_old - m_new),
//   l_new = rescale * l_old + rowsum(exp(S_ij[r] - m_new)).
// The values are real: random inputs, and the final m + log(l) is checked against the LSE of the
// library's own tiled_forward on the same inputs, and O against a direct (two-pass) softmax.
#include <cstdint>
#include <string>
#include <vector>

#include "replay.hpp"

namespace flashlab::viz {

constexpr int kMaxSoftmaxSeq = 1024;  // real values cost O(N^2 d) when the scenario changes

struct SoftmaxVisit {
  std::int64_t event = 0;  // index of the first event of this visit of S_ij
  int i = 0, j = 0;
};

struct SoftmaxRow {
  double m = 0, l = 0, rescale = 1;  // after the visit; m = -inf and l = 0 before any unmasked key
  int visits = 0;                    // visits of this row's block so far
};

struct SoftmaxTrace {
  bool available = false;
  std::string why_not;                 // one sentence when !available
  int seq_q = 0, Br = 0;
  std::vector<SoftmaxVisit> visits;    // in event order
  std::vector<std::vector<SoftmaxRow>> after;  // after[v][r - i*Br]: rows of visit v's block
  std::vector<double> direct_m, direct_l;      // (seq_q): two-pass softmax over the whole row
  double max_err_o = 0;                // max |O_online - O_direct| over all elements
  double max_err_lse_library = 0;      // max |m + log l - LSE of tiled_forward| over unmasked rows
};

// Replays the row updates of a forward FA1/FA2 trace with random inputs (seed). Not available (with
// a reason) for the standard algorithm, the backward pass, or seq_q > kMaxSoftmaxSeq.
SoftmaxTrace trace_online_softmax(const Trace&, std::uint64_t seed);

// Row r's running state after the first `step` events.
SoftmaxRow row_state(const SoftmaxTrace&, int row, std::int64_t step);

}  // namespace flashlab::viz
