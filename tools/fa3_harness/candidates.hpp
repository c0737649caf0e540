#pragma once
// The harness's own entry into the forward (candidates.cu): candidate schedules, and step 5's heads per L2 group,
// which the shipped entry does not let a caller choose.
#include <cuda_runtime.h>

#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace flashlab::cuda::fa3_ws {

inline constexpr int kShipped = -1;  // the candidate that is the shipped schedule
// Launches candidate `candidate` (0, 1, 3 or kShipped; candidates.cu says what each is) with step 5's tiles
// ordered in groups of `heads_per_group` heads (0: the launcher's choice). False where that candidate is not built
// for the problem (dropout, step 1, candidate 3 away from d = 128).
bool launch_forward_variant(DType dtype, const Params& p, cudaStream_t stream, LadderStep step, int candidate,
                            int heads_per_group = 0);

}  // namespace flashlab::cuda::fa3_ws
