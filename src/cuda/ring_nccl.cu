// Ring attention over NCCL (ring_nccl.hpp): one rank per process and GPU. The rank's work at a step is
// ring_rank.cuh's, as on one GPU; this file is the transport. One communication stream carries every NCCL call
// of the rank, in the same order on every rank (which NCCL needs of calls on one communicator):
//   step s:  K/V hop for step s + 1      send slot s % 2 to rank + 1, receive slot (s + 1) % 2 from rank - 1,
//                                        once this rank is done with step s - 1 (the slot it overwrites)
//            (backward) partials hop     send this step's dK/dV sum to rank + 1, receive the partials of the share
//                                        it will hold next from rank - 1, once this rank has finished step s
// and the compute stream waits on events of that stream: step s for its K/V, the add of step s for the partials,
// and step s + 2 for the slot's last sum to have left. So each transfer overlaps the next step's compute.
//
// With NcclRankPlan::timeline, the last timed run of each pass also records timing events around each span
// (SpanEvents), counted from an event recorded as the barrier before the run completes, and the ranks' stamps
// are all-gathered after the pass's runs (model/ring_timeline.hpp turns them into a timeline).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <type_traits>
#include <vector>

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
using cuda::ring::PairMark;
using cuda::ring::PairMarker;

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("the ring's ") + what + " failed: " + ncclGetErrorString(r));
}
#define NCCL_CHECK(call) check_nccl((call), #call)

static_assert(sizeof(ncclUniqueId) == sizeof(NcclRingId::bytes), "NcclRingId holds an ncclUniqueId");

template <class T>
ncclDataType_t nccl_type() {
  return std::is_same_v<T, __half> ? ncclFloat16 : ncclBfloat16;
}

// The spans of one pass on this rank as timing CUDA events, made once and recorded again in each run that
// records (its events are recorded on the rank's streams, so the run itself never waits on the host). Each span
// is a begin and an end event, placed on its stream after whatever that stream waits on, so a span never counts
// the wait for another stream or rank; a gap before it does. What each span covers:
//   compute       (forward) one pair's block kernel launch(es); (backward) the step's block backward, the zeroing
//                 of the slot's partials included
//   merge         (forward) the pair's merge_block_kernel, the LSE merge of its (O_b, L_b) into (O, L), launched
//                 right after the block kernel on the compute stream; (backward) adding the partials that arrived
//                 from the rank before into the slot's
//   K/V hop       the grouped NCCL send/recv of K and V (one NCCL kernel): from when this rank may overwrite the
//                 slot to when both directions are done, waiting for the peers included
//   partials hop  the same for the step's fp32 dK/dV partials
class SpanEvents {
 public:
  explicit SpanEvents(const RingStampLayout& layout)
      : layout_(layout), begin_(layout.spans_per_rank()), end_(layout.spans_per_rank()),
        recorded_(layout.spans_per_rank(), false) {
    try {
      CUDA_CHECK(cudaEventCreate(&reference_));
      for (std::size_t k = 0; k < begin_.size(); ++k) {
        CUDA_CHECK(cudaEventCreate(&begin_[k]));
        CUDA_CHECK(cudaEventCreate(&end_[k]));
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~SpanEvents() { destroy(); }
  SpanEvents(const SpanEvents&) = delete;
  SpanEvents& operator=(const SpanEvents&) = delete;

  const RingStampLayout& layout() const { return layout_; }
  // The zero of the stamps: recorded by the barrier before the run (Rank::barrier).
  cudaEvent_t reference() const { return reference_; }
  // Before a run that records: no span recorded yet.
  void clear() { std::fill(recorded_.begin(), recorded_.end(), false); }
  void begin(std::size_t span, cudaStream_t st) { CUDA_CHECK(cudaEventRecord(begin_.at(span), st)); }
  void end(std::size_t span, cudaStream_t st) {
    CUDA_CHECK(cudaEventRecord(end_.at(span), st));
    recorded_[span] = true;
  }

  // Once the run has finished (both streams synchronized): each span's begin and end in ns after the reference,
  // kNoStamp for a span the run did not have (RingStampLayout's order).
  std::vector<std::int64_t> stamps() const {
    std::vector<std::int64_t> out(layout_.stamps_per_rank(), kNoStamp);
    const auto after_reference = [&](cudaEvent_t e) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, reference_, e));
      return std::llround(double(ms) * 1e6);
    };
    for (std::size_t k = 0; k < recorded_.size(); ++k) {
      if (!recorded_[k]) continue;
      out[2 * k] = after_reference(begin_[k]);
      out[2 * k + 1] = after_reference(end_[k]);
    }
    return out;
  }

 private:
  void destroy() {
    if (reference_ != nullptr) cudaEventDestroy(reference_);
    for (std::size_t k = 0; k < begin_.size(); ++k) {
      if (begin_[k] != nullptr) cudaEventDestroy(begin_[k]);
      if (end_[k] != nullptr) cudaEventDestroy(end_[k]);
    }
  }

