// Ring attention on one GPU (ring.hpp): the P ranks of model/ring.hpp's schedule as P CUDA streams. What a
// multi-GPU ring does is all here, only the link is a device-to-device copy; what each rank keeps and computes at
// a step is ring_rank.cuh's (each block one launch of cuda-fa3-ws or cuda-fa2), this file is the transport.
//  * Forward: at step s rank r computes its queries against the share in hand (slot s % 2; ForwardRank::step),
//    while the link stream into rank r + 1 copies that share into r + 1's other slot, so the copy overlaps the
//    compute, as NCCL's send / recv would.
//  * Backward: the K/V shares travel the same way, and each carries its dK/dV partial sums (fp32). At step s
//    rank r computes its pairs' dK/dV into a fresh partial (BackwardRank::step) while the partial of the ranks
//    before arrives from r - 1 on the gradient link; then it adds the two, and that sum leaves for r + 1 while r
//    computes step s + 1. After the last step one more hop brings each share's complete partials home.
// Events order it, the way a multi-GPU ring's messages would: rank r's K/V copy for step s + 1 waits until the
// share has arrived at r - 1 (the copy of step s) and until r is done with the slot it overwrites (its compute
// of step s - 1, and the copy out of that slot into r + 1); a partial's copy waits until the sender has added it
// up and the receiver has added the previous one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "cuda/constraints.hpp"
#include "cuda/device.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/ring.hpp"
#include "cuda/ring_rank.cuh"

namespace flashlab {
namespace {

using cuda::ring::BackwardRank;
using cuda::ring::Events;
using cuda::ring::ForwardRank;
using cuda::ring::LaunchPlans;

// One stream set a rank: compute[r] runs rank r's kernels; link[r] carries the K/V copies into rank r, grad_link[r]
// the dK/dV partials into rank r.
struct Streams {
  std::vector<cudaStream_t> compute, link, grad_link;
  explicit Streams(int ranks) : compute(ranks), link(ranks), grad_link(ranks) {
    for (auto* set : {&compute, &link, &grad_link})
      for (cudaStream_t& s : *set) CUDA_CHECK(cudaStreamCreate(&s));  // blocking: ordered with the legacy default stream
  }
  ~Streams() {
    for (auto* set : {&compute, &link, &grad_link})
      for (cudaStream_t s : *set) cudaStreamDestroy(s);
  }
  void synchronize() const {
    for (auto* set : {&compute, &link, &grad_link})
      for (cudaStream_t s : *set) CUDA_CHECK(cudaStreamSynchronize(s));
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
};

// Events [rank][step] (ring_rank.cuh's Events, laid out rank by rank).
struct EventGrid {
  Events flat;
  int steps;
  EventGrid(int ranks, int steps) : flat(ranks * steps), steps(steps) {}
  cudaEvent_t at(int rank, int step) const { return flat.at[std::size_t(rank) * steps + step]; }
};

// What a pass's ring on one GPU holds, made once and run any number of times: the P ranks' buffers (Rank:
// ring_rank.cuh's ForwardRank or BackwardRank), their streams, and the events arrived[r][s] (the share of step s
// is in rank r's slot s % 2) and computed[r][s] (r is done with step s).
template <class Rank>
class OneGpuRing {
 protected:
  OneGpuRing(const RingSchedule& ring, const Problem& p, DType dtype, RingBlockKernel kernel)
      : ring_(ring), p_(p), dtype_(dtype), base_(kernel, p), plans_(cuda::ring::launch_plans(ring)), streams_(ring.ranks),
        arrived_(ring.ranks, ring.ranks), computed_(ring.ranks, ring.ranks) {
    for (int r = 0; r < ring.ranks; ++r) ranks_.emplace_back(ring, r, p.shape, kernel);
  }

  // Every rank packs its tokens and its own share (into slot 0).
  template <class Io>
  void pack(const Io& io) {
    for (int r = 0; r < ring_.ranks; ++r) {
      ranks_[r].pack(ring_, r, p_.shape, io, streams_.compute[r]);
      CUDA_CHECK(cudaEventRecord(arrived_.at(r, 0), streams_.compute[r]));
    }
  }

  // The K/V hop of step `step` (every share one rank on, into the receiver's slot (step + 1) % 2), when the share
  // travels on.
  void send_kv_on(int step, std::size_t kv_row_bytes) {
    if (!ring_.kv_travels_on(step)) return;
    const int P = ring_.ranks;
    for (int r = 0; r < P; ++r) {
      const int from = (r - 1 + P) % P, to_slot = (step + 1) % 2;
      cudaStream_t link = streams_.link[r];
      CUDA_CHECK(cudaStreamWaitEvent(link, arrived_.at(from, step)));
      if (step > 0) {
        CUDA_CHECK(cudaStreamWaitEvent(link, computed_.at(r, step - 1)));       // r is done reading the slot
        CUDA_CHECK(cudaStreamWaitEvent(link, arrived_.at((r + 1) % P, step)));  // and r + 1 has its copy of it
      }
      const std::size_t bytes =
          std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][from].kv_origin) * kv_row_bytes;
      CUDA_CHECK(cudaMemcpyAsync(ranks_[r].k[to_slot].data(), ranks_[from].k[step % 2].data(), bytes,
                                 cudaMemcpyDeviceToDevice, link));
      CUDA_CHECK(cudaMemcpyAsync(ranks_[r].v[to_slot].data(), ranks_[from].v[step % 2].data(), bytes,
                                 cudaMemcpyDeviceToDevice, link));
      CUDA_CHECK(cudaEventRecord(arrived_.at(r, step + 1), link));
    }
  }

