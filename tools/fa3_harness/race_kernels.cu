// One candidate of tools/fa3_harness/race.cu, built from the shipped kernel's parts (the persistent step) with the
// schedule its macros name; race.sh compiles it once per candidate, in parallel:
//   RACE_NAME  the launcher's name;  RACE_T  the element type (__nv_bfloat16 or __nv_fp8_e4m3);  RACE_D  the head dim;
//   RACE_WIDE  Schedule::kWideBlocks;  RACE_POLY  Schedule::kExp2PolyEvery (0: every exponential on the MUFU);
//   RACE_OWN_O  Schedule::kFp8OwnOBuffers;  RACE_LAZY  Schedule::kLazyRescale;
//   RACE_VT_SMEM  Schedule::kFp8TransposeInKernel (WithFp8TransposeInKernel): V transposed in the producer;
//   RACE_TREES  Schedule::kSoftmaxTrees (WithSoftmaxTrees; -1: the head config's choice);
//   RACE_BC  Schedule::kBlockKeys (WithBlockKeys; 0: the head config's K/V block);
//   RACE_SPLIT_S  Schedule::kSplitS (WithSplitS): S_ij in two halves where P V is waited before it;
//   RACE_CONSUMERS  Schedule::kConsumerWarpgroups (WithConsumers; 0: the head config's, two).
// An FP8 candidate without it reads the V^T the pre-pass writes, so its launcher runs that pre-pass first, as
// launch_forward_e4m3 does: race.cu times each launcher whole, and the two ways of transposing V compare fairly.
#include <type_traits>

#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {
namespace {
using RaceKnobs = Schedule<true, true, true, RACE_WIDE, RACE_POLY, RACE_OWN_O, RACE_LAZY>;
using RaceBase = std::conditional_t<(RACE_BC > 0), WithBlockKeys<RaceKnobs, RACE_BC>, RaceKnobs>;
using RaceTrees = std::conditional_t<(RACE_TREES < 0), RaceBase, WithSoftmaxTrees<RaceBase, (RACE_TREES == 1)>>;
using RaceSplit = std::conditional_t<RACE_SPLIT_S, WithSplitS<RaceTrees>, RaceTrees>;
using RaceSchedule = std::conditional_t<(RACE_CONSUMERS > 0), WithConsumers<RaceSplit, RACE_CONSUMERS>, RaceSplit>;
constexpr bool kRaceE4m3 = ElementTraits<RACE_T>::kBytes == 1;
static_assert(kRaceE4m3 || !RACE_VT_SMEM, "V is transposed in the producer for FP8 candidates only");
}  // namespace

void RACE_NAME(const Params& p, cudaStream_t stream) {
  if constexpr (RACE_VT_SMEM) {
    launch_config<RACE_T, RACE_D, static_cast<int>(kShippedStep), false, false, WithFp8TransposeInKernel<RaceSchedule>>(
        p, stream);
  } else {
    if constexpr (kRaceE4m3) transpose_v_e4m3(p.v, p.vt, p.batch, p.seq_k, p.heads_kv, p.head_dim, stream);
    launch_config<RACE_T, RACE_D, static_cast<int>(kShippedStep), false, false, RaceSchedule>(p, stream);
  }
}

}  // namespace flashlab::cuda::fa3_ws
