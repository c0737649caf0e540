#pragma once
// The GPU level of the traffic model for the CUDA variants: the kernels one forward pass launches, each as
// a model/gpu.hpp KernelGrid built from the tiling and launch order the kernel exports (cuda/tilings.hpp)
// and walking the one loop nest (cpu_reference's count_part_traffic) with that tiling. This table is in
// every build, CUDA or not: `flashlab trace --variant cuda-fa2 --gpu h100` runs on any machine.
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"
#include "model/gpu.hpp"
#include "model/tiling.hpp"

namespace flashlab {

// One forward pass of a CUDA variant, as the GPU level replays it.
struct GpuForwardPass {
  std::string variant;
  Algorithm algorithm{};
  DType dtype{};                   // the dtype the model moves (fa2, fa3-ws: 16-bit; naive, fa1: f32)
  Tiling tiling;                   // the tiles the loop nest walks
  std::vector<KernelGrid> kernels;  // in launch order
  std::string tiling_note;         // one line: the kernel's tiles, warps, blocks per SM and order
};

// The variants that have a GPU model, in table order: cuda-naive, cuda-fa1, cuda-fa2, cuda-fa3-ws.
std::vector<std::string> gpu_modeled_variants();

// The kernels of one forward pass of `variant` on `gpu`. Throws InputError (one sentence) for a variant
// with no GPU tiling (naming those that have one), and for a problem the variant does not run (its head
// dims). cuda-fa3-ws's tile order depends on the GPU's L2, as its launcher's does.
GpuForwardPass gpu_forward_pass(std::string_view variant, const Problem&, const GpuSpec&);
// The same pass as a kernel with `threads` threads a block ran it, so that counters recorded before cuda-fa3-ws's
// d = 64 block changed replay the kernel that ran (tests/test_gpu_counters.cpp): for cuda-fa3-ws, threads / 128 - 1
// consumer warpgroups on the K/V blocks that count takes, whatever it picks for the problem today (InputError for a
// block it never had); for the other variants, whose blocks did not change, gpu_forward_pass.
GpuForwardPass gpu_forward_pass_as_run(std::string_view variant, const Problem&, const GpuSpec&, int threads);

}  // namespace flashlab
