// cuda-fa3-ws: the host side of the warp-specialized Hopper forward (fp16/bf16 in, fp32 accumulation,
// O in the input dtype, LSE in fp32): the variant table's forward and bench entry points, one per step
// of the ablation ladder (cuda-fa3-ws-step1 .. step4, and cuda-fa3-ws, the shipped step 5). The kernel,
// and what each ladder step adds, is in fa3_ws/forward_kernel.cuh and the parts it lists (compiled for
// sm_90a only); this file is compiled like every other host file, so the shared helper kernels it
// instantiates (poison, fill_random of host_passes.cuh) keep their code for every architecture. The shipped step also has the
// backward (fa3_ws/backward_kernel.cuh and its parts).
//
// The device entries run on the stream a call names and bring their scratch from it (DeviceLaunch of
// core/device_io.hpp; cuda_fa3_ws_device_scratch_bytes says how much: the forward's tile counter, the FP8 forward's
// V^T, the backward's row statistics and dQ sums), or allocate it for the call where it brings none.
//
// A bench with BenchSettings::record_timeline (`flashlab bench --timeline FILE`) times the shipped kernel as
// always, then runs the timeline build (launch_forward_timeline: the same step with the timeline hook
// compiled in; with --backward, launch_backward_timeline) to record one run's pipeline, and times that build
// too, so the bench can say what recording costs. The records go back in BenchResult::timeline; the caller
// writes them (the command line, as Trace Event JSON).
//
// The FP8 forward (launch_forward_e4m3, fa3_ws/forward_e4m3.cu) has its own paths here: its tensors are not of one
// element type (e4m3 inputs with a descale per (batch, head), V^T's scratch, O in bf16), so it has no
// DeviceAttention. cuda_fa3_ws_forward_e4m3_on_device runs it on the caller's device memory (V^T in the call's
// scratch); cuda_fa3_ws_forward_e4m3 uploads quantized host inputs and runs that same entry; the bench in
// DType::E4M3 times it on random e4m3 inputs made on the device.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/fp8.hpp"
#include "core/philox.hpp"
#include "cuda/common.cuh"
#include "cuda/cuda_variants.hpp"
#include "cuda/device.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fp8_quantize.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/tilings.hpp"
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
// launch leaves it zero. One per device serves the benches: their launches all go to the legacy default
// stream, which runs them one after another (the device entries take a counter per call). It lives as long as the
// process (not a DeviceBuffer: its 8 bytes are not a problem's memory, and a static's destructor would run after the
// CUDA runtime's).
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

// The backward's grid on this GPU (backward_plan): its consumer warpgroups, the splits of each group, the launch order.
// `timeline`: the timeline build's (two consumers). `consumers` > 0: that many (the tests' choice).
cuda::fa3_ws::BackwardPlan backward_plan_here(const Problem& p, bool timeline = false, int consumers = 0) {
  const Shape& s = p.shape;
  return cuda::fa3_ws::backward_plan(s.batch, s.heads_q, s.heads_kv, s.seq_q, s.seq_k, s.head_dim, p.options.causal,
                                     timeline, cuda::device_sm_count(), consumers);
}

// The backward's kernel view: params_for's fields, the backward's tensors, the deterministic switch, the plan's
// consumers and launch order (its splits come with the scratch, take_backward_scratch).
cuda::fa3_ws::Params backward_params_for(const Problem& p, const DeviceBackwardIo& io,
                                         const cuda::fa3_ws::BackwardPlan& plan) {
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
  params.consumers = plan.consumers;
  params.key_blocks_outer = plan.key_blocks_outer;
  return params;
}

// A device call's scratch (core/scratch.hpp carves it; counting with a carver of no base gives its size):
//  * a forward: the persistent grid's tile counter of its own (the benches share the device's, device_tile_counter,
//    on the legacy default stream), and for an FP8 forward V^T (fp8_vt_bytes) after it;
//  * a backward: BackwardScratch's arrays, in its order.
int* take_tile_counter(ScratchCarver& carve) { return carve.take<int>(2); }

