#pragma once
// Lesson 01: standard ("naive") attention for one head, on plain row-major arrays, and what it costs
// in HBM traffic and memory. You write these functions in exercise.cpp; solution.cpp is ours; test.cpp
// checks yours against the project's reference (src/cpu_reference: naive_forward, count_traffic).
#include <cstdint>
#include <span>
#include <vector>

namespace flashlab::lesson01 {

// Safe softmax of one row of scores, in place:
//   m = max_j s_j,   p_j = exp(s_j - m) / sum_k exp(s_k - m).
// Subtracting m changes nothing mathematically and keeps every exp() <= 1, so it never overflows.
void softmax_row(std::span<double> row);  // (seq_k)

// O = softmax(scale * Q K^T) V for one head, materializing S and P as the frameworks did:
//   S = scale * Q K^T   (seq_q, seq_k)
//   P = softmax(S)      (seq_q, seq_k), row by row
//   O = P V             (seq_q, d)
// Q is (seq_q, d), K and V are (seq_k, d), all row-major. Returns O, (seq_q, d) row-major.
std::vector<double> naive_attention(std::span<const double> Q, std::span<const double> K,
                                    std::span<const double> V, int seq_q, int seq_k, int d,
                                    double scale);

// Bytes that standard attention (the paper's Algorithm 0) moves between HBM and on-chip SRAM for
// one head, per tensor, when every element is `bytes_per_element` bytes. Each step is its own kernel:
//   1. for each block Q_i of Br query rows: load Q_i, then every block of K; write S_i = tau Q_i K^T
//   2. read S; compute P = softmax(S); write P
//   3. for each block of Br rows: load P_i and every block of V; write O_i = P_i V
// so K and V are loaded once per query block, Tr = ceil(seq_q / Br) times.
struct StandardTraffic {
  std::int64_t read_Q = 0, read_K = 0, read_V = 0, read_S = 0, read_P = 0;
  std::int64_t written_S = 0, written_P = 0, written_O = 0;
  std::int64_t total() const {
    return read_Q + read_K + read_V + read_S + read_P + written_S + written_P + written_O;
  }
};
StandardTraffic standard_attention_traffic(std::int64_t seq_q, std::int64_t seq_k, std::int64_t d,
                                           int Br, int bytes_per_element);

// Bytes of memory standard attention needs beyond its inputs (Q, K, V) and output (O): S and P.
std::int64_t standard_attention_extra_bytes(std::int64_t seq_q, std::int64_t seq_k,
                                            int bytes_per_element);

}  // namespace flashlab::lesson01
