// Lesson 01, reference solution: standard attention for one head, and its traffic and memory.
// Read exercise.cpp first; this file is what the build links while FLASHLAB_LESSON_SOLUTIONS is ON.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "lesson.hpp"

namespace flashlab::lesson01 {

void softmax_row(std::span<double> row) {
  const double m = *std::max_element(row.begin(), row.end());  // the row max keeps exp() <= 1
  double l = 0.0;                                               // the normalizer, sum_j exp(s_j - m)
  for (double& s : row) {
    s = std::exp(s - m);
    l += s;
  }
  for (double& p : row) p /= l;
}

std::vector<double> naive_attention(std::span<const double> Q, std::span<const double> K,
                                    std::span<const double> V, int seq_q, int seq_k, int d,
                                    double scale) {
  const auto Nq = static_cast<std::size_t>(seq_q), Nk = static_cast<std::size_t>(seq_k);
  const auto D = static_cast<std::size_t>(d);

  // S = scale * Q K^T: every query row against every key row.
  std::vector<double> S(Nq * Nk);  // (seq_q, seq_k): the O(N^2) buffer
  for (std::size_t i = 0; i < Nq; ++i)
    for (std::size_t j = 0; j < Nk; ++j) {
      double dot = 0.0;
      for (std::size_t k = 0; k < D; ++k) dot += Q[i * D + k] * K[j * D + k];
      S[i * Nk + j] = scale * dot;
    }

  // P = softmax(S), row by row. As in a framework, P is a second tensor: the softmax kernel reads S
  // and writes P, so both exist at once.
  std::vector<double> P = S;  // (seq_q, seq_k): a second O(N^2) buffer
  for (std::size_t i = 0; i < Nq; ++i) softmax_row(std::span<double>(P).subspan(i * Nk, Nk));

  // O = P V.
  std::vector<double> O(Nq * D, 0.0);  // (seq_q, d)
  for (std::size_t i = 0; i < Nq; ++i)
    for (std::size_t j = 0; j < Nk; ++j)
      for (std::size_t k = 0; k < D; ++k) O[i * D + k] += P[i * Nk + j] * V[j * D + k];
  return O;
}

StandardTraffic standard_attention_traffic(std::int64_t seq_q, std::int64_t seq_k, std::int64_t d,
                                           int Br, int bytes_per_element) {
  const std::int64_t Tr = (seq_q + Br - 1) / Br;                    // query blocks
  const std::int64_t q_bytes = seq_q * d * bytes_per_element;        // Q and O: (seq_q, d)
  const std::int64_t kv_bytes = seq_k * d * bytes_per_element;       // K and V: (seq_k, d)
  const std::int64_t score_bytes = seq_q * seq_k * bytes_per_element;  // S and P: (seq_q, seq_k)
  StandardTraffic t;
  t.read_Q = q_bytes;          // step 1: each Q_i once
  t.read_K = Tr * kv_bytes;    // step 1: all of K for every Q_i
  t.written_S = score_bytes;   // step 1
  t.read_S = score_bytes;      // step 2
  t.written_P = score_bytes;   // step 2
  t.read_P = score_bytes;      // step 3: each P_i once
  t.read_V = Tr * kv_bytes;    // step 3: all of V for every P_i
  t.written_O = q_bytes;       // step 3
  return t;
}

std::int64_t standard_attention_extra_bytes(std::int64_t seq_q, std::int64_t seq_k,
                                            int bytes_per_element) {
  return 2 * seq_q * seq_k * bytes_per_element;  // S and P, each (seq_q, seq_k)
}

}  // namespace flashlab::lesson01
