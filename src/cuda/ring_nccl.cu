// Ring attention over NCCL (ring_nccl.hpp): one rank per process and GPU. The rank's work at a step is
// ring_rank.cuh's, as on one GPU; this file is the transport. One communication stream carries every NCCL call
// of the rank, in the same order on every rank (which NCCL needs of calls on one communicator):
//   step s:  K/V hop for step s + 1      send slot s % 2 to rank + 1, receive slot (s + 1) % 2 from rank - 1,
//                                        once this rank is done with step s - 1 (the slot it overwrites)
//            (backward) partials hop     send this step's dK/dV sum to rank + 1, receive the partials of the share
//                                        it will hold next from rank - 1, once this rank has finished step s
// and the compute stream waits on events of that stream: step s for its K/V, the add of step s for the partials,
// and step s + 2 for the slot's last sum to have left. So each transfer overlaps the next step's compute.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <type_traits>
#include <vector>

#include "cuda/fa3_ws/host_checks.hpp"
#include "cuda/host_passes.cuh"
#include "cuda/ring.hpp"
#include "cuda/ring_nccl.hpp"
#include "cuda/ring_rank.cuh"

#ifdef FLASHLAB_HAVE_NCCL
#include <nccl.h>
#endif

namespace flashlab {

std::string NcclRingId::to_hex() const {
  std::string hex;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

NcclRingId NcclRingId::from_hex(const std::string& hex) {
  NcclRingId id;
  const auto digit = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw InputError("the ring's NCCL id must be 256 lowercase hex digits, as `flashlab ring` hands it to its ranks");
  };
  if (hex.size() != 2 * id.bytes.size())
    throw InputError("the ring's NCCL id must be 256 lowercase hex digits, as `flashlab ring` hands it to its ranks");
  for (std::size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<unsigned char>(digit(hex[2 * i]) * 16 + digit(hex[2 * i + 1]));
  return id;
}

#ifndef FLASHLAB_HAVE_NCCL

bool nccl_available() { return false; }
NcclRingId nccl_ring_id() { throw InputError("this flashlab was built without NCCL, so it has no multi-GPU ring"); }
NcclRankOutcome nccl_ring_rank(const RingSchedule&, int, const NcclRingId&, const Problem&, DType, const NcclRankPlan&) {
  throw InputError("this flashlab was built without NCCL, so it has no multi-GPU ring");
}

#else

namespace {

using cuda::ring::BackwardRank;
using cuda::ring::Events;
using cuda::ring::ForwardRank;
using cuda::ring::LaunchPlans;

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("the ring's ") + what + " failed: " + ncclGetErrorString(r));
}
#define NCCL_CHECK(call) check_nccl((call), #call)

static_assert(sizeof(ncclUniqueId) == sizeof(NcclRingId::bytes), "NcclRingId holds an ncclUniqueId");

template <class T>
ncclDataType_t nccl_type() {
  return std::is_same_v<T, __half> ? ncclFloat16 : ncclBfloat16;
}

// This rank of the ring: its communicator, its two streams, its buffers for each pass.
template <class T>
class Rank {
 public:
  Rank(const RingSchedule& ring, int rank, const NcclRingId& id, const Problem& p, DType dtype, RingBlockKernel kernel,
       bool backward)
      : ring_(ring), rank_(rank), p_(p), dtype_(dtype), base_(kernel, p), plans_(cuda::ring::launch_plans(ring)),
        next_((rank + 1) % ring.ranks), prev_((rank - 1 + ring.ranks) % ring.ranks), fwd_(ring, rank, p.shape, kernel) {
    if (backward) bwd_.emplace(ring, rank, p.shape, kernel);
    ncclUniqueId nid;
    std::copy(id.bytes.begin(), id.bytes.end(), reinterpret_cast<unsigned char*>(&nid));
    NCCL_CHECK(ncclCommInitRank(&comm_, ring.ranks, nid, rank));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  }
  ~Rank() {
    cudaStreamDestroy(compute_);
    cudaStreamDestroy(comm_stream_);
    ncclCommDestroy(comm_);
  }
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  // A pass on the global tensors of `io` (its tokens packed in, its outputs written back), or, with none, on the
  // rank's buffers as they are (timed runs: fill_random first).
  void forward(const DeviceForwardIo* io) {
    const int P = ring_.ranks;
    Events arrived(P), computed(P);  // arrived[s]: the share of step s is in slot s % 2
    if (io != nullptr) fwd_.pack(ring_, rank_, p_.shape, *io, compute_);
    else fwd_.reset(compute_);
    CUDA_CHECK(cudaEventRecord(arrived.at[0], compute_));
    for (int step = 0; step < P; ++step) {
      if (ring_.kv_travels_on(step)) kv_hop(step, fwd_, arrived, computed);
      CUDA_CHECK(cudaStreamWaitEvent(compute_, arrived.at[step]));
      fwd_.step(ring_.steps[step][rank_], plans_[step][rank_], step % 2, base_, p_.shape, dtype_, compute_);
      CUDA_CHECK(cudaEventRecord(computed.at[step], compute_));
    }
    if (io != nullptr) fwd_.unpack(ring_, rank_, p_.shape, *io, compute_);
    finish();
  }