void take_backward_scratch(ScratchCarver& carve, const Problem& p, const cuda::fa3_ws::BackwardPlan& plan,
                           cuda::fa3_ws::Params& params) {
  const Shape& s = p.shape;
  const cuda::fa3_ws::BackwardScratchSizes n = cuda::fa3_ws::backward_scratch(s.batch, s.heads_q, s.seq_q, s.head_dim);
  params.lse_log2 = carve.take<float>(n.row_stats);
  params.D_i = carve.take<float>(n.row_stats);
  params.dq_accum = carve.take<float>(n.dq_accum);
  params.dq_semaphore = carve.take<int>(n.semaphores);
  const cuda::fa3_ws::BackwardSplit& split = plan.split;
  params.group_splits = split.group_splits;
  if (split.group_splits > 1) {
    params.dk_partial = carve.take<float>(split.partials);
    params.dv_partial = carve.take<float>(split.partials);
    params.kv_tickets = carve.take<int>(split.tickets);
  }
}

// The backward's scratch (cuda::fa3_ws::backward_scratch): L_i log2(e) and D_i padded to whole query blocks, dQ's fp32
// sums, and their counters of completed additions (with the conversion's ticket); where the group's query heads are
// shared among thread blocks (the plan's split), dK's and dV's fp32 partial sums and their tickets.
struct BackwardScratch {
  cuda::DeviceBuffer<float> lse_log2, D_i, dq_accum;
  cuda::DeviceBuffer<int> dq_semaphore;
  cuda::fa3_ws::BackwardSplit split;
  cuda::DeviceBuffer<float> dk_partial, dv_partial;
  cuda::DeviceBuffer<int> kv_tickets;
  BackwardScratch(const Problem& p, bool backward, const cuda::fa3_ws::BackwardPlan& plan)
      : BackwardScratch(cuda::fa3_ws::backward_scratch(p.shape.batch, p.shape.heads_q, p.shape.seq_q, p.shape.head_dim),
                        backward ? plan.split : cuda::fa3_ws::BackwardSplit{}, backward) {}
  BackwardScratch(const cuda::fa3_ws::BackwardScratchSizes& n, const cuda::fa3_ws::BackwardSplit& split, bool backward)
      : lse_log2(backward ? n.row_stats : 0), D_i(backward ? n.row_stats : 0), dq_accum(backward ? n.dq_accum : 0),
        dq_semaphore(backward ? n.semaphores : 0), split(split), dk_partial(split.partials),
        dv_partial(split.partials), kv_tickets(split.tickets) {}
  void attach(cuda::fa3_ws::Params& params) {
    params.lse_log2 = lse_log2.data();
    params.D_i = D_i.data();
    params.dq_accum = dq_accum.data();
    params.dq_semaphore = dq_semaphore.data();
    params.group_splits = split.group_splits;
    if (split.group_splits > 1) {
      params.dk_partial = dk_partial.data();
      params.dv_partial = dv_partial.data();
      params.kv_tickets = kv_tickets.data();
    }
  }
};

// Record slots of a timeline run: 24 bytes each (192 KiB); about what four blocks of steps 2-4 write over
// one tile at N = 8k, d = 128 (a longer run fills it, and the bench says so).
constexpr int kTimelineCapacity = 8192;

// What steps 6 and 7 are, for a timeline's label: " (step 5, eager rescale)", or nothing for steps 1-5.
std::string ladder_rung_note(cuda::fa3_ws::LadderStep step) {
  if (step == cuda::fa3_ws::LadderStep::EagerRescale) return " (step 5, eager rescale)";
  if (step == cuda::fa3_ws::LadderStep::Exp2Emulated)
    return " (step 5, 1 in " + std::to_string(cuda::fa3_ws::kExp2PolyGroups) + " column groups' exp2 emulated)";
  return "";
}

