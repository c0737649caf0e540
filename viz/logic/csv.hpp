#pragma once
// CSV export: the counters at the current step (per tensor, read and written) and the sweeps.
#include <string>

#include "replay.hpp"
#include "sweep.hpp"

namespace flashlab::viz {

std::string counters_csv(const Replay&);  // tensor,read_bytes,written_bytes,...,final_read_bytes,...
std::string sweep_csv(const TrafficSweep&, const CpuTiming&);
void write_text_file(const std::string& path, const std::string& text);  // throws InputError

}  // namespace flashlab::viz