  void backward(const DeviceBackwardIo* io) {
    BackwardRank<T>& b = *bwd_;
    const int P = ring_.ranks;
    const std::int64_t kv_row = cuda::ring::RowElems(p_.shape).kv;
    const auto share_elems = [&](int step, int r) {
      return std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][r].kv_origin) * kv_row;
    };
    Events arrived(P), computed(P), grads_in(P + 1);  // grads_in[s]: the partials for step s are in dk_in / dv_in
    if (io != nullptr) b.pack(ring_, rank_, p_.shape, *io, compute_);
    else b.reset(compute_);
    CUDA_CHECK(cudaEventRecord(arrived.at[0], compute_));
    for (int step = 0; step < P; ++step) {
      if (ring_.kv_travels_on(step)) kv_hop(step, b, arrived, computed);
      const int slot = step % 2;
      CUDA_CHECK(cudaStreamWaitEvent(compute_, arrived.at[step]));
      if (step >= 2) CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[step - 1]));  // the slot's last sum has left
      b.step(ring_.steps[step][rank_], plans_[step][rank_], slot, base_, p_.shape, dtype_, compute_);
      if (step > 0) {
        CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[step]));
        b.add_arrived(slot, std::int64_t(share_elems(step, rank_)), compute_);
      }
      CUDA_CHECK(cudaEventRecord(computed.at[step], compute_));
      // The partials hop (after the last step, home).
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, computed.at[step]));
      const std::size_t out = share_elems(step, rank_), in = share_elems(step, prev_);
      NCCL_CHECK(ncclGroupStart());
      NCCL_CHECK(ncclSend(b.dk[slot].data(), out, ncclFloat32, next_, comm_, comm_stream_));
      NCCL_CHECK(ncclSend(b.dv[slot].data(), out, ncclFloat32, next_, comm_, comm_stream_));
      NCCL_CHECK(ncclRecv(b.dk_in.data(), in, ncclFloat32, prev_, comm_, comm_stream_));
      NCCL_CHECK(ncclRecv(b.dv_in.data(), in, ncclFloat32, prev_, comm_, comm_stream_));
      NCCL_CHECK(ncclGroupEnd());
      CUDA_CHECK(cudaEventRecord(grads_in.at[step + 1], comm_stream_));
    }
    CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[P]));
    if (io != nullptr) b.unpack(ring_, rank_, p_.shape, *io, compute_);
    finish();
  }

  // In place over the ranks: the sum (outputs) or the max (times).
  void all_reduce(void* data, std::size_t count, ncclDataType_t type, ncclRedOp_t op) {
    NCCL_CHECK(ncclAllReduce(data, data, count, type, op, comm_, comm_stream_));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
  }
  double max_over_ranks(double x) {
    cuda::DeviceBuffer<double> v(1);
    CUDA_CHECK(cudaMemcpy(v.data(), &x, sizeof x, cudaMemcpyHostToDevice));
    all_reduce(v.data(), 1, ncclFloat64, ncclMax);
    CUDA_CHECK(cudaMemcpy(&x, v.data(), sizeof x, cudaMemcpyDeviceToHost));
    return x;
  }
  void barrier() { max_over_ranks(0); }

  // Timed runs: the rank's own random shares, and for the backward its forward's O and L (after a forward).
  void fill_random() {
    fwd_.fill_random(rank_);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void take_forward() {
    bwd_->take_forward(fwd_, rank_);
    CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:

  // The K/V share of step `step` to rank + 1, and the one of step + 1 from rank - 1 into the other slot.
  template <class R>
  void kv_hop(int step, R& r, Events& arrived, Events& computed) {
    const std::size_t kv_row = std::size_t(cuda::ring::RowElems(p_.shape).kv);
    const std::size_t out = std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][rank_].kv_origin) * kv_row;
    const std::size_t in = std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][prev_].kv_origin) * kv_row;
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, step == 0 ? arrived.at[0] : computed.at[step - 1]));
    const int from = step % 2, to = (step + 1) % 2;
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(r.k[from].data(), out, nccl_type<T>(), next_, comm_, comm_stream_));
    NCCL_CHECK(ncclSend(r.v[from].data(), out, nccl_type<T>(), next_, comm_, comm_stream_));
    NCCL_CHECK(ncclRecv(r.k[to].data(), in, nccl_type<T>(), prev_, comm_, comm_stream_));
    NCCL_CHECK(ncclRecv(r.v[to].data(), in, nccl_type<T>(), prev_, comm_, comm_stream_));
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaEventRecord(arrived.at[step + 1], comm_stream_));
  }

  void finish() {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
  }

  const RingSchedule& ring_;
  int rank_;
  Problem p_;
  DType dtype_;
  cuda::ring::BlockKernel base_;
  LaunchPlans plans_;
  int next_, prev_;
  ForwardRank<T> fwd_;
  std::optional<BackwardRank<T>> bwd_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t compute_ = nullptr, comm_stream_ = nullptr;
};

