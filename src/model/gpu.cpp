// The GPU level of the traffic model (gpu.hpp): the GPUs described, and the lock-step replay of a
// kernel's thread blocks through the L2 partitions' caches (SetAssociativeL2).
#include "model/gpu.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "model/l2_sets.hpp"

namespace flashlab {

namespace {

// The GPUs the project runs on, as the CUDA runtime reports them (multiprocessor count and
// cudaDevAttrL2CacheSize); both split their L2 in two partitions. NVIDIA does not publish how the L2 replaces
// lines. Two numbers of the model are taken from counters, those of cuda-fa1 where its working set crosses
// the L2's size (bench/results/h100-dram-counters_l2-transition*.json): 28 ways, and written lines entering
// their sets an eighth of a partition below the newest (model/l2_sets.hpp). They trade off along a ridge
// (more ways with older writes follow the counters almost as well); gpu_counters_tests holds this pair to
// follow the reads and writes better than its neighbours, the 16 ways of an earlier fit, and an LRU. They are
// the model's effective numbers, not a claim about the silicon.
constexpr std::array kGpus = {
    GpuSpec{.id = "h100", .device_name = "NVIDIA H100 80GB HBM3", .sms = 132, .l2_bytes = 50 * 1024 * 1024,
            .l2_partitions = 2, .l2_ways = 28, .l2_store_age = 0.125},
    GpuSpec{.id = "h200", .device_name = "NVIDIA H200", .sms = 132, .l2_bytes = 60 * 1024 * 1024,
            .l2_partitions = 2, .l2_ways = 28, .l2_store_age = 0.125},
};

// One memory access of a unit: what the caches need of its TileEvent, in 16 bytes (a replay reads
// hundreds of millions of them, from as many buffers as there are resident units).
struct Access {
  std::int32_t bh = 0, tile_row = 0, tile_col = 0;
  std::uint32_t bytes : 27 = 0;  // a tile of at most 128 MiB
  std::uint32_t store : 1 = 0;
  std::uint32_t tensor : 4 = 0;
};
static_assert(sizeof(Access) == 16);
static_assert(static_cast<int>(TensorId::Count) <= 16);

// The accesses of one unit, taken in windows: a unit's walk is re-run for each window and only the
// accesses that fall in it are kept, so a long unit (cuda-fa1's block is a whole head) never holds all
// of its accesses at once. Most units fit in one window and are walked once.
class UnitCursor : public TrafficObserver {
 public:
  static constexpr std::size_t kWindow = 1 << 18;

  // Starts unit k of the grid; false when it has no memory access at all.
  bool start(const KernelGrid& grid, std::int64_t k) {
    grid_ = &grid;
    unit_ = k;
    taken_ = 0;
    refill();
    return !exhausted();
  }
  const Access& peek() const { return window_[pos_]; }
  // Moves past the current access; false when the unit has none left.
  bool advance() {
    ++taken_;
    if (++pos_ == window_.size() && !last_window_) refill();
    return !exhausted();
  }
  bool exhausted() const { return pos_ == window_.size() && last_window_; }

  void on_event(const TileEvent& e) override {
    if (e.direction != Direction::Load && e.direction != Direction::Store) return;
    const std::int64_t n = seen_++;
    if (n < skip_ || n >= skip_ + std::int64_t(kWindow)) return;
    if (e.bytes >= (std::int64_t{1} << 27))
      throw InputError("a tile of " + std::to_string(e.bytes) + " bytes is larger than the GPU model's 128 MiB");
    window_.push_back(Access{e.bh, e.tile_row, e.tile_col, static_cast<std::uint32_t>(e.bytes),
                             e.direction == Direction::Store, static_cast<std::uint32_t>(e.tensor)});
  }

 private:
  void refill() {
    window_.clear();
    pos_ = 0;
    seen_ = 0;
    skip_ = taken_;
    grid_->walk_unit(unit_, *this);
    last_window_ = seen_ <= skip_ + std::int64_t(kWindow);
  }

