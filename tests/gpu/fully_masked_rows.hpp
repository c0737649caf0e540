#pragma once
// One check for every GPU suite: in a forward output whose first `empty_rows` query rows see no key
// (bottom-right causal with seq_q > seq_k), those rows have O = 0 and LSE = -inf, and every other row a
// finite LSE and a nonzero O. Batch 0 only.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>

#include "core/problem.hpp"
#include "core/tensor.hpp"

inline void check_fully_masked_rows(const flashlab::ForwardOut& out, const flashlab::Shape& s, int empty_rows) {
  for (int h = 0; h < s.heads_q; ++h)
    for (int row = 0; row < s.seq_q; ++row) {
      const bool empty = row < empty_rows;
      const double lse = out.lse.data[std::size_t(h) * s.seq_q + row];
      CHECK_MESSAGE((empty ? lse == -INFINITY : std::isfinite(lse)), "head " << h << " row " << row << " LSE " << lse);
      double abs_sum = 0;
      for (int d = 0; d < s.head_dim; ++d) abs_sum += std::abs(out.o.at(0, row, h, d));
      if (empty) CHECK_MESSAGE(abs_sum == 0.0, "row " << row << " sees no key but O != 0");
      else CHECK_MESSAGE(abs_sum > 0.0, "row " << row << " sees keys but O == 0");
    }
}