// Median of a pass's slowest rank over `iters` timed runs after `warmup` untimed ones (every run after a barrier).
template <class Pass, class T>
double median_slowest_ms(Rank<T>& rank, int warmup, int iters, Pass pass) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    rank.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double own = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double slowest = rank.max_over_ranks(own);
    if (i >= warmup) ms.push_back(slowest);
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

template <class T>
NcclRankOutcome run_rank(const RingSchedule& ring, int rank, const NcclRingId& id, const Problem& p, DType dtype,
                         const NcclRankPlan& plan) {
  const Shape& s = p.shape;
  NcclRankOutcome outcome;
  Rank<T> me(ring, rank, id, p, dtype, plan.kernel, plan.backward);
  if (plan.inputs == nullptr) {
    // Timed runs need no global tensors: each rank makes its own shares in place, so N is bounded by what one
    // rank keeps (its tokens and two shares in flight), not by the whole problem.
    me.fill_random();
    outcome.forward_ms = median_slowest_ms(me, plan.warmup, plan.iters, [&] { me.forward(nullptr); });
    if (plan.backward) {
      me.take_forward();
      outcome.backward_ms = median_slowest_ms(me, plan.warmup, plan.iters, [&] { me.backward(nullptr); });
    }
    return outcome;
  }
  // A run to check: the given inputs, and zeroed outputs: each rank writes its tokens, and the sum over ranks
  // gathers them.
  auto t = cuda::DeviceAttention<T>::random(s, plan.backward);
  t.q = cuda::upload<T>(plan.inputs->q);
  t.k = cuda::upload<T>(plan.inputs->k);
  t.v = cuda::upload<T>(plan.inputs->v);
  if (plan.backward) t.dO = cuda::upload<T>(*plan.d_o);
  cuda::zero(t.o);
  cuda::zero(t.lse);
  if (plan.backward)
    for (auto* buf : {&t.dq, &t.dk, &t.dv}) cuda::zero(*buf);
  CUDA_CHECK(cudaDeviceSynchronize());  // made on the legacy stream; the rank's streams do not wait for it
  const DeviceForwardIo fio = t.forward_io();
  me.forward(&fio);
  me.all_reduce(t.o.data(), t.o.size(), nccl_type<T>(), ncclSum);
  me.all_reduce(t.lse.data(), t.lse.size(), ncclFloat32, ncclSum);
  if (plan.backward) {
    const DeviceBackwardIo bio = t.backward_io();
    me.backward(&bio);
    for (auto* buf : {&t.dq, &t.dk, &t.dv}) me.all_reduce(buf->data(), buf->size(), nccl_type<T>(), ncclSum);
  }
  if (rank == 0) {
    outcome.forward = t.download_forward(s);
    if (plan.backward) outcome.grads = t.download_grads(s);
  }
  return outcome;
}

}  // namespace

bool nccl_available() { return true; }

NcclRingId nccl_ring_id() {
  ncclUniqueId nid;
  NCCL_CHECK(ncclGetUniqueId(&nid));
  NcclRingId id;
  std::copy_n(reinterpret_cast<const unsigned char*>(&nid), id.bytes.size(), id.bytes.begin());
  return id;
}

NcclRankOutcome nccl_ring_rank(const RingSchedule& ring, int rank, const NcclRingId& id, const Problem& p, DType dtype,
                               const NcclRankPlan& plan) {
  check_gpu_ring_problem(ring, p, dtype, plan.backward, plan.kernel);  // (ring.hpp)
  if (rank < 0 || rank >= ring.ranks)
    throw InputError("rank " + std::to_string(rank) + " is not one of the ring's " + std::to_string(ring.ranks));
  if (plan.inputs != nullptr && plan.backward && plan.d_o == nullptr)
    throw std::logic_error("nccl_ring_rank: a backward on given inputs needs dO");
  if (dtype == DType::BF16) return run_rank<__nv_bfloat16>(ring, rank, id, p, dtype, plan);
  return run_rank<__half>(ring, rank, id, p, dtype, plan);
}

#endif  // FLASHLAB_HAVE_NCCL

}  // namespace flashlab
