// Lesson 01, exercise: standard attention for one head, and what it costs.
//
// Fill in the six TODOs below (README.md explains the idea), then build and test YOUR file:
//   cmake -S . -B build -DFLASHLAB_LESSON_SOLUTIONS=OFF
//   cmake --build build --target lesson01_naive_attention
//   ctest --test-dir build -L lesson -R 01 --output-on-failure
// Every array is row-major: element (r, c) of an (R, C) matrix is at [r * C + c].
// Delete each `(void)x;` line once your code uses x (it only silences "unused" warnings).
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "lesson.hpp"

namespace flashlab::lesson01 {

void softmax_row(std::span<double> row) {
  // TODO 1 (about 6 lines): the safe softmax, in place.
  //   m = the largest score in the row            (std::max_element)
  //   replace each s by exp(s - m), summing them into l
  //   divide every element by l
  // Why the max: exp(1000) overflows a double to inf; exp(s - m) is always <= 1.
  (void)row;
}

std::vector<double> naive_attention(std::span<const double> Q, std::span<const double> K,
                                    std::span<const double> V, int seq_q, int seq_k, int d,
                                    double scale) {
  const auto Nq = static_cast<std::size_t>(seq_q), Nk = static_cast<std::size_t>(seq_k);
  const auto D = static_cast<std::size_t>(d);

  std::vector<double> S(Nq * Nk, 0.0);  // (seq_q, seq_k): the O(N^2) buffer
  // TODO 2 (about 6 lines): S = scale * Q K^T, that is
  //   S[i * Nk + j] = scale * sum over k < D of Q[i * D + k] * K[j * D + k]
  (void)Q;
  (void)K;
  (void)scale;

  std::vector<double> P = S;  // (seq_q, seq_k): a second O(N^2) buffer, as in a framework
  // TODO 3 (about 2 lines): P = softmax(S), row by row, with your softmax_row. Row i of P is
  //   std::span<double>(P).subspan(i * Nk, Nk)

  std::vector<double> O(Nq * D, 0.0);  // (seq_q, d)
  // TODO 4 (about 4 lines): O = P V, that is
  //   O[i * D + k] = sum over j < Nk of P[i * Nk + j] * V[j * D + k]
  (void)V;
  return O;
}

StandardTraffic standard_attention_traffic(std::int64_t seq_q, std::int64_t seq_k, std::int64_t d,
                                           int Br, int bytes_per_element) {
  StandardTraffic t;
  // TODO 5 (about 8 lines, one per field): the bytes each step of Algorithm 0 (lesson.hpp) moves.
  //   Q and O are (seq_q, d), K and V are (seq_k, d), S and P are (seq_q, seq_k). Q, S, P and O
  //   move once; K and V are loaded once per block of Br query rows, Tr = ceil(seq_q / Br) times.
  (void)seq_q;
  (void)seq_k;
  (void)d;
  (void)Br;
  (void)bytes_per_element;
  return t;
}

std::int64_t standard_attention_extra_bytes(std::int64_t seq_q, std::int64_t seq_k,
                                            int bytes_per_element) {
  // TODO 6 (1 line): the bytes of the buffers standard attention allocates beyond Q, K, V and O.
  (void)seq_q;
  (void)seq_k;
  (void)bytes_per_element;
  return 0;
}

}  // namespace flashlab::lesson01
