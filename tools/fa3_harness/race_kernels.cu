// One candidate of tools/fa3_harness/race.cu, built from the shipped kernel's parts (the persistent step) with the
// schedule its macros name; race.sh compiles it once per candidate, in parallel:
//   RACE_NAME  the launcher's name;  RACE_T  the element type (__nv_bfloat16 or __nv_fp8_e4m3);  RACE_D  the head dim;
//   RACE_WIDE  Schedule::kWideBlocks;  RACE_POLY  Schedule::kExp2PolyEvery (0: every exponential on the MUFU);
//   RACE_OWN_O  Schedule::kFp8OwnOBuffers;  RACE_LAZY  Schedule::kLazyRescale.
#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {

void RACE_NAME(const Params& p, cudaStream_t stream) {
  launch_config<RACE_T, RACE_D, static_cast<int>(kShippedStep), false, false,
                Schedule<true, true, true, RACE_WIDE, RACE_POLY, RACE_OWN_O, RACE_LAZY>>(p, stream);
}

}  // namespace flashlab::cuda::fa3_ws
