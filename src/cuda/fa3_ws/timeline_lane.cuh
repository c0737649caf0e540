#pragma once
// The timeline hook of cuda-fa3-ws's kernels, forward and backward (compiled in where a kernel is
// instantiated with kOn = true: the timeline builds behind `flashlab bench --timeline`).
//
// What a kernel records: flashlab::TimelineRecord (model/timeline.hpp), 24 bytes each, %globaltimer
// nanoseconds, into p.timeline (p.timeline_capacity of them). One thread per warpgroup records (the
// producer's issuing thread, thread 0 of each consumer), in blocks blockIdx.x < kTimelineBlocks. A lane takes
// kTimelineChunk slots per atomicAdd on p.timeline_count (one atomic per record would stall the
// recording warp ~1 us on its round trip, longer than a softmax), so the buffer has holes: the host
// fills it with 0xff first and drops records whose event is 0xffff. Within a lane, slot order is time order.
#include <cstdint>

#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/hopper.cuh"
#include "model/timeline.hpp"

namespace flashlab::cuda::fa3_ws {

constexpr unsigned kTimelineChunk = 128;

template <bool kOn>
struct TimelineLane {
  std::uint32_t next = 0, end = 0;
  bool on = false;
  __device__ static std::uint64_t now() {
    if constexpr (kOn) return global_timer_ns();
    else return 0;
  }
  __device__ void start(const Params& p, bool recorder) {
    if constexpr (kOn) on = recorder && blockIdx.x < static_cast<unsigned>(kTimelineBlocks) && p.timeline != nullptr;
    else (void)p, (void)recorder;
  }
  __device__ void put(const Params& p, ::flashlab::PipelineEvent e, std::uint64_t t0, std::uint64_t t1) {
    if constexpr (kOn) {
      if (!on) return;
      if (next == end) {
        next = atomicAdd(p.timeline_count, kTimelineChunk);
        end = next + kTimelineChunk;
      }
      if (next < static_cast<std::uint32_t>(p.timeline_capacity))
        p.timeline[next] = ::flashlab::TimelineRecord{
            blockIdx.x, static_cast<std::uint16_t>(threadIdx.x / kWarpgroupThreads), static_cast<std::uint16_t>(e), t0, t1};
      ++next;
    } else {
      (void)p, (void)e, (void)t0, (void)t1;
    }
  }
  __device__ void instant(const Params& p, ::flashlab::PipelineEvent e, std::uint64_t t) { put(p, e, t, t); }
  __device__ void span(const Params& p, ::flashlab::PipelineEvent e, std::uint64_t t0) { put(p, e, t0, now()); }
  // A barrier wait, recorded only when it blocked (the timer moved).
  __device__ void waited(const Params& p, std::uint64_t t0, std::uint64_t t1) {
    if (t1 > t0) put(p, ::flashlab::PipelineEvent::BarrierWait, t0, t1);
  }
};

}  // namespace flashlab::cuda::fa3_ws