// "ladder step 3, bf16, B=1 H=2 N=1024 d=128, blocks 0-3" (or "backward, bf16, ..."): what the run was (the
// harness's label form).
std::string timeline_label(cuda::fa3_ws::LadderStep step, bool backward, const Problem& p, DType dtype,
                           std::uint32_t first_block, std::uint32_t last_block) {
  const Shape& s = p.shape;
  std::string label = (backward ? std::string("backward") : "ladder step " + std::to_string(static_cast<int>(step))) +
                      ladder_rung_note(step) + ", " + to_string(dtype) + ", B=" + std::to_string(s.batch);
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
    else if (dtype == DType::E4M3) cuda::fa3_ws::launch_forward_e4m3_timeline(params, /*stream=*/0);
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
  const Shape& s = p.shape;
  const cuda::fa3_ws::BackwardPlan plan =
      settings.backward_grid
          ? cuda::fa3_ws::backward_grid(s.batch, s.heads_q, s.heads_kv, s.seq_k, s.head_dim,
                                        settings.backward_grid->consumers, settings.backward_grid->group_splits,
                                        settings.backward_grid->key_blocks_outer)
          : backward_plan_here(p);
  BackwardScratch scratch(p, settings.backward, plan);
  const cuda::fa3_ws::Params params = params_for(p, t.forward_io());
  cuda::fa3_ws::Params backward_params = backward_params_for(p, t.backward_io(), plan);
  scratch.attach(backward_params);
  const auto forward = [&] { cuda::fa3_ws::launch_forward(dtype, params, /*stream=*/0, step); };
  // The launcher clears dQ's sums and their counters first (in its pre-pass): timed with the pass.
  const auto backward = [&] { cuda::fa3_ws::launch_backward(dtype, backward_params, /*stream=*/0); };
  // The timed runs are the shipped kernel's, with or without a timeline asked for.
  BenchResult result = cuda::bench_passes(settings, scope, t, forward, backward);
  if (settings.backward)
    result.backward_grid = BackwardGrid{.consumers = plan.consumers,
                                        .group_splits = plan.split.group_splits,
                                        .key_blocks_outer = plan.key_blocks_outer};
  if (settings.record_timeline && settings.backward) {
    // The timeline build runs two consumers (backward_plan): its own plan, and scratch for that plan's splits.
    const cuda::fa3_ws::BackwardPlan timeline_plan = backward_plan_here(p, /*timeline=*/true);
    BackwardScratch timeline_scratch(p, true, timeline_plan);
    cuda::fa3_ws::Params timeline_params = backward_params_for(p, t.backward_io(), timeline_plan);
    timeline_scratch.attach(timeline_params);
    result.timeline = record_timeline(step, true, p, dtype, settings, timeline_params);
    if (backward_params.consumers != timeline_params.consumers)
      result.timeline->label += " (recorded with 2 consumer warpgroups; the timed runs had " +
                                std::to_string(backward_params.consumers) + ")";
  } else if (settings.record_timeline) {
    result.timeline = record_timeline(step, false, p, dtype, settings, params);
  }
  return result;
}

// ---- The FP8 forward ------------------------------------------------------------------------------------

// The V^T scratch of one FP8 forward's pre-pass: fp8_vt_bytes of a problem (cudaMalloc's alignment: 256 bytes,
// past the 16 it needs).
cuda::DeviceBuffer<std::uint8_t> e4m3_vt_scratch(const Shape& s) {
  return cuda::DeviceBuffer<std::uint8_t>(
      static_cast<std::size_t>(cuda::fa3_ws::fp8_vt_bytes(s.batch, s.heads_kv, s.head_dim, s.seq_k)));
}

// The kernel's view of an FP8 forward's tensors: params_for's fields (the tile counter among them), the descales
// and the V^T scratch.
cuda::fa3_ws::Params e4m3_params_for(const Problem& p, const DeviceForwardIo& io, const float* q_descale,
                                     const float* k_descale, const float* v_descale, void* vt) {
  cuda::fa3_ws::Params params = params_for(p, io);
  params.q_descale = q_descale;
  params.k_descale = k_descale;
  params.v_descale = v_descale;
  params.vt = vt;
  return params;
}

