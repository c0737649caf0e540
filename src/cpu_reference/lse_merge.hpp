#pragma once
// Merging two partial attention results exactly, through their logsumexps. Attention over the keys
// A u B is a weighted mean of attention over A and over B, the weights being each part's share of the
// softmax's denominator: with (O, L) over A and (O_b, L_b) over B,
//
//   L_new = log(e^L + e^L_b)       = max(L, L_b) + log1p(exp(-|L_b - L|))
//   O_new = (e^L O + e^L_b O_b) / e^L_new = O + sigmoid(L_b - L) (O_b - O)
//
// Written with max, log1p and a sigmoid, no exponential of a large number is ever formed. This is how
// a ring of ranks (cpu_reference/ring.hpp) folds in each K/V share as it arrives; the merge is
// associative and commutative up to rounding, so the order the shares arrive in does not matter.
#include <cmath>

#include "core/logsumexp.hpp"  // stable_sigmoid, log_add_exp
#include "cpu_reference/attention_math.hpp"

namespace flashlab {

// Folds the block result (O_b, L_b) into rows [row0, row0 + O_b.rows()) of the running (O, L).
// A row with L = -inf has seen no key yet and takes the block's result; a block row with L_b = -inf saw
// none of the block's keys and changes nothing. O, O_b: (rows, d); L, L_b: (rows).
template <class T>
void merge_attention_partial(detail::Mat<T>& O, detail::Col<T>& L, Eigen::Index row0, const detail::Mat<T>& O_b,
                             const detail::Col<T>& L_b) {
  for (Eigen::Index r = 0; r < O_b.rows(); ++r) {
    T& L_run = L(row0 + r);
    if (L_b(r) == detail::kNegInf<T>) continue;
    if (L_run == detail::kNegInf<T>) {
      O.row(row0 + r) = O_b.row(r);
      L_run = L_b(r);
      continue;
    }
    const T diff = L_b(r) - L_run;
    O.row(row0 + r) += stable_sigmoid(diff) * (O_b.row(r) - O.row(row0 + r));
    L_run = log_add_exp(L_run, L_b(r));
  }
}

}  // namespace flashlab
