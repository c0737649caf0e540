// One FP8 forward candidate of tools/fa3_harness/fp8_race.cu, built from the shipped kernel's parts with the
// schedule its macros name (compiled once per candidate, in parallel, by fp8_race.sh):
//   RACE_NAME  the launcher's name;  RACE_D  the head dim;
//   RACE_POLY  Schedule::kFp8Exp2PolyEvery (0: every exponential on the MUFU);
//   RACE_OWN_O Schedule::kFp8OwnOBuffers (d = 256: an O buffer per consumer).
#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {

void RACE_NAME(const Params& p, cudaStream_t stream) {
  launch_config<__nv_fp8_e4m3, RACE_D, static_cast<int>(kShippedStep), false, false,
                Schedule<true, true, true, false, RACE_POLY, RACE_OWN_O>>(p, stream);
}

}  // namespace flashlab::cuda::fa3_ws