  RingStampLayout layout_;
  cudaEvent_t reference_ = nullptr;
  std::vector<cudaEvent_t> begin_, end_;
  std::vector<bool> recorded_;
};

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
  // rank's buffers as they are (timed runs: fill_random first). With `spans`, its spans are recorded into them.
  void forward(const DeviceForwardIo* io, SpanEvents* spans = nullptr) {
    const int P = ring_.ranks;
    Events arrived(P), computed(P);  // arrived[s]: the share of step s is in slot s % 2
    if (io != nullptr) fwd_.pack(ring_, rank_, p_.shape, *io, compute_);
    else fwd_.reset(compute_);
    CUDA_CHECK(cudaEventRecord(arrived.at[0], compute_));
    for (int step = 0; step < P; ++step) {
      if (ring_.kv_travels_on(step)) kv_hop(step, fwd_, arrived, computed, spans);
      CUDA_CHECK(cudaStreamWaitEvent(compute_, arrived.at[step]));
      PairMarker mark;
      if (spans != nullptr)
        mark = [&, step](std::size_t pair, PairMark at) {
          const RingStampLayout& l = spans->layout();
          const int block = static_cast<int>(pair);
          if (at == PairMark::BlockBegin) spans->begin(l.compute(step, block), compute_);
          if (at == PairMark::BlockEnd) {
            spans->end(l.compute(step, block), compute_);
            spans->begin(l.merge(step, block), compute_);
          }
          if (at == PairMark::MergeEnd) spans->end(l.merge(step, block), compute_);
        };
      fwd_.step(ring_.steps[step][rank_], plans_[step][rank_], step % 2, base_, p_.shape, dtype_, compute_, mark);
      CUDA_CHECK(cudaEventRecord(computed.at[step], compute_));
    }
    if (io != nullptr) fwd_.unpack(ring_, rank_, p_.shape, *io, compute_);
    finish();
  }

  void backward(const DeviceBackwardIo* io, SpanEvents* spans = nullptr) {
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
      if (ring_.kv_travels_on(step)) kv_hop(step, b, arrived, computed, spans);
      const int slot = step % 2;
      CUDA_CHECK(cudaStreamWaitEvent(compute_, arrived.at[step]));
      if (step >= 2) CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[step - 1]));  // the slot's last sum has left
      if (spans != nullptr) spans->begin(spans->layout().compute(step, 0), compute_);
      b.step(ring_.steps[step][rank_], plans_[step][rank_], slot, base_, p_.shape, dtype_, compute_);
      if (spans != nullptr) spans->end(spans->layout().compute(step, 0), compute_);
      if (step > 0) {
        CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[step]));
        if (spans != nullptr) spans->begin(spans->layout().merge(step, 0), compute_);
        b.add_arrived(slot, std::int64_t(share_elems(step, rank_)), compute_);
        if (spans != nullptr) spans->end(spans->layout().merge(step, 0), compute_);
      }
      CUDA_CHECK(cudaEventRecord(computed.at[step], compute_));
      // The partials hop (after the last step, home).
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, computed.at[step]));
      if (spans != nullptr) spans->begin(spans->layout().partials_hop(step), comm_stream_);
      const std::size_t out = share_elems(step, rank_), in = share_elems(step, prev_);
      NCCL_CHECK(ncclGroupStart());
      NCCL_CHECK(ncclSend(b.dk[slot].data(), out, ncclFloat32, next_, comm_, comm_stream_));
      NCCL_CHECK(ncclSend(b.dv[slot].data(), out, ncclFloat32, next_, comm_, comm_stream_));
      NCCL_CHECK(ncclRecv(b.dk_in.data(), in, ncclFloat32, prev_, comm_, comm_stream_));
      NCCL_CHECK(ncclRecv(b.dv_in.data(), in, ncclFloat32, prev_, comm_, comm_stream_));
      NCCL_CHECK(ncclGroupEnd());
      if (spans != nullptr) spans->end(spans->layout().partials_hop(step), comm_stream_);
      CUDA_CHECK(cudaEventRecord(grads_in.at[step + 1], comm_stream_));
    }
    CUDA_CHECK(cudaStreamWaitEvent(compute_, grads_in.at[P]));
    if (io != nullptr) b.unpack(ring_, rank_, p_.shape, *io, compute_);
    finish();
  }

  // In place over the ranks: the sum (outputs) or the max (times). `done`, if given, is recorded on the
  // communication stream right after the all-reduce.
  void all_reduce(void* data, std::size_t count, ncclDataType_t type, ncclRedOp_t op, cudaEvent_t done = nullptr) {
    NCCL_CHECK(ncclAllReduce(data, data, count, type, op, comm_, comm_stream_));
    if (done != nullptr) CUDA_CHECK(cudaEventRecord(done, comm_stream_));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
  }
  double max_over_ranks(double x, cudaEvent_t done = nullptr) {
    cuda::DeviceBuffer<double> v(1);
    // On the stream of the all-reduce: a copy from pageable memory on the legacy stream may return before its
    // bytes land, and the communication stream does not wait for the legacy one.
    CUDA_CHECK(cudaMemcpyAsync(v.data(), &x, sizeof x, cudaMemcpyHostToDevice, comm_stream_));
    all_reduce(v.data(), 1, ncclFloat64, ncclMax, done);
    CUDA_CHECK(cudaMemcpy(&x, v.data(), sizeof x, cudaMemcpyDeviceToHost));
    return x;
  }
  // Every rank here; with `reference`, that event marks on this rank's clock the moment the ranks met (the
  // barrier's all-reduce completes on every rank within about P - 1 NCCL hops of the others).
  void barrier(cudaEvent_t reference = nullptr) { max_over_ranks(0, reference); }

  // Every rank's `mine` (the same length on each), rank after rank, on every rank.
  std::vector<std::int64_t> all_gather(const std::vector<std::int64_t>& mine) {
    const std::size_t n = mine.size();
    cuda::DeviceBuffer<std::int64_t> send(n), recv(n * ring_.ranks);
    std::vector<std::int64_t> all(n * ring_.ranks);
    CUDA_CHECK(cudaMemcpyAsync(send.data(), mine.data(), send.bytes(), cudaMemcpyHostToDevice, comm_stream_));
    NCCL_CHECK(ncclAllGather(send.data(), recv.data(), n, ncclInt64, comm_, comm_stream_));
    CUDA_CHECK(cudaMemcpyAsync(all.data(), recv.data(), recv.bytes(), cudaMemcpyDeviceToHost, comm_stream_));
    CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    return all;
  }

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
  void kv_hop(int step, R& r, Events& arrived, Events& computed, SpanEvents* spans) {
    const std::size_t kv_row = std::size_t(cuda::ring::RowElems(p_.shape).kv);
    const std::size_t out = std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][rank_].kv_origin) * kv_row;
    const std::size_t in = std::size_t(p_.shape.batch) * ring_.kv_tokens(ring_.steps[step][prev_].kv_origin) * kv_row;
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, step == 0 ? arrived.at[0] : computed.at[step - 1]));
    if (spans != nullptr) spans->begin(spans->layout().kv_hop(step), comm_stream_);
    const int from = step % 2, to = (step + 1) % 2;
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(r.k[from].data(), out, nccl_type<T>(), next_, comm_, comm_stream_));
    NCCL_CHECK(ncclSend(r.v[from].data(), out, nccl_type<T>(), next_, comm_, comm_stream_));
    NCCL_CHECK(ncclRecv(r.k[to].data(), in, nccl_type<T>(), prev_, comm_, comm_stream_));
    NCCL_CHECK(ncclRecv(r.v[to].data(), in, nccl_type<T>(), prev_, comm_, comm_stream_));
    NCCL_CHECK(ncclGroupEnd());
    if (spans != nullptr) spans->end(spans->layout().kv_hop(step), comm_stream_);
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
// With `spans`, the last run records its spans into them, counting from its barrier; pass(spans or nullptr).
template <class Run, class T>
double median_slowest_ms(Rank<T>& rank, int warmup, int iters, SpanEvents* spans, Run pass) {
  std::vector<double> ms;
  for (int i = 0; i < warmup + iters; ++i) {
    SpanEvents* record = i + 1 == warmup + iters ? spans : nullptr;
    if (record != nullptr) record->clear();
    rank.barrier(record != nullptr ? record->reference() : nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    pass(record);
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
    // Every rank records (the flags are the same on each), so every rank joins the gather that follows each pass.
    std::optional<SpanEvents> forward_spans, backward_spans;
    if (plan.timeline) forward_spans.emplace(ring_stamp_layout(ring, Pass::Forward));
    if (plan.timeline && plan.backward) backward_spans.emplace(ring_stamp_layout(ring, Pass::Backward));
    const auto gathered = [&](const SpanEvents& spans) {
      NcclPassStamps all{.layout = spans.layout(), .stamps = me.all_gather(spans.stamps())};
      return rank == 0 ? std::optional<NcclPassStamps>(std::move(all)) : std::nullopt;
    };
    outcome.forward_ms = median_slowest_ms(me, plan.warmup, plan.iters, forward_spans ? &*forward_spans : nullptr,
                                           [&](SpanEvents* spans) { me.forward(nullptr, spans); });
    if (forward_spans) outcome.forward_stamps = gathered(*forward_spans);
    if (plan.backward) {
      me.take_forward();
      outcome.backward_ms = median_slowest_ms(me, plan.warmup, plan.iters, backward_spans ? &*backward_spans : nullptr,
                                              [&](SpanEvents* spans) { me.backward(nullptr, spans); });
      if (backward_spans) outcome.backward_stamps = gathered(*backward_spans);
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
  if (plan.inputs != nullptr && plan.timeline)
    throw std::logic_error("nccl_ring_rank: a timeline records timed runs, not a run on given inputs");
  if (dtype == DType::BF16) return run_rank<__nv_bfloat16>(ring, rank, id, p, dtype, plan);
  return run_rank<__half>(ring, rank, id, p, dtype, plan);
}

#endif  // FLASHLAB_HAVE_NCCL

}  // namespace flashlab
