// cuda-fa3-ws: the host side of the warp-specialized Hopper forward (fp16/bf16 in, fp32 accumulation,
// O in the input dtype, LSE in fp32): the variant table's forward and bench entry points, one per step
// of the ablation ladder (cuda-fa3-ws-step1 .. step4, and cuda-fa3-ws, the shipped step 5). The kernel,
// and what each ladder step adds, is in fa3_ws/forward_kernel.cuh and the parts it lists (compiled for
// sm_90a only); this file is compiled like every other host file, so the shared helper kernels it
// instantiates (poison, fill_random of host_passes.cuh) keep their code for every architecture. The shipped step also has the
// backward (fa3_ws/backward_kernel.cuh and its parts); its scratch is allocated here, per call, like cuda-fa2's.
//
// A bench with BenchSettings::record_timeline (`flashlab bench --timeline FILE`) times the shipped kernel as
// always, then runs the timeline build (launch_forward_timeline: the same step with the timeline hook
// compiled in; with --backward, launch_backward_timeline) to record one run's pipeline, and times that build
// too, so the bench can say what recording costs. The records go back in BenchResult::timeline; the caller
// writes them (the command line, as Trace Event JSON).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/philox.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_variants.hpp"
#include "cuda/device.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/host_passes.cuh"
#include "core/timeline_record.hpp"

