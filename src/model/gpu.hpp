#pragma once
// The GPU level of the traffic model. The paper's machine has two levels, HBM and SRAM, and one thread
// of control; a GPU runs a kernel's thread blocks many at a time, and an L2 cache sits between their
// shared memory and DRAM. What Nsight Compute's DRAM counters read is set by both: by which blocks run
// side by side (they share the K/V tiles they load) and by how much of that fits the L2.
//
// This level replays the same tile events as the two-level count (the one loop nest of each algorithm),
// cut into the thread blocks of a kernel's real grid:
//  * the blocks start in launch order, as many at a time as the GPU holds (SMs x blocks per SM);
//  * the blocks resident at once advance in lock-step, one memory event each per round, and a block
//    that finishes hands its place to the next block in launch order (an approximation: real blocks
//    drift apart, and a persistent kernel's tiles are handed out the same way);
//  * every access goes through the cache of its L2 partition, cold at the start of each kernel: whole
//    tiles, write-back, write-allocate, in sets of GpuSpec::l2_ways ways (a SetAssociativeL2, whose
//    bytes are expectations; see GpuSpec::l2_partitions).
// DRAM reads are L2 misses; DRAM writes are dirty tiles evicted while the kernel runs. Tiles still
// dirty when a kernel ends are reported apart: Nsight Compute measures one kernel at a time, with the
// caches flushed before it (--cache-control all), and those write-backs fall outside its window.
//
// The model keeps no kernel's numbers: each KernelGrid is built from the data the kernel exports
// (src/cuda/tilings.hpp, through the registry) and walks the loop nest with the kernel's tiling.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"
#include "model/traffic.hpp"

namespace flashlab {

// A GPU as the model needs it. Every GPU the project describes is in gpu_specs(): one place.
//
// The H100's and H200's L2 is two partitions, each wired to half the SMs, and each caches what the SMs on
// its side access. The model keeps one cache per partition (l2_bytes / l2_partitions each) and spreads the
// resident blocks over them alternately; a load the near partition misses is served by the far one when
// it holds the tile, else by DRAM. So a tile that blocks on both sides read (FA2's K and V) is held twice,
// and the capacity that decides FA2's knee is one partition's, 25 MiB on the H100: with one cache of the
// whole 50 MB, cuda-fa2 at d = 128, N = 32k would read K and V about once, where the H100's counters say
// about twice. A store goes to where its bytes are homed: a tile's lines are interleaved over the slices of
// both partitions, so each partition is the home of an equal share of every tile; the share homed on the far
// side is written (and left dirty) there, a near copy only refreshed. A block's private output (cuda-fa1's
// O, l, m) is thus held half in the other side's partition, beside that side's own: against the H100's
// counters this takes cuda-fa1's causal runs at 64 MiB of Q and O from -35% to -3%.
struct GpuSpec {
  std::string_view id;           // what `--gpu` takes: "h100"
  std::string_view device_name;  // what the CUDA runtime calls it: "NVIDIA H100 80GB HBM3"
  int sms = 0;                   // streaming multiprocessors
  std::int64_t l2_bytes = 0;     // the L2 as the runtime reports it (cudaDevAttrL2CacheSize)
  int l2_partitions = 1;         // L2 partitions, each caching what the SMs on its side access
  int l2_ways = 0;               // ways of the L2's sets (model/l2_sets.hpp); 0: a fully associative LRU
  double l2_store_age = 0;       // how far below the newest a written line enters its set, in partitions
  std::int64_t partition_bytes() const { return l2_bytes / l2_partitions; }  // one partition's cache
};

std::span<const GpuSpec> gpu_specs();
// Throws InputError listing the known ids when `id` is not one.
const GpuSpec& find_gpu(std::string_view id);
// The description whose device_name is `device_name`, or nullptr.
const GpuSpec* gpu_for_device(std::string_view device_name);
// "h100, h200": the ids, for sentences.
std::string known_gpu_ids();

// One kernel launch as the model sees it: `units` pieces of work in launch order, each walking its
// share of the loop nest. A unit is one thread block, or (for a kernel whose blocks are far finer
// than any tile worth modeling, such as a 16 x 16 GEMM tile) a fixed number of consecutive blocks.
struct KernelGrid {
  std::string name;                 // "cuda-fa2 forward_kernel"
  std::int64_t units = 0;           // pieces of work, in launch order
  int blocks_per_sm = 1;            // thread blocks one SM holds at once
  std::int64_t blocks_per_unit = 1; // thread blocks one unit stands for
  std::int64_t grid_blocks = 0;     // thread blocks launched (a persistent kernel: fewer than its units)
  // Emits the tile events of unit k (0 <= k < units) to the observer, in the unit's own order.
  std::function<void(std::int64_t k, TrafficObserver&)> walk_unit;
};

// Units resident at once: SMs x blocks per SM, in units, at least one, at most all of them.
std::int64_t resident_units(const GpuSpec&, const KernelGrid&);

// The three levels of one kernel, from the same accesses in the same order.
struct KernelTraffic {
  std::string name;
  std::int64_t units = 0, resident = 0, rounds = 0, accesses = 0;
  TrafficTotals two_level;          // the paper's count: every tile transfer is an HBM access
  TrafficTotals dram;               // the L2 model: reads are misses, writes are evictions while it ran
  TrafficTotals compulsory;         // each distinct tile read once, and written once if it is written
  std::int64_t hit_bytes = 0;       // loads the L2 served
  std::int64_t dirty_at_end = 0;    // written to L2 and still there when the kernel ended
};

struct GpuTraffic {
  std::vector<KernelTraffic> kernels;
  TrafficTotals two_level, dram, compulsory;  // summed over the kernels
  std::int64_t hit_bytes = 0, dirty_at_end = 0;
};

// Replays the kernels, one after another, each from a cold L2 of the GPU's size. `shape` tells which
// query heads share a K/V head.
GpuTraffic model_gpu_traffic(const GpuSpec&, const Shape& shape, std::span<const KernelGrid> kernels);
// The same for several GPUs that differ in their L2's ways and write age only (the same SMs, L2 size and
// partitions; InputError otherwise), one result per GPU. Each kernel is walked once and its accesses kept in
// memory (about 33 bytes each with two partitions), then replayed through each GPU's caches in turn: the walk,
// which costs about as much as the caches, is not repeated.
std::vector<GpuTraffic> model_gpu_traffic(std::span<const GpuSpec> gpus, const Shape& shape,
                                          std::span<const KernelGrid> kernels);

}  // namespace flashlab