  const KernelGrid* grid_ = nullptr;
  std::int64_t unit_ = 0;
  std::int64_t taken_ = 0;           // accesses of the unit consumed so far
  std::int64_t seen_ = 0, skip_ = 0;  // during a walk: accesses emitted, and how many to pass over
  std::vector<Access> window_;
  std::size_t pos_ = 0;
  bool last_window_ = true;
};

// The share of a tile homed in partition h, keyed apart from the others: the partition in two bits above
// the tile's column (cache_key keeps 22 bits of it).
constexpr int kShareShift = 20;
constexpr int kMaxPartitions = 1 << (22 - kShareShift);
int partition_share_col(int tile_col, std::size_t h) {
  if (tile_col >= (1 << kShareShift))
    throw InputError("a key block index of " + std::to_string(tile_col) + " is beyond the GPU model's 2^20");
  return tile_col | static_cast<int>(h << kShareShift);
}

void add(TrafficTotals& sum, const TrafficTotals& t) {
  for (std::size_t n = 0; n < sum.read.size(); ++n) {
    sum.read[n] += t.read[n];
    sum.written[n] += t.written[n];
  }
  sum.events += t.events;
}

// The tile event of an access (e's other fields stay as they are).
void set_event(TileEvent& e, const Access& a) {
  e.bh = a.bh;
  e.tensor = static_cast<TensorId>(a.tensor);
  e.direction = a.store ? Direction::Store : Direction::Load;
  e.tile_row = a.tile_row;
  e.tile_col = a.tile_col;
  e.bytes = a.bytes;
}

// The keys the partitions keep an access's shares under (every partition keys a tile alike), and the whole
// tile's key (the compulsory count's).
struct TileKeys {
  std::array<std::uint64_t, kMaxPartitions> share{};
  std::uint64_t whole = 0;
};
// Blocks side by side often access the same tile one after another: the last tile's keys are kept.
class ShareKeys {
 public:
  ShareKeys(const Shape& shape, int partitions) : shape_(&shape), partitions_(partitions) {}
  const TileKeys& of(const Access& a) {
    if (!valid_ || a.bh != last_.bh || a.tile_row != last_.tile_row || a.tile_col != last_.tile_col ||
        a.tensor != last_.tensor) {
      TileEvent tile;
      set_event(tile, a);
      keys_.whole = cache_key(tile, shape_->heads_q, shape_->heads_kv);
      for (std::size_t h = 0; h < std::size_t(partitions_); ++h)
        keys_.share[h] = cache_key_at_col(keys_.whole, partition_share_col(a.tile_col, h));
      last_ = a;
      valid_ = true;
    }
    return keys_;
  }

 private:
  const Shape* shape_;
  int partitions_;
  bool valid_ = false;
  Access last_;
  TileKeys keys_;
};

// How many partitions the GPU's L2 has, at least one (the keys tell at most kMaxPartitions apart).
int partitions_of(const GpuSpec& gpu) {
  const int partitions = std::max(1, gpu.l2_partitions);
  if (partitions > kMaxPartitions)
    throw InputError("the GPU model keys at most " + std::to_string(kMaxPartitions) + " L2 partitions");
  return partitions;
}

// The GPU's L2: one cache per partition, each holding what the SMs on its side access.
class L2Partitions {
 public:
  L2Partitions(const GpuSpec& gpu, const Shape& shape) : partitions_(partitions_of(gpu)) {
    for (int n = 0; n < partitions_; ++n)
      l2_.emplace_back(gpu.partition_bytes(), gpu.l2_ways, shape, gpu.l2_store_age);
  }

  // A hint that an access of these keys comes soon: the places the partitions index them at are fetched into the
  // CPU's cache meanwhile (it is those lookups that miss the CPU's caches).
  void prefetch(const TileKeys& keys) const {
    for (std::size_t h = 0; h < std::size_t(partitions_); ++h)
      for (const SetAssociativeL2& part : l2_) part.prefetch(keys.share[h]);
  }

  // Access `a` by an SM on side `side`.
  // The tile's lines are interleaved over both partitions' slices: each partition is the home (the point of
  // coherence) of an equal share of its bytes, keyed apart. A load looks in the near partition, then the far
  // one, then DRAM, and is kept near. A store goes to each share's home: the near partition's own share is
  // dirtied there; the far share is written to the far partition (dirty there) and a near copy, if any, is
  // refreshed clean. So a block's private output is held once, half on the other side, and written back from
  // there; what every SM reads (FA2's K/V) is still held in both.
  void access(const Access& a, std::size_t side, const TileKeys& keys) {
    SetAssociativeL2& near = l2_[side];
    // (a tile is at most 128 MiB: 32-bit division)
    const auto share_bytes = std::int64_t(std::uint32_t(a.bytes) / std::uint32_t(partitions_));
    const auto first_extra = std::int64_t(std::uint32_t(a.bytes) % std::uint32_t(partitions_));
    set_event(share_, a);  // which share it is, its Found key tells
    for (std::size_t h = 0; h < std::size_t(partitions_); ++h) {
      share_.bytes = share_bytes + (h == 0 ? first_extra : 0);  // the first takes the bytes that do not divide
      const std::uint64_t key = keys.share[h];
      if (a.store && h != side) {
        l2_[h].access(l2_[h].find(key), share_);
        near.refresh(near.find(key));
      } else if (a.store) {
        near.access(near.find(key), share_);
      } else {
        // What the near partition may miss, the far one serves when it holds it (and its copy is touched).
        const SetAssociativeL2::Found here = near.find(key);
        double from_peer = 0;
        if (near.presence(here) < 1)
          for (std::size_t f = 0; f < l2_.size() && from_peer == 0; ++f) {
            if (f == side) continue;
            const SetAssociativeL2::Found there = l2_[f].find(key);
            if ((from_peer = l2_[f].presence(there)) > 0) l2_[f].refresh(there);
          }
        near.access(here, share_, from_peer);
      }
    }
  }