namespace flashlab {
namespace {

cuda::fa3_ws::LadderStep ladder_step(int step) {
  if (step < 1 || step > cuda::fa3_ws::kLadderSteps)
    throw std::logic_error("cuda-fa3-ws has ladder steps 1 to " + std::to_string(cuda::fa3_ws::kLadderSteps) + ", not " +
                           std::to_string(step));
  return static_cast<cuda::fa3_ws::LadderStep>(step);
}

cuda::fa3_ws::Params make_params(const Problem& p) {
  cuda::fa3_ws::Params params;
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

// The kernel's view of a forward's tensors: make_params, their device pointers, and the tile counter.
cuda::fa3_ws::Params params_for(const Problem& p, const DeviceForwardIo& io) {
  cuda::fa3_ws::Params params = make_params(p);
  params.tile_counter = device_tile_counter();
  params.q = io.q;
  params.k = io.k;
  params.v = io.v;
  params.o = io.o;
  params.lse = io.lse;
  return params;
}

// The backward's kernel view: params_for's fields, the backward's tensors, the deterministic switch.
cuda::fa3_ws::Params backward_params_for(const Problem& p, const DeviceBackwardIo& io) {
  cuda::fa3_ws::Params params = make_params(p);
  params.q = io.q;
  params.k = io.k;
  params.v = io.v;
  params.o = const_cast<void*>(io.o);  // Params holds o and lse writable (the forward writes them); read here
  params.lse = const_cast<float*>(io.lse);
  params.d_o = io.d_o;
  params.dq = io.dq;
  params.dk = io.dk;
  params.dv = io.dv;
  params.deterministic = p.options.deterministic;
  return params;
}

// The backward's scratch (cuda::fa3_ws::backward_scratch): L_i log2(e) and D_i padded to whole query blocks, dQ's fp32
// sums, and their counters of completed additions (with the conversion's ticket).
struct BackwardScratch {
  cuda::DeviceBuffer<float> lse_log2, D_i, dq_accum;
  cuda::DeviceBuffer<int> dq_semaphore;
  BackwardScratch(const Shape& s, bool backward)
      : BackwardScratch(cuda::fa3_ws::backward_scratch(s.batch, s.heads_q, s.seq_q, s.head_dim), backward) {}
  BackwardScratch(const cuda::fa3_ws::BackwardScratchSizes& n, bool backward)
      : lse_log2(backward ? n.row_stats : 0), D_i(backward ? n.row_stats : 0), dq_accum(backward ? n.dq_accum : 0),
        dq_semaphore(backward ? n.semaphores : 0) {}
  void attach(cuda::fa3_ws::Params& params) {
    params.lse_log2 = lse_log2.data();
    params.D_i = D_i.data();
    params.dq_accum = dq_accum.data();
    params.dq_semaphore = dq_semaphore.data();
  }
};

// Record slots of a timeline run: 24 bytes each (192 KiB); about what four blocks of steps 2-4 write over
// one tile at N = 8k, d = 128 (a longer run fills it, and the bench says so).
constexpr int kTimelineCapacity = 8192;

// "ladder step 3, bf16, B=1 H=2 N=1024 d=128, blocks 0-3" (or "backward, bf16, ..."): what the run was (the
// harness's label form).
std::string timeline_label(cuda::fa3_ws::LadderStep step, bool backward, const Problem& p, DType dtype,
                           std::uint32_t first_block, std::uint32_t last_block) {
  const Shape& s = p.shape;
  std::string label = (backward ? std::string("backward") : "ladder step " + std::to_string(static_cast<int>(step))) +
                      ", " + to_string(dtype) + ", B=" + std::to_string(s.batch);
  label += s.heads_q == s.heads_kv ? " H=" + std::to_string(s.heads_q)
                                   : " Hq=" + std::to_string(s.heads_q) + " Hkv=" + std::to_string(s.heads_kv);
  label += s.seq_q == s.seq_k ? " N=" + std::to_string(s.seq_q)
                              : " Sq=" + std::to_string(s.seq_q) + " Sk=" + std::to_string(s.seq_k);
  label += " d=" + std::to_string(s.head_dim);
  if (p.options.causal != CausalAlign::None) label += " causal " + std::string(to_string(p.options.causal));
  return label + ", blocks " + std::to_string(first_block) + "-" + std::to_string(last_block);
}

// After the timed runs: the timeline build once to warm up, timed (the same warm-up and iterations as
// the plain kernel), then one recording run into a buffer filled with 0xff (a hole reads as event
// kTimelineHole), downloaded, its holes left out. `backward`: the backward's build, with the backward's params.
BenchTimeline record_timeline(cuda::fa3_ws::LadderStep step, bool backward, const Problem& p, DType dtype,
                              const BenchSettings& settings, cuda::fa3_ws::Params params) {
  cuda::DeviceBuffer<TimelineRecord> records(kTimelineCapacity);
  cuda::DeviceBuffer<unsigned> count(1);
  params.timeline = records.data();
  params.timeline_count = count.data();
  params.timeline_capacity = kTimelineCapacity;
  const auto zero_count = [&] { CUDA_CHECK(cudaMemsetAsync(count.data(), 0, sizeof(unsigned), /*stream=*/0)); };
  const auto record = [&] {
    if (backward) cuda::fa3_ws::launch_backward_timeline(dtype, params, /*stream=*/0);
    else cuda::fa3_ws::launch_forward_timeline(dtype, params, /*stream=*/0, step);
  };

  BenchTimeline out;
  zero_count();
  record();  // warm-up: the first launch of this build loads its module
  out.recording_ms = cuda::median_ms(record, settings.warmup, settings.iters, zero_count);

  CUDA_CHECK(cudaMemset(records.data(), 0xff, records.bytes()));
  zero_count();
  record();
  CUDA_CHECK(cudaDeviceSynchronize());
  unsigned asked = 0;
  CUDA_CHECK(cudaMemcpy(&asked, count.data(), sizeof asked, cudaMemcpyDeviceToHost));
  std::vector<TimelineRecord> raw(std::min<std::size_t>(asked, kTimelineCapacity));
  if (!raw.empty())
    CUDA_CHECK(cudaMemcpy(raw.data(), records.data(), raw.size() * sizeof(TimelineRecord), cudaMemcpyDeviceToHost));
  std::vector<TimelineRecord> kept;
  kept.reserve(raw.size());
  for (const TimelineRecord& r : raw)
    if (r.event != cuda::fa3_ws::kTimelineHole) kept.push_back(r);
  if (kept.empty())
    throw std::runtime_error("cuda-fa3-ws: the timeline build recorded no events (" + std::to_string(asked) +
                             " record slots taken)");

  out.records = std::move(kept);
  out.capacity = kTimelineCapacity;
  out.buffer_filled = asked > static_cast<unsigned>(kTimelineCapacity);
  out.first_block = out.last_block = out.records.front().block;
  for (const TimelineRecord& r : out.records) {
    out.first_block = std::min(out.first_block, r.block);
    out.last_block = std::max(out.last_block, r.block);
  }
  out.device = cuda::device_name();
  out.variant = "cuda-fa3-ws";
  out.label = timeline_label(step, backward, p, dtype, out.first_block, out.last_block);
  // From step 2 on (and in the backward), warpgroup 0 is the producer; step 1's one warpgroup issues its own
  // loads and computes.
  out.producer_warpgroups = backward || static_cast<int>(step) >= 2 ? 1u : 0u;
  return out;
}

template <class T>
BenchResult bench_as(cuda::fa3_ws::LadderStep step, const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  auto t = cuda::DeviceAttention<T>::random(p.shape, settings.backward);
  BackwardScratch scratch(p.shape, settings.backward);
  const cuda::fa3_ws::Params params = params_for(p, t.forward_io());
  cuda::fa3_ws::Params backward_params = backward_params_for(p, t.backward_io());
  scratch.attach(backward_params);
  const auto forward = [&] { cuda::fa3_ws::launch_forward(dtype, params, /*stream=*/0, step); };
  // The launcher clears dQ's sums and their counters first (in its pre-pass): timed with the pass.
  const auto backward = [&] { cuda::fa3_ws::launch_backward(dtype, backward_params, /*stream=*/0); };
  // The timed runs are the shipped kernel's, with or without a timeline asked for.
  BenchResult result = cuda::bench_passes(settings, scope, t, forward, backward);
  if (settings.record_timeline)
    result.timeline = settings.backward ? record_timeline(step, true, p, dtype, settings, backward_params)
                                        : record_timeline(step, false, p, dtype, settings, params);
  return result;
}

}  // namespace

void cuda_fa3_ws_forward_on_device_at(int step, const Problem& p, DType dtype, const DeviceForwardIo& io) {
  const cuda::fa3_ws::LadderStep s = ladder_step(step);
  cuda::fa3_ws::launch_forward(dtype, params_for(p, io), /*stream=*/0, s);
  cuda::finish_on_device();
}

ForwardOut cuda_fa3_ws_forward_at(int step, const Problem& p, DType dtype, const Qkv& in) {
  const auto run_on_device = [step](const Problem& problem, DType t, const DeviceForwardIo& io) {
    cuda_fa3_ws_forward_on_device_at(step, problem, t, io);
  };
  return cuda::forward_from_host(run_on_device, p, dtype, in);
}

void cuda_fa3_ws_backward_on_device(const Problem& p, DType dtype, const DeviceBackwardIo& io) {
  BackwardScratch scratch(p.shape, true);
  cuda::fa3_ws::Params params = backward_params_for(p, io);
  scratch.attach(params);
  cuda::fa3_ws::launch_backward(dtype, params, /*stream=*/0);
  cuda::finish_on_device();
}

Grads cuda_fa3_ws_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return cuda::backward_from_host(cuda_fa3_ws_backward_on_device, cuda::BackwardReads::o_and_lse, p, dtype, in, fwd, dO);
}

BenchResult cuda_fa3_ws_bench_at(int step, const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::fa3_ws::LadderStep s = ladder_step(step);
  if (settings.backward && s != cuda::fa3_ws::kShippedStep)
    throw std::logic_error("cuda-fa3-ws ladder steps 1-4 have no backward (the registry should have refused)");
  return dtype == DType::F16 ? bench_as<__half>(s, p, dtype, settings) : bench_as<__nv_bfloat16>(s, p, dtype, settings);
}

}  // namespace flashlab
