// cuda-fa3-ws forward with the timeline hook compiled in (timeline_lane.cuh): the kernels of launch_forward
// without dropout and of launch_forward_e4m3, built a second time with kTimeline = true, behind `flashlab bench
// --timeline`; 66 + 2 kernels: not the three-consumer ones of d = 64 at steps 5-7 (cuda/tilings.hpp,
// forward_timeline_records), and the FP8 ones at d = 64 and 128 only (constraints.hpp). Its own translation unit, so
// that the shipped kernels carry no recording code and both compile in parallel. fa3_ws_params.hpp says what the
// caller provides.
#include <stdexcept>

#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {

void launch_forward_timeline(DType dtype, const Params& p, cudaStream_t stream, LadderStep step) {
  expect(!p.dropout, "the timeline build runs without dropout");
  expect(p.timeline == nullptr || (p.timeline_count != nullptr && p.timeline_capacity > 0),
         "the timeline build has a record counter and a capacity above 0 beside its record buffer");
  check_launch(dtype, p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  dispatch_head_dim<kHeadDims>(p.head_dim, "cuda-fa3-ws forward (timeline)", [&]<int D>() {
    dispatch_step(step, [&]<int kStep>() {
      with_shipped_schedule<D, kStep>(p, [&]<class S>() {
        // No three-consumer kernel here (cuda/tilings.hpp, forward_timeline_records; the bench refuses first).
        if constexpr (HeadConfig<D, S, StepConfig<kStep>::kPersistent>::kConsumers == 3)
          precondition_failed("the timeline build has no three-consumer kernel (d = 64, steps 5-7)");
        else with_element(dtype, [&]<class T>() { launch_config<T, D, kStep, false, true, S>(p, stream); });
      });
    });
  });
}

void launch_forward_e4m3_timeline(const Params& p, cudaStream_t stream) {
  expect(p.timeline == nullptr || (p.timeline_count != nullptr && p.timeline_capacity > 0),
         "the timeline build has a record counter and a capacity above 0 beside its record buffer");
  check_launch_e4m3(p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  transpose_v_e4m3(p.v, p.vt, p.batch, p.seq_k, p.heads_kv, p.head_dim, stream);
  expect(lists_head_dim<kE4m3TimelineHeadDims>(p.head_dim),
         [] { return "the FP8 timeline build's head dim is one of " + listed_head_dims<kE4m3TimelineHeadDims>(); });
  dispatch_head_dim<kE4m3TimelineHeadDims>(p.head_dim, "cuda-fa3-ws FP8 forward (timeline)", [&]<int D>() {
    launch_config<__nv_fp8_e4m3, D, static_cast<int>(kShippedStep), false, true, Fp8ShippedSchedule<D>>(p, stream);
  });
}

}  // namespace flashlab::cuda::fa3_ws