// The device tensors of one FP8 forward: q, k, v as e4m3 bytes (B, S, H, d), their descales (B, H), the V^T
// scratch of the pre-pass (the bench's; the host path leaves it to the device entry, which allocates its own), O
// in bf16, the LSE.
struct DeviceE4m3 {
  cuda::DeviceBuffer<std::uint8_t> q, k, v;
  cuda::DeviceBuffer<float> q_descale, k_descale, v_descale;
  cuda::DeviceBuffer<std::uint8_t> vt;
  cuda::DeviceBuffer<__nv_bfloat16> o;
  cuda::DeviceBuffer<float> lse;

  DeviceE4m3(const Shape& s, bool with_vt)
      : q(cuda::numel(q_dims(s))), k(cuda::numel(kv_dims(s))), v(cuda::numel(kv_dims(s))),
        q_descale(std::size_t(s.batch) * s.heads_q), k_descale(std::size_t(s.batch) * s.heads_kv),
        v_descale(std::size_t(s.batch) * s.heads_kv), vt(with_vt ? e4m3_vt_scratch(s) : cuda::DeviceBuffer<std::uint8_t>()),
        o(cuda::numel(q_dims(s))), lse(cuda::numel(lse_dims(s))) {}

  DeviceForwardIo forward_io() {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return DeviceForwardIo{dev, q.data(), k.data(), v.data(), o.data(), lse.data()};
  }

  // What BenchResult::io_bytes counts: the inputs (bytes and descales) and the outputs; V^T is scratch.
  std::size_t io_bytes() const {
    return q.bytes() + k.bytes() + v.bytes() + q_descale.bytes() + k_descale.bytes() + v_descale.bytes() + o.bytes() +
           lse.bytes();
  }

  cuda::fa3_ws::Params params(const Problem& p) {
    return e4m3_params_for(p, forward_io(), q_descale.data(), k_descale.data(), v_descale.data(), vt.data());
  }
};

// A host vector into a device buffer of the same size, byte for byte.
template <class T>
void copy_to_device(cuda::DeviceBuffer<T>& buf, const std::vector<T>& host) {
  if (host.size() != buf.size())
    throw std::logic_error("cuda-fa3-ws e4m3: " + std::to_string(host.size()) + " values for a buffer of " +
                           std::to_string(buf.size()) + " (the registry checks the sizes)");
  if (!host.empty()) CUDA_CHECK(cudaMemcpy(buf.data(), host.data(), buf.bytes(), cudaMemcpyHostToDevice));
}

// The bench's inputs: x uniform in (-1, 1), DeviceAttention::random's draw (cuda::random_uniform_pm1), stored as
// e4m3(448 x) (satfinite, nearest), so that with the descale 1/448 of every head they stand for x to e4m3's
// precision: the full range of the format, as quantize_e4m3_per_head would use it (amax near 1).
constexpr float kBenchE4m3Descale = 1.0f / kE4m3Max;

__global__ void fill_random_e4m3_kernel(std::uint8_t* out, std::size_t n, std::uint64_t seed) {
  const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  out[i] = __nv_cvt_float_to_fp8(kE4m3Max * cuda::random_uniform_pm1(i, seed), __NV_SATFINITE, __NV_E4M3);
}

void fill_random_e4m3(cuda::DeviceBuffer<std::uint8_t>& buf, std::uint64_t seed) {
  constexpr int kThreads = 256;
  if (buf.size() == 0) return;
  const std::size_t blocks = (buf.size() + kThreads - 1) / kThreads;
  fill_random_e4m3_kernel<<<static_cast<unsigned>(blocks), kThreads>>>(buf.data(), buf.size(), seed);
  CUDA_CHECK_LAUNCH();
}

// Random activations of `dtype` (F32, F16 or BF16), uniform in (-1, 1) as fill_random draws them, and the pre-pass
// that quantizes them into an FP8 forward's inputs (cuda/fp8_quantize.hpp).
struct E4m3Activations {
  cuda::DeviceBuffer<float> f32[3];
  cuda::DeviceBuffer<__half> f16[3];
  cuda::DeviceBuffer<__nv_bfloat16> bf16[3];
  cuda::E4m3QkvPrepassIo io;