  // Rank r's blocks of step `step`, once its share has arrived.
  void compute(int r, int step) {
    cudaStream_t st = streams_.compute[r];
    CUDA_CHECK(cudaStreamWaitEvent(st, arrived_.at(r, step)));
    ranks_[r].step(ring_.steps[step][r], plans_[step][r], step % 2, base_, p_.shape, dtype_, st);
  }

  const RingSchedule& ring_;
  Problem p_;
  DType dtype_;
  cuda::ring::BlockKernel base_;
  LaunchPlans plans_;  // before the ranks: a refusal comes before any allocation
  std::vector<Rank> ranks_;
  Streams streams_;
  EventGrid arrived_, computed_;
};

template <class T>
class ForwardRing : OneGpuRing<ForwardRank<T>> {
 public:
  ForwardRing(const RingSchedule& ring, const Problem& p, DType dtype, RingBlockKernel kernel)
      : OneGpuRing<ForwardRank<T>>(ring, p, dtype, kernel) {}

  void run(const DeviceForwardIo& io) {
    const Shape& s = this->p_.shape;
    const int P = this->ring_.ranks;
    this->pack(io);
    for (int step = 0; step < P; ++step) {
      this->send_kv_on(step, cuda::ring::RowElems(s).kv * sizeof(T));
      for (int r = 0; r < P; ++r) {
        this->compute(r, step);
        CUDA_CHECK(cudaEventRecord(this->computed_.at(r, step), this->streams_.compute[r]));
      }
    }
    for (int r = 0; r < P; ++r) this->ranks_[r].unpack(this->ring_, r, s, io, this->streams_.compute[r]);
    this->streams_.synchronize();
  }
};

template <class T>
class BackwardRing : OneGpuRing<BackwardRank<T>> {
 public:
  BackwardRing(const RingSchedule& ring, const Problem& p, DType dtype, RingBlockKernel kernel)
      : OneGpuRing<BackwardRank<T>>(ring, p, dtype, kernel), grads_in_(ring.ranks, ring.ranks + 1) {}

  void run(const DeviceBackwardIo& io) {
    const Shape& s = this->p_.shape;
    const RingSchedule& ring = this->ring_;
    auto& ranks = this->ranks_;
    auto& streams = this->streams_;
    const int P = ring.ranks;
    const cuda::ring::RowElems row(s);
    const auto share_elems = [&](int step, int r) {
      return std::int64_t(s.batch) * ring.kv_tokens(ring.steps[step][r].kv_origin) * row.kv;
    };
    this->pack(io);
    for (int step = 0; step < P; ++step) {
      this->send_kv_on(step, row.kv * sizeof(T));
      for (int r = 0; r < P; ++r) {
        cudaStream_t st = streams.compute[r];
        if (step >= 2) CUDA_CHECK(cudaStreamWaitEvent(st, grads_in_.at((r + 1) % P, step - 1)));  // the slot's last sum left
        this->compute(r, step);
        if (step > 0) {
          CUDA_CHECK(cudaStreamWaitEvent(st, grads_in_.at(r, step)));
          ranks[r].add_arrived(step % 2, share_elems(step, r), st);
        }
        CUDA_CHECK(cudaEventRecord(this->computed_.at(r, step), st));
      }
      // The partials leave: r's sum of this step into r + 1's dk_in / dv_in, once r + 1 has added its previous ones.
      for (int r = 0; r < P; ++r) {
        const int to = (r + 1) % P;
        cudaStream_t link = streams.grad_link[to];
        CUDA_CHECK(cudaStreamWaitEvent(link, this->computed_.at(r, step)));
        CUDA_CHECK(cudaStreamWaitEvent(link, this->computed_.at(to, step)));
        const std::size_t bytes = share_elems(step, r) * sizeof(float);
        CUDA_CHECK(cudaMemcpyAsync(ranks[to].dk_in.data(), ranks[r].dk[step % 2].data(), bytes, cudaMemcpyDeviceToDevice, link));
        CUDA_CHECK(cudaMemcpyAsync(ranks[to].dv_in.data(), ranks[r].dv[step % 2].data(), bytes, cudaMemcpyDeviceToDevice, link));
        CUDA_CHECK(cudaEventRecord(grads_in_.at(to, step + 1), link));
      }
    }
    for (int r = 0; r < P; ++r) {
      CUDA_CHECK(cudaStreamWaitEvent(streams.compute[r], grads_in_.at(r, P)));
      ranks[r].unpack(ring, r, s, io, streams.compute[r]);
    }
    streams.synchronize();
  }