  // The kernel ended: each partition's DRAM bytes, hits and dirty bytes, into `out`.
  void settle(KernelTraffic& out) {
    for (SetAssociativeL2& part : l2_) {
      part.settle();
      add(out.dram, part.dram());
      out.hit_bytes += part.hit_bytes();  // a fill from the far partition counts as a hit
      out.dirty_at_end += part.dirty_bytes();
    }
  }

 private:
  int partitions_;
  std::vector<SetAssociativeL2> l2_;
  TileEvent share_;  // the access's share homed in one partition
};

// The lock-step walk of a kernel's units (gpu.hpp), the L2 left out: the accesses in the order the GPU makes
// them go to `caches` (its prefetch(keys) a few accesses ahead, then access(a, side, keys)), and what does not
// depend on the L2 (the two-level and compulsory counts, rounds and accesses) into `out`.
template <typename Caches>
void walk_kernel(const GpuSpec& gpu, const Shape& shape, const KernelGrid& grid, KernelTraffic& out, Caches& caches) {
  out.name = grid.name;
  out.units = grid.units;
  out.resident = resident_units(gpu, grid);
  // Resident slot s runs on partition s % partitions (the block scheduler spreads consecutive blocks over the GPCs).
  const int partitions = partitions_of(gpu);
  CompulsoryTraffic unbounded(&shape);

  std::vector<UnitCursor> slots(static_cast<std::size_t>(out.resident));
  std::vector<std::uint8_t> side_of(slots.size());  // s % partitions, once (a division per access is not free)
  for (std::size_t s = 0; s < slots.size(); ++s) side_of[s] = std::uint8_t(s % std::size_t(partitions));
  std::vector<std::size_t> busy, freed;  // slots holding a unit; slots that finished this round
  std::int64_t next_unit = 0;
  auto start_next = [&](std::size_t s) {  // the next unit that has an access, into slot s
    while (next_unit < grid.units)
      if (slots[s].start(grid, next_unit++)) {
        busy.push_back(s);
        return;
      }
  };
  for (std::size_t s = 0; s < slots.size(); ++s) start_next(s);

  ShareKeys keys_ahead(shape, partitions), keys_now(shape, partitions);
  // The buffers are many and far apart: the walk fetches a few slots ahead, and where the partitions index
  // their accesses' tiles a few less ahead.
  constexpr std::size_t kAhead = 8, kIndexAhead = 4;
  std::array<TileKeys, 2 * kIndexAhead> queued;  // the keys of accesses ahead, by n % size
  TileEvent e;
  while (!busy.empty()) {
    ++out.rounds;
    freed.clear();
    std::size_t kept = 0;
    for (std::size_t n = 0; n < busy.size(); ++n) {
      if (n + kAhead < busy.size()) __builtin_prefetch(&slots[busy[n + kAhead]].peek());
      // The keys found ahead wait in `queued` for their access (slot busy[n] does not move before its turn).
      if (n + kIndexAhead < busy.size()) {
        const TileKeys& ahead = queued[(n + kIndexAhead) % queued.size()] =
            keys_ahead.of(slots[busy[n + kIndexAhead]].peek());
        caches.prefetch(ahead);
        unbounded.prefetch(ahead.whole);
      }
      UnitCursor& c = slots[busy[n]];
      const Access& a = c.peek();
      const TileKeys& keys = n >= kIndexAhead ? queued[n % queued.size()] : keys_now.of(a);
      set_event(e, a);
      (a.store ? out.two_level.written : out.two_level.read)[a.tensor] += e.bytes;
      caches.access(a, side_of[busy[n]], keys);
      unbounded.on_event(e, keys.whole);
      ++out.accesses;
      if (c.advance()) busy[kept++] = busy[n];
      else freed.push_back(busy[n]);
    }
    busy.resize(kept);
    for (std::size_t s : freed) start_next(s);  // they start in the next round
  }
  out.two_level.events = out.accesses;
  unbounded.flush();
  out.compulsory = unbounded.dram();
}

KernelTraffic replay_kernel(const GpuSpec& gpu, const Shape& shape, const KernelGrid& grid) {
  KernelTraffic out;
  L2Partitions l2(gpu, shape);
  walk_kernel(gpu, shape, grid, out, l2);
  l2.settle(out);
  return out;
}

// The accesses of one walk, kept to replay through the caches of several GPUs: each access, its side and its keys.
class Recording {
 public:
  explicit Recording(int partitions) : partitions_(std::size_t(partitions)) {}
  void prefetch(const TileKeys&) const {}
  void access(const Access& a, std::size_t side, const TileKeys& keys) {
    accesses_.push_back(a);
    sides_.push_back(std::uint8_t(side));
    keys_.insert(keys_.end(), keys.share.begin(), keys.share.begin() + std::ptrdiff_t(partitions_));
  }
  // Replays the accesses, in their order, through `l2`.
  void replay(L2Partitions& l2) const {
    constexpr std::size_t kIndexAhead = 4;  // as walk_kernel
    TileKeys keys, ahead;
    for (std::size_t n = 0; n < accesses_.size(); ++n) {
      if (n + kIndexAhead < accesses_.size()) {
        std::copy_n(&keys_[(n + kIndexAhead) * partitions_], partitions_, ahead.share.begin());
        l2.prefetch(ahead);
      }
      std::copy_n(&keys_[n * partitions_], partitions_, keys.share.begin());
      l2.access(accesses_[n], sides_[n], keys);
    }
  }

