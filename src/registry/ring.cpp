#include "registry/ring.hpp"

#include "model/ring_timeline.hpp"
#include "registry/variants.hpp"
#ifdef FLASHLAB_HAVE_CUDA
#include "cuda/device.hpp"
#include "cuda/ring.hpp"
#include "cuda/ring_nccl.hpp"
#endif

namespace flashlab {

void check_ring_block_kernel(const std::string& blocks) {
  for (const char* name : kRingBlockKernels)
    if (blocks == name) return;
  throw InputError("the ring's blocks run on " + std::string(kRingBlockKernels[0]) + " or " + kRingBlockKernels[1] +
                   ", not " + blocks);
}

#ifdef FLASHLAB_HAVE_CUDA

namespace {
RingBlockKernel block_kernel(const std::string& name) {
  check_ring_block_kernel(name);
  return name == to_string(RingBlockKernel::Fa2) ? RingBlockKernel::Fa2 : RingBlockKernel::Fa3Ws;
}
}  // namespace

BenchResult bench_ring_on_one_gpu(RingLayout layout, int ranks, const Problem& p, DType dtype,
                                  const BenchSettings& settings, const std::string& blocks) {
  const RingBlockKernel kernel = block_kernel(blocks);
  check_supported(find_variant(blocks), p, dtype, settings.backward);  // the GPU, the dtype, the head dim
  const RingSchedule ring = ring_schedule(layout, ranks, p.shape.seq_q, p.shape.seq_k, p.options.causal);
  return cuda_ring_bench(ring, p, dtype, settings, kernel);
}

void check_nccl_ring(RingLayout layout, int ranks, const Problem& p, DType dtype, bool backward,
                     const std::string& blocks) {
  const RingBlockKernel kernel = block_kernel(blocks);
  if (!nccl_available())
    throw InputError("this flashlab was built without NCCL (nccl.h and libnccl from the CUDA toolkit), so it has no "
                     "multi-GPU ring; `flashlab bench --ring P` runs the ring on one GPU");
  const int gpus = cuda_device_count();
  if (gpus < ranks)
    throw InputError("a ring of " + std::to_string(ranks) + " ranks over NCCL needs " + std::to_string(ranks) +
                     " GPUs, one process per GPU, and this machine has " + std::to_string(gpus) +
                     "; on one GPU, `flashlab bench --ring " + std::to_string(ranks) +
                     "` runs the ring with its ranks as streams");
  for (int g = 0; g < ranks; ++g) {
    const cuda::CurrentDevice on(g);
    check_supported(find_variant(blocks), p, dtype, backward);
  }
  const RingSchedule ring = ring_schedule(layout, ranks, p.shape.seq_q, p.shape.seq_k, p.options.causal);
  const cuda::CurrentDevice on(0);
  check_gpu_ring_problem(ring, p, dtype, backward, kernel);
  for (int step = 0; step < ranks; ++step)
    for (int r = 0; r < ranks; ++r)
      for (const BlockPair& pair : ring.steps[step][r].pairs) block_launch(pair);
}

std::string new_nccl_ring_id() { return nccl_ring_id().to_hex(); }

RingRankReport run_ring_rank(const RingRankRequest& q) {
  const Problem& p = q.problem;
  if (q.check && q.timeline)
    throw InputError("a ring timeline records timed runs, and a check times nothing: ask for one of them");
  const RingSchedule ring = ring_schedule(q.layout, q.ranks, p.shape.seq_q, p.shape.seq_k, p.options.causal);
  const cuda::CurrentDevice on(q.device >= 0 ? q.device : q.rank);
  check_supported(find_variant(q.blocks), p, q.dtype, q.backward);
  RingRankReport report;
  NcclRankPlan plan{.kernel = block_kernel(q.blocks), .backward = q.backward, .warmup = q.warmup, .iters = q.iters,
                    .timeline = q.timeline};
  if (!q.check) {
    const NcclRankOutcome o = nccl_ring_rank(ring, q.rank, NcclRingId::from_hex(q.nccl_id), p, q.dtype, plan);
    report.forward_ms = o.forward_ms;
    report.backward_ms = o.backward_ms;
    const auto timeline = [&](Pass pass, const NcclPassStamps& s) {
      const RingTimelineRun run{.pass = pass, .shape = p.shape, .dtype = q.dtype, .block_kernel = q.blocks,
                                .device = cuda_device_name(), .warmup = q.warmup, .iters = q.iters};
      return ring_timeline(ring, run, s.layout, s.stamps);
    };
    if (o.forward_stamps) report.forward_timeline = timeline(Pass::Forward, *o.forward_stamps);
    if (o.backward_stamps) report.backward_timeline = timeline(Pass::Backward, *o.backward_stamps);
    if (q.rank == 0 && q.one_shot) {
      try {
        report.one_shot = find_variant(q.blocks).bench(
            p, q.dtype, BenchSettings{.warmup = q.warmup, .iters = q.iters, .backward = q.backward});
      } catch (const InputError& e) {
        report.one_shot_skipped = e.what();
      }
    }
    return report;
  }
  const CheckInputs inputs = check_inputs(p, q.dtype, q.backward);
  plan.inputs = &inputs.in;
  plan.d_o = &inputs.d_o;
  const NcclRankOutcome o = nccl_ring_rank(ring, q.rank, NcclRingId::from_hex(q.nccl_id), p, q.dtype, plan);
  if (q.rank == 0)
    report.check = check_computed("ring " + std::string(to_string(q.layout)) + " x" + std::to_string(q.ranks) + " " +
                                      q.blocks + " (NCCL)",
                                  Device::Cuda, p, q.dtype, o.forward, q.backward ? &o.grads : nullptr);
  return report;
}

#else

namespace {
[[noreturn]] void no_cuda() {
  throw InputError("this flashlab was built without CUDA, so it has no GPU ring");
}
}  // namespace

BenchResult bench_ring_on_one_gpu(RingLayout, int, const Problem&, DType, const BenchSettings&, const std::string&) {
  no_cuda();
}
void check_nccl_ring(RingLayout, int, const Problem&, DType, bool, const std::string&) { no_cuda(); }
std::string new_nccl_ring_id() { no_cuda(); }
RingRankReport run_ring_rank(const RingRankRequest&) { no_cuda(); }

#endif

}  // namespace flashlab