 private:
  // grads_in[r][s]: the partials of the share r holds at step s, summed over steps < s, are in r's dk_in / dv_in
  // (s = P: its own share's complete ones, home).
  EventGrid grads_in_;
};

// f.template operator()<T>() with T the element type of an f16 or bf16 dtype (the only ones the ring takes).
template <class F>
decltype(auto) with_16bit_type(DType dtype, F&& f) {
  if (dtype == DType::BF16) return f.template operator()<__nv_bfloat16>();
  return f.template operator()<__half>();
}

}  // namespace

const char* to_string(RingBlockKernel k) { return k == RingBlockKernel::Fa2 ? "cuda-fa2" : "cuda-fa3-ws"; }

void check_gpu_ring_problem(const RingSchedule& ring, const Problem& p, DType dtype, bool backward,
                            RingBlockKernel kernel) {
  if (ring.seq_q != p.shape.seq_q || ring.seq_k != p.shape.seq_k || ring.causal != p.options.causal)
    throw InputError("the ring's schedule was made for seq_q = " + std::to_string(ring.seq_q) + ", seq_k = " +
                     std::to_string(ring.seq_k) + ", causal " + to_string(ring.causal) + ", not for this problem's " +
                     std::to_string(p.shape.seq_q) + ", " + std::to_string(p.shape.seq_k) + ", " +
                     to_string(p.options.causal));
  if (p.options.dropout_p > 0)
    throw InputError("the GPU ring has no dropout: each rank would need the global token indices in its mask");
  const std::string blocks = std::string("the GPU ring's blocks are ") + to_string(kernel) + "'s";
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw InputError(blocks + ", which take f16 or bf16, not " + to_string(dtype));
  const auto check_dims = [&](const auto& dims, const char* what) {
    if (std::find(std::begin(dims), std::end(dims), p.shape.head_dim) != std::end(dims)) return;
    std::string supported;
    for (int d : dims) supported += (supported.empty() ? "" : ", ") + std::to_string(d);
    throw InputError(blocks + ", whose " + what + " supports head dims " + supported + ", not " +
                     std::to_string(p.shape.head_dim));
  };
  if (kernel == RingBlockKernel::Fa2) {
    check_dims(cuda::fa2::kHeadDims, "forward");  // its backward has the same ones
    return;
  }
  check_dims(cuda::fa3_ws::kHeadDims, "forward");
  if (backward) check_dims(cuda::fa3_ws::kBackwardHeadDims, "backward");
  // The GPU, before any work rather than at the first block (whose launcher only asserts it).
  if (const int cc = cuda::device_compute_capability(); cc != cuda::fa3_ws::kComputeCapability)
    throw InputError(blocks + ", which need a Hopper GPU (compute capability 9.0); this GPU is " + cuda::device_name() +
                     " (compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) + ")");
}

void cuda_ring_forward_on_device(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceForwardIo& io,
                                 RingBlockKernel kernel) {
  check_gpu_ring_problem(ring, p, dtype, /*backward=*/false, kernel);
  if (p.shape.batch == 0 || p.shape.heads_q == 0) return;
  with_16bit_type(dtype, [&]<class T>() { ForwardRing<T>(ring, p, dtype, kernel).run(io); });
}

void cuda_ring_backward_on_device(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceBackwardIo& io,
                                  RingBlockKernel kernel) {
  check_gpu_ring_problem(ring, p, dtype, /*backward=*/true, kernel);
  if (p.shape.batch == 0 || p.shape.heads_q == 0) return;
  with_16bit_type(dtype, [&]<class T>() { BackwardRing<T>(ring, p, dtype, kernel).run(io); });
}

ForwardOut cuda_ring_forward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in,
                             RingBlockKernel kernel) {
  const auto run = [&ring, kernel](const Problem& problem, DType t, const DeviceForwardIo& io) {
    cuda_ring_forward_on_device(ring, problem, t, io, kernel);
  };
  return cuda::forward_from_host(run, p, dtype, in);
}

BenchResult cuda_ring_bench(const RingSchedule& ring, const Problem& p, DType dtype, const BenchSettings& settings,
                            RingBlockKernel kernel) {
  check_gpu_ring_problem(ring, p, dtype, settings.backward, kernel);
  return with_16bit_type(dtype, [&]<class T>() {
    const cuda::PeakScope scope;
    auto t = cuda::DeviceAttention<T>::random(p.shape, settings.backward);
    ForwardRing<T> forward(ring, p, dtype, kernel);
    std::optional<BackwardRing<T>> backward;
    if (settings.backward) backward.emplace(ring, p, dtype, kernel);
    return cuda::bench_passes(
        settings, scope, t, [&] { forward.run(t.forward_io()); },
        [&] {
          if (backward) backward->run(t.backward_io());
        });
  });
}

Grads cuda_ring_backward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd,
                         const HostTensor& dO, RingBlockKernel kernel) {
  const auto run = [&ring, kernel](const Problem& problem, DType t, const DeviceBackwardIo& io) {
    cuda_ring_backward_on_device(ring, problem, t, io, kernel);
  };
  return cuda::backward_from_host(run, cuda::BackwardReads::o_and_lse, p, dtype, in, fwd, dO);
}

}  // namespace flashlab
