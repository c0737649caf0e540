#pragma once
// What a kernel's timeline build writes, one record per event, into a global buffer: plain, fixed-width, usable
// in device code. The model turns the records into a Timeline (model/timeline.hpp); a bench hands them up
// (core/bench.hpp) for the command line to write.
#include <cstdint>
#include <type_traits>

namespace flashlab {

// 24 bytes, no padding. Stamps are %globaltimer nanoseconds; an instant has t_end_ns == t_begin_ns; `event` is a
// PipelineEvent (model/timeline.hpp).
struct TimelineRecord {
  std::uint32_t block;      // blockIdx (linearized)
  std::uint16_t warpgroup;  // threadIdx.x / 128
  std::uint16_t event;      // a PipelineEvent
  std::uint64_t t_begin_ns;
  std::uint64_t t_end_ns;
};
static_assert(std::is_trivially_copyable_v<TimelineRecord> && std::is_standard_layout_v<TimelineRecord>);
static_assert(sizeof(TimelineRecord) == 24, "TimelineRecord is the kernel's wire format: keep it 24 bytes");

}  // namespace flashlab
