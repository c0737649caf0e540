#pragma once
// What each CUDA kernel family accepts, as data: the registry's rows read it (and check every problem
// against it before dispatch), and the launchers turn a runtime head dim into a template argument from
// the same list (cuda/dispatch.cuh). One list per family; adding a head dim is one edit here.
#include <cstdint>

#include "core/problem.hpp"

namespace flashlab::cuda {

// The unfused pipelines (cuda-naive, cuda-cublas): any head dim the problem allows.
namespace unfused {
inline constexpr DType kDTypes[] = {DType::F32};
inline constexpr int kMaxHeadDim = 256;
}  // namespace unfused

// The fused fp32 kernels (cuda-fa1, cuda-fa2-simt): d is padded up to the next multiple of 32 in shared
// memory, and d = 128 is the largest tile that fits with Br = Bc = 64.
namespace simt {
inline constexpr DType kDTypes[] = {DType::F32};
inline constexpr int kPaddedHeadDims[] = {32, 64, 96, 128};
inline constexpr int kMaxHeadDim = 128;
}  // namespace simt

// cuda-fa2 (tensor cores): one compiled configuration per listed head dim.
namespace fa2 {
inline constexpr DType kDTypes[] = {DType::F16, DType::BF16};
inline constexpr int kHeadDims[] = {32, 64, 96, 128, 256};
}  // namespace fa2

// cuda-fa3-ws (warp-specialized Hopper kernel: TMA, wgmma, setmaxnreg): compiled only for sm_90a,
// whose wgmma and setmaxnreg run on compute capability 9.0 alone, so the registry refuses any other GPU.
// One compiled configuration per listed head dim (and ladder step).
namespace fa3_ws {
inline constexpr DType kDTypes[] = {DType::F16, DType::BF16};
inline constexpr int kHeadDims[] = {64, 128, 256};
// The backward (fa3_ws/backward_kernel.cuh), every head dim of the forward.
inline constexpr int kBackwardHeadDims[] = {64, 128, 256};
// The FP8 forward (float8 e4m3 Q, K, V; O in bf16): the shipped step only, forward only, no dropout. At d = 64 a row
// of Q or K is 64 bytes, and those tiles take the 64-byte swizzle (fa3_ws/hopper.cuh).
inline constexpr int kE4m3HeadDims[] = {64, 128, 256};
// Its timeline build (`flashlab bench --timeline`): at d = 256 the recording's registers spill beside O, S and P.
inline constexpr int kE4m3TimelineHeadDims[] = {64, 128};
inline constexpr int kComputeCapability = 90;  // major * 10 + minor
// Launch limits. The forward runs one tile per (batch, query head, block of query rows), numbered by a 32-bit int
// (the grid's x dimension below ladder step 5, the tile list the persistent blocks walk at step 5); a block takes
// kStep1QueryRows query rows at step 1 and kQueryRows from step 2 on. The backward runs one row of thread blocks
// per (batch, K/V head), the grid's y dimension.
inline constexpr int kStep1QueryRows = 64, kQueryRows = 128;
inline constexpr std::int64_t kMaxQueryTiles = 2147483647;
inline constexpr std::int64_t kMaxBackwardRows = 65535;
}  // namespace fa3_ws

}  // namespace flashlab::cuda