 private:
  std::size_t partitions_;
  std::vector<Access> accesses_;
  std::vector<std::uint8_t> sides_;
  std::vector<std::uint64_t> keys_;  // partitions_ per access
};

void add_kernel(GpuTraffic& out, KernelTraffic t) {
  out.kernels.push_back(std::move(t));
  const KernelTraffic& k = out.kernels.back();
  add(out.two_level, k.two_level);
  add(out.dram, k.dram);
  add(out.compulsory, k.compulsory);
  out.hit_bytes += k.hit_bytes;
  out.dirty_at_end += k.dirty_at_end;
}

}  // namespace

std::span<const GpuSpec> gpu_specs() { return kGpus; }

std::string known_gpu_ids() {
  std::string ids;
  for (const GpuSpec& g : kGpus) ids += (ids.empty() ? "" : ", ") + std::string(g.id);
  return ids;
}

const GpuSpec& find_gpu(std::string_view id) {
  for (const GpuSpec& g : kGpus)
    if (g.id == id) return g;
  throw InputError("unknown GPU '" + std::string(id) + "': the model describes " + known_gpu_ids());
}

const GpuSpec* gpu_for_device(std::string_view device_name) {
  for (const GpuSpec& g : kGpus)
    if (g.device_name == device_name) return &g;
  return nullptr;
}

std::int64_t resident_units(const GpuSpec& gpu, const KernelGrid& grid) {
  const std::int64_t blocks = std::int64_t{gpu.sms} * grid.blocks_per_sm;
  const std::int64_t units = blocks / std::max<std::int64_t>(1, grid.blocks_per_unit);
  return std::clamp<std::int64_t>(units, 1, std::max<std::int64_t>(1, grid.units));
}

GpuTraffic model_gpu_traffic(const GpuSpec& gpu, const Shape& shape, std::span<const KernelGrid> kernels) {
  GpuTraffic out;
  for (const KernelGrid& k : kernels) add_kernel(out, replay_kernel(gpu, shape, k));
  return out;
}

std::vector<GpuTraffic> model_gpu_traffic(std::span<const GpuSpec> gpus, const Shape& shape,
                                          std::span<const KernelGrid> kernels) {
  std::vector<GpuTraffic> out(gpus.size());
  if (gpus.empty()) return out;
  for (const GpuSpec& g : gpus)
    if (g.sms != gpus[0].sms || g.l2_bytes != gpus[0].l2_bytes || g.l2_partitions != gpus[0].l2_partitions)
      throw InputError("model_gpu_traffic: the GPUs replayed from one walk must differ in their L2's ways and "
                       "write age only");
  for (const KernelGrid& k : kernels) {
    KernelTraffic walked;
    Recording recording(partitions_of(gpus[0]));
    walk_kernel(gpus[0], shape, k, walked, recording);
    for (std::size_t g = 0; g < gpus.size(); ++g) {
      KernelTraffic t = walked;
      L2Partitions l2(gpus[g], shape);
      recording.replay(l2);
      l2.settle(t);
      add_kernel(out[g], std::move(t));
    }
  }
  return out;
}

}  // namespace flashlab