  E4m3Activations(const Shape& s, DType dtype, DeviceE4m3& t) {
    const std::size_t n[3] = {cuda::numel(q_dims(s)), cuda::numel(kv_dims(s)), cuda::numel(kv_dims(s))};
    const void* x[3] = {};
    // Buffer i of the dtype's array, filled with seed i + 1; x[i] is its address.
    const auto make = [&](auto& buffers, int i) {
      using Buffer = std::remove_reference_t<decltype(buffers[i])>;
      buffers[i] = Buffer(n[i]);
      cuda::fill_random(buffers[i], static_cast<std::uint64_t>(i + 1));
      x[i] = buffers[i].data();
    };
    for (int i = 0; i < 3; ++i) {
      if (dtype == DType::F32) make(f32, i);
      else if (dtype == DType::F16) make(f16, i);
      else make(bf16, i);
    }
    io = cuda::E4m3QkvPrepassIo{.shape = s, .dtype = dtype, .q = x[0], .k = x[1], .v = x[2], .q8 = t.q.data(),
                                .k8 = t.k.data(), .v8 = t.v.data(), .q_descale = t.q_descale.data(),
                                .k_descale = t.k_descale.data(), .v_descale = t.v_descale.data()};
  }
};

// The timed pass is launch_forward_e4m3 whole: the V^T pre-pass and the kernel, as every call runs them. With
// BenchSettings::fp8_prepass_from the inputs come from the quantizing pre-pass, timed on its own as well.
BenchResult bench_e4m3(const Problem& p, const BenchSettings& settings) {
  const cuda::PeakScope scope;
  DeviceE4m3 t(p.shape, /*with_vt=*/true);
  std::optional<E4m3Activations> activations;
  if (settings.fp8_prepass_from) {
    activations.emplace(p.shape, *settings.fp8_prepass_from, t);
  } else {
    fill_random_e4m3(t.q, 1);
    fill_random_e4m3(t.k, 2);
    fill_random_e4m3(t.v, 3);
    for (cuda::DeviceBuffer<float>* d : {&t.q_descale, &t.k_descale, &t.v_descale})
      copy_to_device(*d, std::vector<float>(d->size(), kBenchE4m3Descale));
  }
  const cuda::E4m3Rotation rotation{.enabled = settings.fp8_rotate, .seed = 1};
  double prepass_ms = -1;
  if (activations) {  // the forward's inputs, made once (and checked finite); then the pre-pass timed alone
    cuda::DeviceBuffer<std::uint8_t> scratch(cuda::e4m3_qkv_prepass_scratch_bytes(p.shape));
    cuda::e4m3_qkv_prepass_on_device(activations->io, rotation, scratch.data(), /*stream=*/0);
    prepass_ms = settings.one_pass ? -1 : cuda::time_e4m3_qkv_prepass_ms(activations->io, rotation, settings.warmup,
                                                                          settings.iters);
  }
  const cuda::fa3_ws::Params params = t.params(p);
  const auto forward = [&] { cuda::fa3_ws::launch_forward_e4m3(params, /*stream=*/0); };
  BenchResult result = cuda::bench_passes(settings, scope, t.io_bytes(), forward, {});
  result.prepass_ms = prepass_ms;
  if (settings.record_timeline)
    result.timeline = record_timeline(cuda::fa3_ws::kShippedStep, false, p, DType::E4M3, settings, params);
  return result;
}

}  // namespace

namespace {
std::size_t backward_scratch_bytes(const Problem& p, const cuda::fa3_ws::BackwardPlan& plan) {
  ScratchCarver count;
  cuda::fa3_ws::Params params;
  take_backward_scratch(count, p, plan, params);
  return count.used();
}
}  // namespace

