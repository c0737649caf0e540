// cuda-fa3-ws: the host side of the warp-specialized Hopper forward (fp16/bf16 in, fp32 accumulation,
// O in the input dtype, LSE in fp32): the variant table's forward and bench entry points, one per step
// of the ablation ladder (cuda-fa3-ws-step1 .. step4, and cuda-fa3-ws, the shipped step 5). The kernel,
// and what each ladder step adds, is in fa3_ws/fa3_ws_forward.cu (compiled for sm_90a only); this file
// is compiled like every other host file, so the shared helper kernels it instantiates (poison,
// fill_random of host_passes.cuh) keep their code for every architecture. Forward only: there is no
// backward yet, and the registry says so before anything reaches this file.
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/philox.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_variants.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/host_passes.cuh"

namespace flashlab {
namespace {

namespace fa3 = cuda::fa3ws;

fa3::LadderStep ladder_step(int step) {
  if (step < 1 || step > fa3::kLadderSteps)
    throw std::logic_error("cuda-fa3-ws has ladder steps 1 to " + std::to_string(fa3::kLadderSteps) + ", not " +
                           std::to_string(step));
  return static_cast<fa3::LadderStep>(step);
}

// The head dim, dtype, options and GPU were checked by the registry against cuda/constraints.hpp; what
// is left is this kernel's own launch limit.
void check_grid(const Problem& p, fa3::LadderStep step) {
  // One tile per (batch, query head, block of Br query rows), numbered by a 32-bit int: the grid's x
  // dimension below step 5, the tile list the persistent blocks walk at step 5.
  constexpr std::int64_t kMaxTiles = 2147483647;
  const std::int64_t br = fa3::block_rows(step);
  const std::int64_t tiles = (p.shape.seq_q + br - 1) / br * std::int64_t(p.shape.batch) * p.shape.heads_q;
  if (tiles > kMaxTiles)
    throw InputError("cuda-fa3-ws runs one tile per (batch, query head, " + std::to_string(br) +
                     " query rows), and batch x heads_q x ceil(seq_q / " + std::to_string(br) + ") = " +
                     std::to_string(tiles) + " tiles exceeds the kernel's limit of " + std::to_string(kMaxTiles));
}

fa3::Params make_params(const Problem& p) {
  fa3::Params params;
  cuda::set_extents(params, p.shape);
  cuda::set_softmax_and_dropout(params, p);
  return params;
}

// The persistent grid's tile counter (two ints) of the current device, zeroed when first asked for; every
// launch leaves it zero. One per device serves every launch here: they all go to the legacy default
// stream, which runs them one after another. It lives as long as the process (not a DeviceBuffer: its
// 8 bytes are not a problem's memory, and a static's destructor would run after the CUDA runtime's).
int* device_tile_counter() {
  static std::mutex mutex;
  static std::map<int, int*> counters;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  int*& counter = counters[dev];
  if (counter == nullptr) {
    CUDA_CHECK(cudaMalloc(&counter, 2 * sizeof(int)));
    CUDA_CHECK(cudaMemset(counter, 0, 2 * sizeof(int)));
  }
  return counter;
}

// The kernel's view of `t`: make_params, the device pointers of q, k, v, o and lse, and the tile counter.
template <class T>
fa3::Params params_for(const Problem& p, cuda::DeviceAttention<T>& t) {
  fa3::Params params = make_params(p);
  params.tile_counter = device_tile_counter();
  params.q = t.q.data();
  params.k = t.k.data();
  params.v = t.v.data();
  params.o = t.o.data();
  params.lse = t.lse.data();
  return params;
}

template <class T>
ForwardOut forward_as(fa3::LadderStep step, const Problem& p, DType dtype, const Qkv& in) {
  auto t = cuda::DeviceAttention<T>::for_forward(p.shape, in);
  fa3::launch_forward(dtype, params_for(p, t), /*stream=*/0, step);
  return t.download_forward(p.shape);
}

template <class T>
BenchResult bench_as(fa3::LadderStep step, const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  auto t = cuda::DeviceAttention<T>::random(p.shape, false);
  const fa3::Params params = params_for(p, t);
  const auto forward = [&] { fa3::launch_forward(dtype, params, /*stream=*/0, step); };
  const auto backward = [] { throw std::logic_error("cuda-fa3-ws has no backward (the registry should have refused)"); };
  return cuda::bench_passes(settings, scope, t, forward, backward);
}

}  // namespace

ForwardOut cuda_fa3_ws_forward_at(int step, const Problem& p, DType dtype, const Qkv& in) {
  const fa3::LadderStep s = ladder_step(step);
  check_grid(p, s);
  return dtype == DType::F16 ? forward_as<__half>(s, p, dtype, in) : forward_as<__nv_bfloat16>(s, p, dtype, in);
}

BenchResult cuda_fa3_ws_bench_at(int step, const Problem& p, DType dtype, const BenchSettings& settings) {
  const fa3::LadderStep s = ladder_step(step);
  check_grid(p, s);
  if (settings.backward) throw std::logic_error("cuda-fa3-ws has no backward (the registry should have refused)");
  return dtype == DType::F16 ? bench_as<__half>(s, p, dtype, settings) : bench_as<__nv_bfloat16>(s, p, dtype, settings);
}

}  // namespace flashlab
