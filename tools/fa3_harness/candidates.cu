// Candidate schedules of the cuda-fa3-ws forward, built from the shipped kernel's own parts
// (src/cuda/fa3_ws/forward_kernel.cuh) so the harness can race them against what ships. A candidate that
// wins is promoted by making it ShippedSchedule (forward_config.cuh), which puts it under the project's
// checks; the shipped library never carries these kernels.
//   candidate 0: query blocks heads fastest below step 5, V_j before K_{j+1}, two K/V stages at d = 128
//   candidate 1: + query blocks fastest
//   candidate 3: + K_{j+1} ahead of V_j (d = 128 only)
//   kShipped (-1): the shipped schedule, for step 5's heads per L2 group (`heads_per_group`: 0 = the launcher's
//   choice), which only this entry lets a caller choose
// Steps 2-5, without dropout; the narrow K/V blocks (the shipped schedule: its own).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/fa3_ws/forward_kernel.cuh"
#include "candidates.hpp"

namespace flashlab::cuda::fa3_ws {

bool launch_forward_variant(DType dtype, const Params& p, cudaStream_t stream, LadderStep step, int candidate,
                            int heads_per_group) {
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return true;
  bool built = false;
  dispatch_head_dim<kHeadDims>(p.head_dim, "fa3_harness candidates", [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      if constexpr (kStep >= 2) {
        if (p.dropout) return;
        auto go = [&]<class S>() {
          with_element(dtype, [&]<class T>() {
            launch_config<T, D, kStep, false, false, S>(p, stream, heads_per_group);
          });
          built = true;
        };
        if (candidate == kShipped) with_shipped_schedule<D, kStep>(p, go);
        else if (candidate == 0) go.template operator()<Schedule<false, false, false, false>>();
        else if (candidate == 1) go.template operator()<Schedule<true, false, false, false>>();
        else if constexpr (D == 128) {
          if (candidate == 3) go.template operator()<Schedule<true, true, false, false>>();
        }
      }
    });
  });
  return built;
}

}  // namespace flashlab::cuda::fa3_ws