std::size_t cuda_fa3_ws_device_scratch_bytes(const Problem& p, DType dtype, bool backward) {
  if (backward) return backward_scratch_bytes(p, backward_plan_here(p));
  ScratchCarver count;
  take_tile_counter(count);
  if (dtype == DType::E4M3)
    count.take<std::uint8_t>(static_cast<std::size_t>(
        cuda::fa3_ws::fp8_vt_bytes(p.shape.batch, p.shape.heads_kv, p.shape.head_dim, p.shape.seq_k)));
  return count.used();
}

namespace {

// The kernel's view of a forward on the call's stream: params_for's, with the tile counter taken from the call's
// scratch and zeroed on its stream (a counter per call: calls on several streams may run at once).
cuda::fa3_ws::Params forward_params_on(const Problem& p, const DeviceForwardIo& io, cuda::CallScratch& scratch) {
  cuda::fa3_ws::Params params = params_for(p, io);
  params.tile_counter = take_tile_counter(scratch.carver());
  CUDA_CHECK(cudaMemsetAsync(params.tile_counter, 0, 2 * sizeof(int), cuda::stream_of(io.launch)));
  return params;
}

}  // namespace

void cuda_fa3_ws_forward_e4m3_on_device(const Problem& p, const DeviceForwardIo& io, const float* q_descale,
                                        const float* k_descale, const float* v_descale) {
  cuda::CallScratch scratch(io.launch, cuda_fa3_ws_device_scratch_bytes(p, DType::E4M3, false));
  cuda::fa3_ws::Params params = forward_params_on(p, io, scratch);
  params.q_descale = q_descale;
  params.k_descale = k_descale;
  params.v_descale = v_descale;
  params.vt = scratch.take<std::uint8_t>(static_cast<std::size_t>(
      cuda::fa3_ws::fp8_vt_bytes(p.shape.batch, p.shape.heads_kv, p.shape.head_dim, p.shape.seq_k)));
  cuda::fa3_ws::launch_forward_e4m3(params, cuda::stream_of(io.launch));
  cuda::finish(io.launch);
}

ForwardOut cuda_fa3_ws_forward_e4m3(const Problem& p, const E4m3Qkv& in) {
  DeviceE4m3 t(p.shape, /*with_vt=*/false);  // the device entry allocates V^T's scratch
  copy_to_device(t.q, in.q);
  copy_to_device(t.k, in.k);
  copy_to_device(t.v, in.v);
  copy_to_device(t.q_descale, in.q_descale);
  copy_to_device(t.k_descale, in.k_descale);
  copy_to_device(t.v_descale, in.v_descale);
  cuda::poison(t.o);  // an element the kernel does not write reads as NaN
  cuda::poison(t.lse);
  cuda_fa3_ws_forward_e4m3_on_device(p, t.forward_io(), t.q_descale.data(), t.k_descale.data(), t.v_descale.data());
  return ForwardOut{cuda::download(t.o, q_dims(p.shape)), cuda::download(t.lse, lse_dims(p.shape))};
}

void cuda_fa3_ws_forward_on_device_at(int step, const Problem& p, DType dtype, const DeviceForwardIo& io) {
  const cuda::fa3_ws::LadderStep s = ladder_step(step);
  cuda::CallScratch scratch(io.launch, cuda_fa3_ws_device_scratch_bytes(p, dtype, false));
  cuda::fa3_ws::launch_forward(dtype, forward_params_on(p, io, scratch), cuda::stream_of(io.launch), s);
  cuda::finish(io.launch);
}

ForwardOut cuda_fa3_ws_forward_at(int step, const Problem& p, DType dtype, const Qkv& in) {
  const auto run_on_device = [step](const Problem& problem, DType t, const DeviceForwardIo& io) {
    cuda_fa3_ws_forward_on_device_at(step, problem, t, io);
  };
  return cuda::forward_from_host(run_on_device, p, dtype, in);
}

namespace {
void backward_on_device_with(const cuda::fa3_ws::BackwardPlan& plan, const Problem& p, DType dtype,
                             const DeviceBackwardIo& io) {
  cuda::CallScratch scratch(io.launch, backward_scratch_bytes(p, plan));
  cuda::fa3_ws::Params params = backward_params_for(p, io, plan);
  take_backward_scratch(scratch.carver(), p, plan, params);
  cuda::fa3_ws::launch_backward(dtype, params, cuda::stream_of(io.launch));  // its pre-pass clears dQ's sums
  cuda::finish(io.launch);
}
}  // namespace

void cuda_fa3_ws_backward_on_device(const Problem& p, DType dtype, const DeviceBackwardIo& io) {
  backward_on_device_with(backward_plan_here(p), p, dtype, io);
}

Grads cuda_fa3_ws_backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  return cuda::backward_from_host(cuda_fa3_ws_backward_on_device, cuda::BackwardReads::o_and_lse, p, dtype, in, fwd, dO);
}

namespace {
// A host-tensor backward on a given grid (the tests' entries below).
Grads backward_from_host_on(const cuda::fa3_ws::BackwardPlan& grid, const Problem& p, DType dtype, const Qkv& in,
                            const ForwardOut& fwd, const HostTensor& dO) {
  const auto run_on_device = [&grid](const Problem& problem, DType t, const DeviceBackwardIo& io) {
    backward_on_device_with(grid, problem, t, io);
  };
  return cuda::backward_from_host(run_on_device, cuda::BackwardReads::o_and_lse, p, dtype, in, fwd, dO);
}
}  // namespace

Grads cuda_fa3_ws_backward_with_consumers(int consumers, const Problem& p, DType dtype, const Qkv& in,
                                          const ForwardOut& fwd, const HostTensor& dO) {
  return backward_from_host_on(backward_plan_here(p, false, consumers), p, dtype, in, fwd, dO);
}

Grads cuda_fa3_ws_backward_on_grid(int consumers, int group_splits, bool key_blocks_outer, const Problem& p, DType dtype,
                                   const Qkv& in, const ForwardOut& fwd, const HostTensor& dO) {
  const Shape& s = p.shape;
  return backward_from_host_on(cuda::fa3_ws::backward_grid(s.batch, s.heads_q, s.heads_kv, s.seq_k, s.head_dim, consumers,
                                                           group_splits, key_blocks_outer),
                               p, dtype, in, fwd, dO);
}

BenchResult cuda_fa3_ws_bench_at(int step, const Problem& p, DType dtype, const BenchSettings& settings) {
  const cuda::fa3_ws::LadderStep s = ladder_step(step);
  if (settings.backward && s != cuda::fa3_ws::kShippedStep)
    throw std::logic_error("cuda-fa3-ws ladder steps 1-4 have no backward (the registry should have refused)");
  if (settings.record_timeline && !settings.backward && dtype != DType::E4M3 &&
      !cuda::fa3_ws::forward_timeline_records(p.shape.head_dim, p.shape.seq_q, p.shape.seq_k,
                                               p.options.causal != CausalAlign::None, step))
    throw InputError("cuda-fa3-ws records no forward timeline of " + std::to_string(p.shape.seq_q) +
                     " queries at d = 64 from ladder step 5 on: it runs three consumer warpgroups there, which have no "
                     "registers to spare for the recording; record steps 1-4, or a query count such as 256, where "
                     "it runs two");
  switch (dtype) {
    case DType::F16: return bench_as<__half>(s, p, dtype, settings);
    case DType::BF16: return bench_as<__nv_bfloat16>(s, p, dtype, settings);
    case DType::E4M3:
      if (s != cuda::fa3_ws::kShippedStep || settings.backward)
        throw std::logic_error("cuda-fa3-ws's FP8 forward is the shipped step's, without a backward (the registry "
                               "should have refused)");
      return bench_e4m3(p, settings);
    case DType::F64:
    case DType::F32: break;
  }
  throw std::logic_error(std::string("cuda-fa3-ws does not compute in ") + to_string(dtype) +
                         " (the registry should have refused it)");
}

}  // namespace flashlab
