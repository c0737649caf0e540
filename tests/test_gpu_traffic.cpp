// The GPU level of the traffic model (model/gpu.hpp) and the CUDA variants' kernels as it replays them
// (registry/gpu_models.hpp): lock-step rounds of resident thread blocks, a cache per L2 partition (a store to
// the partitions its bytes are homed in, a near copy only refreshed), cold per kernel; the paper's count
// above it and the compulsory traffic below; the H100's measured DRAM reads of cuda-fa2 that it must
// reproduce; and the partitions' caches themselves (model/l2_sets.hpp): an exact LRU with 0 ways (the toy
// GPUs here), sets of 28 ways whose written lines start older on the H100.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/tilings.hpp"
#include "model/dram_counters.hpp"
#include "model/gpu.hpp"
#include "model/l2_sets.hpp"
#include "model/traffic.hpp"
#include "registry/gpu_models.hpp"

using namespace flashlab;

namespace {

using I64 = std::int64_t;

Problem problem(int n, int d, CausalAlign causal = CausalAlign::None, int batch = 1, int heads = 16) {
  Problem p;
  p.shape = Shape{.batch = batch, .heads_q = heads, .heads_kv = heads, .seq_q = n, .seq_k = n, .head_dim = d};
  p.options.causal = causal;
  return p;
}

// A made-up GPU: `sms` SMs and an L2 of `l2` bytes in `partitions` partitions.
GpuSpec toy_gpu(int sms, I64 l2, int partitions = 1) {
  return GpuSpec{.id = "toy", .device_name = "toy", .sms = sms, .l2_bytes = l2, .l2_partitions = partitions};
}

// A kernel whose unit k loads the tiles `tiles[k]` of tensor K, 100 bytes each, in order.
KernelGrid toy_kernel(std::vector<std::vector<int>> tiles, int blocks_per_sm = 1) {
  KernelGrid g;
  g.name = "toy";
  g.units = g.grid_blocks = I64(tiles.size());
  g.blocks_per_sm = blocks_per_sm;
  g.walk_unit = [tiles](I64 k, TrafficObserver& o) {
    for (int t : tiles[std::size_t(k)]) {
      TileEvent e;
      e.tensor = TensorId::K;
      e.direction = Direction::Load;
      e.tile_col = t;
      e.bytes = 100;
      o.on_event(e);
    }
  };
  return g;
}

// A kernel whose unit k makes the accesses `ops[k]` in order: a tile of tensor O, 100 bytes, loaded or stored.
struct Op {
  int tile;
  Direction direction;
};
KernelGrid toy_kernel_of_o(std::vector<std::vector<Op>> ops) {
  KernelGrid g;
  g.name = "toy";
  g.units = g.grid_blocks = I64(ops.size());
  g.walk_unit = [ops](I64 k, TrafficObserver& o) {
    for (const Op& op : ops[std::size_t(k)]) {
      TileEvent e;
      e.tensor = TensorId::O;
      e.direction = op.direction;
      e.tile_col = op.tile;
      e.bytes = 100;
      o.on_event(e);
    }
  };
  return g;
}
constexpr Direction kLoad = Direction::Load, kStore = Direction::Store;

GpuTraffic replay(const GpuSpec& gpu, const Problem& p, const std::vector<KernelGrid>& kernels) {
  return model_gpu_traffic(gpu, p.shape, kernels);
}

GpuTraffic model(std::string_view variant, const Problem& p, const GpuSpec& gpu = find_gpu("h100")) {
  return replay(gpu, p, gpu_forward_pass(variant, p, gpu).kernels);
}

I64 qkv_bytes(const Problem& p, int bytes) {
  const Shape& s = p.shape;
  return I64{s.batch} * (I64{s.seq_q} * s.heads_q + 2 * I64{s.seq_k} * s.heads_kv) * s.head_dim * bytes;
}

I64 rd(const TrafficTotals& t, TensorId id) { return t.read[static_cast<int>(id)]; }

// The H100 with a fully associative LRU in each partition: where the structure of a replay is exact.
GpuSpec h100_lru() {
  GpuSpec g = find_gpu("h100");
  g.l2_ways = 0;
  g.l2_store_age = 0;
  return g;
}

}  // namespace

TEST_CASE("a tile's key at another column is the key of that column's tile, GQA or not") {
  for (const auto& [heads_q, heads_kv] : {std::pair{8, 0}, {8, 8}, {8, 2}, {6, 1}})
    for (const TensorId tensor : {TensorId::Q, TensorId::K, TensorId::V, TensorId::O, TensorId::dV}) {
      TileEvent e;
      e.bh = 2 * heads_q + 5;  // batch 2, head 5
      e.tensor = tensor;
      e.tile_row = 77;
      e.tile_col = 3;
      const std::uint64_t key = cache_key(e, heads_q, heads_kv);
      for (const int col : {0, 1, 3, 1 << 20, (1 << 22) - 1}) {
        CAPTURE(heads_q);
        CAPTURE(heads_kv);
        CAPTURE(col);
        TileEvent moved = e;
        moved.tile_col = col;
        CHECK(cache_key_at_col(key, col) == cache_key(moved, heads_q, heads_kv));
      }
    }
}

TEST_CASE("the GPUs are described once: SMs, L2 and its partitions, by id or by the runtime's device name") {
  const GpuSpec& h100 = find_gpu("h100");
  CHECK(h100.sms == 132);
  CHECK(h100.l2_bytes == 50 * 1024 * 1024);
  CHECK(h100.partition_bytes() == 25 * 1024 * 1024);
  CHECK(find_gpu("h200").l2_bytes == 60 * 1024 * 1024);
  CHECK(gpu_for_device("NVIDIA H100 80GB HBM3") == &h100);
  CHECK(gpu_for_device("NVIDIA A100-SXM4-80GB") == nullptr);
  CHECK_THROWS_WITH_AS(find_gpu("a100"), "unknown GPU 'a100': the model describes h100, h200", InputError);
}

TEST_CASE("resident units: SMs x blocks per SM, in units of blocks, at least one, at most the grid") {
  KernelGrid g = toy_kernel(std::vector<std::vector<int>>(1000), 2);
  CHECK(resident_units(find_gpu("h100"), g) == 264);
  g.blocks_per_unit = 64;
  CHECK(resident_units(find_gpu("h100"), g) == 4);  // 264 blocks hold 4 units of 64
  g.blocks_per_unit = 1000;
  CHECK(resident_units(find_gpu("h100"), g) == 1);
  g.units = 10;
  g.blocks_per_unit = 1;
  CHECK(resident_units(find_gpu("h100"), g) == 10);
}

TEST_CASE("resident blocks advance in lock-step, so they share what they load; one at a time they don't") {
  const Problem p = problem(64, 64);
  // Two blocks each load tiles 0 then 1; the L2 holds one tile.
  const std::vector<KernelGrid> kernel = {toy_kernel({{0, 1}, {0, 1}})};
  const GpuTraffic together = replay(toy_gpu(2, 100), p, kernel);
  CHECK(together.dram.total_read() == 200);  // round 1: block 0 misses tile 0, block 1 hits it; round 2 alike
  CHECK(together.hit_bytes == 200);
  CHECK(together.kernels[0].rounds == 2);
  const GpuTraffic alone = replay(toy_gpu(1, 100), p, kernel);
  CHECK(alone.dram.total_read() == 400);  // block 1 starts after block 0, whose tile 1 evicted tile 0
  CHECK(alone.kernels[0].rounds == 4);
  CHECK(alone.two_level.total_read() == 400);
  CHECK(alone.compulsory.total_read() == 200);
}

TEST_CASE("each L2 partition caches what the blocks on its side access; a miss there is served by the other") {
  const Problem p = problem(64, 64);
  // Blocks 0 and 1 run on partitions 0 and 1 and both load tile 7: one DRAM read, the second a fill from
  // the other partition.
  const GpuTraffic shared = replay(toy_gpu(2, 200, 2), p, {toy_kernel({{7}, {7}})});
  CHECK(shared.dram.total_read() == 100);
  CHECK(shared.hit_bytes == 100);
  // Private working sets: each block cycles through two tiles of its own. Each partition holds its block's
  // two (100 bytes each): every tile comes from DRAM once. One LRU of one partition's size would thrash.
  const std::vector<KernelGrid> own = {toy_kernel({{0, 1, 0, 1, 0, 1}, {2, 3, 2, 3, 2, 3}})};
  CHECK(replay(toy_gpu(2, 400, 2), p, own).dram.total_read() == 400);
  CHECK(replay(toy_gpu(2, 200, 1), p, own).dram.total_read() == 1200);
}

TEST_CASE("a store goes to the partition its bytes are homed in: a block's own output takes room on both sides") {
  const Problem p = problem(64, 64);
  // One block, on partition 0 of two that hold 100 bytes each, stores two tiles of 100 bytes. Each partition
  // is the home of half of every tile, so 50 bytes of each stay dirty on either side: nothing is evicted.
  const GpuTraffic two = replay(toy_gpu(1, 200, 2), p, {toy_kernel_of_o({{{0, kStore}, {1, kStore}}})});
  CHECK(two.dram.total_written() == 0);
  CHECK(two.dirty_at_end == 200);
  // Had the stores stayed on the block's side, its partition would have held one tile and written the other
  // back: what one partition of 100 bytes does.
  const GpuTraffic one = replay(toy_gpu(1, 100, 1), p, {toy_kernel_of_o({{{0, kStore}, {1, kStore}}})});
  CHECK(one.dram.total_written() == 100);
  CHECK(one.dirty_at_end == 100);
}

TEST_CASE("a store's far half refreshes the near copy: no DRAM read, no second write-back, the copy kept") {
  const Problem p = problem(64, 64);
  // The block loads tile 0 (both halves now near, clean), then stores it: the near half is dirtied near, the
  // far half written dirty to its home, and the near copy of it only refreshed. What reaches DRAM is the load
  // and, once, the tile's 100 bytes still dirty: not 150, as a near copy dirtied too would be.
  const GpuTraffic t = replay(toy_gpu(1, 1000, 2), p, {toy_kernel_of_o({{{0, kLoad}, {0, kStore}}})});
  CHECK(t.dram.total_read() == 100);
  CHECK(t.dram.total_written() == 0);
  CHECK(t.dirty_at_end == 100);
  // The refresh keeps the near copy recent. Partitions of 200 bytes; block A (partition 0) loads tiles 0
  // and 1, stores 0, loads 2 and then 0 again, while block B (partition 1) streams tiles 10 to 14. A's store
  // makes 0's far half its newest line, so its load of 2 evicts tile 1, and 0 is still whole near when A
  // reads it again, after B's stream has evicted (and written back) the far home's copy. Without the refresh,
  // 2 would evict that near copy too, and the far half would come from DRAM again (850 bytes).
  const GpuTraffic kept = replay(toy_gpu(2, 400, 2), p,
                                 {toy_kernel_of_o({{{0, kLoad}, {1, kLoad}, {0, kStore}, {2, kLoad}, {0, kLoad}},
                                                   {{10, kLoad}, {11, kLoad}, {12, kLoad}, {13, kLoad}, {14, kLoad}}})});
  CHECK(kept.dram.total_read() == 800);  // every tile once
  CHECK(kept.dram.total_written() == 50);  // the far half, evicted from its home by B
  CHECK(kept.dirty_at_end == 50);          // the near half
}

namespace {
TileEvent o_tile(int tile, Direction d, I64 bytes = 100) {
  TileEvent e;
  e.tensor = TensorId::O;
  e.direction = d;
  e.tile_col = tile;
  e.bytes = bytes;
  return e;
}
}  // namespace

namespace {
// P(Poisson(lambda) < k): the chance that a line of a k-way set survives a reuse at mean lambda = k D / C
// (computed here by the sum, apart from the cache's own table).
double poisson_below(double lambda, int k) {
  double term = std::exp(-lambda), sum = 0;
  for (int n = 0; n < k; ++n) sum += term, term *= lambda / (n + 1);
  return sum;
}
}  // namespace

TEST_CASE("SetAssociativeL2::refresh makes a held tile the newest, counting nothing; one it does not hold, nothing") {
  const Shape shape = problem(64, 64).shape;
  SetAssociativeL2 l2(200, 0, shape);
  l2.access(o_tile(0, kStore));  // dirty
  l2.access(o_tile(1, kLoad));
  const TrafficTotals before = l2.dram();
  const I64 hits = l2.hit_bytes();
  l2.refresh(o_tile(0, kStore));  // 0 is now newer than 1
  l2.refresh(o_tile(5, kStore));  // not held: not inserted
  CHECK(l2.dram().events == before.events);
  CHECK(l2.hit_bytes() == hits);
  CHECK(l2.presence(o_tile(5, kLoad)) == 0);
  l2.access(o_tile(2, kLoad));  // evicts the oldest: 1, clean
  CHECK(l2.presence(o_tile(0, kLoad)) == 1);
  CHECK(l2.presence(o_tile(1, kLoad)) == 0);
  l2.settle();
  CHECK(l2.dram().total_read() == 200);  // 1 and 2
  CHECK(l2.dram().total_written() == 0);
  CHECK(l2.dirty_bytes() == 100);  // 0 kept its dirty state
}

TEST_CASE("SetAssociativeL2 with 0 ways is the L2Model's LRU of whole tiles, byte for byte") {
  // A mixed stream: tiles of 64-640 bytes, loads and stores, reused at every distance around the capacity.
  const Shape shape = problem(64, 64).shape;
  for (const I64 capacity : {I64{0}, I64{1000}, I64{5000}, I64{40000}}) {
    CAPTURE(capacity);
    L2Model lru(capacity, &shape);
    SetAssociativeL2 sets(capacity, 0, shape);
    std::uint64_t x = 12345;
    for (int n = 0; n < 20000; ++n) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const int tile = int((x >> 33) % (n % 3 == 0 ? 200 : 40));
      const TileEvent e = o_tile(tile, (x >> 20) % 4 == 0 ? kStore : kLoad, 64 * (1 + tile % 10));
      lru.on_event(e);
      sets.access(e);
    }
    sets.settle();
    CHECK(sets.dram().read == lru.dram().read);
    CHECK(sets.dram().written == lru.dram().written);
    CHECK(sets.dirty_bytes() == lru.dirty_bytes());
    CHECK(sets.hit_bytes() == lru.hit_bytes());
  }
}

TEST_CASE("SetAssociativeL2 with A ways: a line reused after D bytes is still there with P(Poisson(A D / C) < A)") {
  // A working set of W bytes swept again and again: every reuse comes after W - 100 bytes of other tiles.
  const Shape shape = problem(64, 64).shape;
  const I64 capacity = 100000;
  for (const int ways : {4, 16}) {
    for (const int tiles : {500, 800, 1000, 1300}) {
      CAPTURE(ways);
      CAPTURE(tiles);
      SetAssociativeL2 l2(capacity, ways, shape);
      const int passes = 10;
      for (int pass = 0; pass < passes; ++pass)
        for (int t = 0; t < tiles; ++t) l2.access(o_tile(t, kLoad));
      l2.settle();
      const double w = 100.0 * tiles, kept = poisson_below(ways * (w - 100) / double(capacity), ways);
      CAPTURE(kept);
      // The first pass is compulsory; each later one misses what is gone.
      CHECK(double(l2.dram().total_read()) == doctest::Approx(w + (passes - 1) * w * (1 - kept)).epsilon(1e-3));
      CHECK(double(l2.hit_bytes()) == doctest::Approx((passes - 1) * w * kept).epsilon(1e-3));
    }
  }
  // The same at 80% of the capacity: an LRU keeps everything, 16 ways lose a fifth, 4 ways a third.
  SetAssociativeL2 lru(capacity, 0, shape), sixteen(capacity, 16, shape);
  for (int pass = 0; pass < 2; ++pass)
    for (int t = 0; t < 800; ++t) lru.access(o_tile(t, kLoad)), sixteen.access(o_tile(t, kLoad));
  lru.settle();
  sixteen.settle();
  CHECK(lru.dram().total_read() == 80000);
  CHECK(double(sixteen.dram().total_read()) / 80000 - 1 > 0.15);
  CHECK(double(sixteen.dram().total_read()) / 80000 - 1 < 0.25);
}

TEST_CASE("SetAssociativeL2: a tile a store wrote is store_age x C bytes older than one a load touched") {
  const Shape shape = problem(64, 64).shape;
  const I64 capacity = 100000;
  const int ways = 16;
  const double age = 0.25;
  // Tile 0 is written (or read), then 600 other tiles are read (60,000 bytes), then tile 0 is read again.
  for (const bool stored : {true, false}) {
    CAPTURE(stored);
    SetAssociativeL2 l2(capacity, ways, shape, age);
    l2.access(o_tile(0, stored ? kStore : kLoad));
    for (int t = 1; t <= 600; ++t) l2.access(o_tile(t, kLoad));
    const double distance = 60000 + (stored ? age * capacity : 0);
    const double kept = poisson_below(ways * distance / double(capacity), ways);
    CHECK(l2.presence(o_tile(0, kLoad)) == doctest::Approx(kept).epsilon(1e-3));
    l2.access(o_tile(0, kLoad));
    l2.settle();  // the bytes are expectations, rounded to whole bytes here
    // Read: the 600 others, tile 0 once more if a load brought it first, and the part of it that was lost.
    const double read = 60000 + (stored ? 0 : 100) + 100 * (1 - kept);
    CHECK(std::abs(double(l2.dram().total_read()) - read) <= 1);
    // What a store left dirty and the cache lost is written back; a load's tile was clean.
    CHECK(std::abs(double(l2.dram().total_written()) - (stored ? 100 * (1 - kept) : 0)) <= 1);
    // A load makes the tile the newest, of no age: right after it, it is surely here.
    CHECK(l2.presence(o_tile(0, kLoad)) == 1);
  }
  // With no age a store is a touch like a load.
  SetAssociativeL2 stored(capacity, ways, shape), loaded(capacity, ways, shape);
  stored.access(o_tile(0, kStore));
  loaded.access(o_tile(0, kLoad));
  for (int t = 1; t <= 600; ++t) stored.access(o_tile(t, kLoad)), loaded.access(o_tile(t, kLoad));
  CHECK(stored.presence(o_tile(0, kLoad)) == loaded.presence(o_tile(0, kLoad)));
  CHECK(stored.presence(o_tile(0, kLoad)) < 1);
}

TEST_CASE("SetAssociativeL2: dirty bytes that left are written back once, the rest stay; a peer serves its share") {
  const Shape shape = problem(64, 64).shape;
  // Stores of W = 0.8 C, then a sweep of loads over other tiles as large: what was dirty and left is written.
  const I64 capacity = 100000;
  SetAssociativeL2 l2(capacity, 16, shape);
  for (int t = 0; t < 800; ++t) l2.access(o_tile(t, kStore));
  for (int t = 1000; t < 1800; ++t) l2.access(o_tile(t, kLoad));
  l2.settle();
  const double written = double(l2.dram().total_written()), dirty = double(l2.dirty_bytes());
  CHECK(written + dirty == doctest::Approx(80000).epsilon(1e-9));  // each dirty byte once: left, or still here
  CHECK(written > 40000);  // after 0.8-1.6 C of newer bytes, most are gone
  CHECK(dirty > 0);
  // A load that another cache serves in full reads nothing from DRAM and counts as a hit.
  SetAssociativeL2 near(capacity, 16, shape);
  near.access(o_tile(7, kLoad), 1.0);
  near.settle();
  CHECK(near.dram().total_read() == 0);
  CHECK(near.hit_bytes() == 100);
  CHECK(near.presence(o_tile(7, kLoad)) == doctest::Approx(1.0));
}

TEST_CASE("a finished block hands its place to the next block in launch order, which starts the next round") {
  const Problem p = problem(64, 64);
  // Lengths 1, 3, 1 on two places: block 2 takes block 0's place in round 2, so all is done in 3 rounds.
  const GpuTraffic t = replay(toy_gpu(2, 0), p, {toy_kernel({{0}, {1, 2, 3}, {4}})});
  CHECK(t.kernels[0].rounds == 3);
  CHECK(t.kernels[0].accesses == 5);
  // A block with no access takes no round.
  CHECK(replay(toy_gpu(1, 0), p, {toy_kernel({{0}, {}, {1}})}).kernels[0].rounds == 2);
}

TEST_CASE("a block longer than the replay's window of accesses is replayed whole, in order") {
  const Problem p = problem(64, 64);
  std::vector<int> tiles(700000);
  for (std::size_t n = 0; n < tiles.size(); ++n) tiles[n] = int(n % 1000);
  const GpuTraffic t = replay(toy_gpu(1, 100 * 1000), p, {toy_kernel({tiles})});
  CHECK(t.kernels[0].accesses == 700000);
  CHECK(t.two_level.total_read() == 70000000);
  CHECK(t.dram.total_read() == 100 * 1000);  // 1000 tiles fit: each misses once, in the first window
  CHECK(t.compulsory.total_read() == 100 * 1000);
}

TEST_CASE("no L2 gives the paper's count; an endless one the compulsory traffic; each kernel starts cold") {
  for (const char* v : {"cuda-naive", "cuda-fa1", "cuda-fa2", "cuda-fa3-ws"}) {
    CAPTURE(v);
    const Problem p = problem(300, 64, CausalAlign::TopLeft, 2, 3);
    const GpuForwardPass pass = gpu_forward_pass(v, p, find_gpu("h100"));
    const GpuTraffic none = replay(toy_gpu(132, 0), p, pass.kernels);
    CHECK(none.dram.read == none.two_level.read);
    CHECK(none.dram.written == none.two_level.written);
    const GpuTraffic endless = replay(toy_gpu(132, I64{1} << 50), p, pass.kernels);
    CHECK(endless.dram.read == endless.compulsory.read);
    CHECK(endless.dram.total_written() == 0);  // nothing evicted: every write is still in the L2
    CHECK(endless.dirty_at_end == endless.compulsory.total_written());
  }
  // cuda-naive's softmax reads S that the first GEMM wrote: a cold L2 per kernel reads it from DRAM.
  const Problem p = problem(256, 64);
  const GpuTraffic naive = replay(toy_gpu(132, I64{1} << 50), p, gpu_forward_pass("cuda-naive", p, find_gpu("h100")).kernels);
  CHECK(rd(naive.dram, TensorId::S) == I64{16} * 256 * 256 * 4);
}

TEST_CASE("one walk replayed through several L2s gives each GPU's own replay, byte for byte") {
  // The L2s differ in ways and write age (an LRU, 16 ways aging nothing, the H100 as described), over kernels that
  // load, store and re-read: every total, per kernel too, must be what the GPU's own replay gives.
  std::vector<GpuSpec> gpus = {h100_lru(), find_gpu("h100"), find_gpu("h100")};
  gpus[1].l2_ways = 16;
  gpus[1].l2_store_age = 0;
  for (const char* v : {"cuda-naive", "cuda-fa1", "cuda-fa2"}) {
    for (const CausalAlign causal : {CausalAlign::None, CausalAlign::TopLeft}) {
      CAPTURE(v);
      const Problem p = problem(2048, 128, causal);  // cuda-fa1's Q and O (34 MB) pass a partition's 25 MB
      const GpuForwardPass pass = gpu_forward_pass(v, p, gpus[0]);
      const std::vector<GpuTraffic> together = model_gpu_traffic(gpus, p.shape, pass.kernels);
      REQUIRE(together.size() == gpus.size());
      for (std::size_t g = 0; g < gpus.size(); ++g) {
        CAPTURE(g);
        const GpuTraffic alone = replay(gpus[g], p, pass.kernels);
        CHECK(together[g].dram.read == alone.dram.read);
        CHECK(together[g].dram.written == alone.dram.written);
        CHECK(together[g].two_level.read == alone.two_level.read);
        CHECK(together[g].compulsory.read == alone.compulsory.read);
        CHECK(together[g].hit_bytes == alone.hit_bytes);
        CHECK(together[g].dirty_at_end == alone.dirty_at_end);
        REQUIRE(together[g].kernels.size() == alone.kernels.size());
        for (std::size_t k = 0; k < alone.kernels.size(); ++k) {
          CHECK(together[g].kernels[k].dram.read == alone.kernels[k].dram.read);
          CHECK(together[g].kernels[k].rounds == alone.kernels[k].rounds);
          CHECK(together[g].kernels[k].accesses == alone.kernels[k].accesses);
        }
      }
      // The L2s matter here: cuda-fa1 re-reads Q and O, which an LRU and sets of 16 and 28 ways keep differently.
      if (std::string_view(v) == "cuda-fa1")
        CHECK(together[0].dram.total_read() != together[1].dram.total_read());
    }
  }
  // The L2s of one walk must sit on the same GPU otherwise: another L2 size is refused in one sentence.
  const Problem p = problem(256, 64);
  std::vector<GpuSpec> mixed = {find_gpu("h100"), find_gpu("h100")};
  mixed[1].l2_bytes /= 2;
  CHECK_THROWS_AS(model_gpu_traffic(mixed, p.shape, gpu_forward_pass("cuda-fa2", p, mixed[0]).kernels), InputError);
}

TEST_CASE("cuda-fa2 on the H100: the model reproduces the DRAM reads Nsight Compute measured") {
  // Measured on an NVIDIA H100 80GB HBM3 with `ncu --metrics dram__bytes_read.sum` over a bench that ran
  // cuda-fa2's forward twice (bf16, B = 1, H = 16, non-causal), each launch from a flushed L2. Compulsory
  // traffic is twice Q + K + V. The tolerance is the model's stated one: 20%.
  struct Measured {
    int d, n;
    double dram_read;
  };
  const Measured rows[] = {{64, 8192, 101e6}, {64, 32768, 448e6}, {128, 32768, 1.30e9}, {128, 131072, 11.6e9}};
  for (const Measured& m : rows) {
    CAPTURE(m.d);
    CAPTURE(m.n);
    const Problem p = problem(m.n, m.d);
    const GpuTraffic one_pass = model("cuda-fa2", p);
    const double predicted = 2.0 * double(one_pass.dram.total_read());
    CAPTURE(predicted);
    CHECK(std::abs(predicted / m.dram_read - 1) <= 0.20);
    CHECK(2 * one_pass.compulsory.total_read() == 2 * qkv_bytes(p, 2));
    CHECK(one_pass.two_level.total_read() > 10 * one_pass.dram.total_read());  // the paper's count: far above
  }
  // The L2 partitions matter: an LRU of the whole 50 MB would have K and V of d = 128, N = 32k read about
  // once, 38% under what was measured.
  const Problem p = problem(32768, 128);
  GpuSpec whole = find_gpu("h100");
  whole.l2_partitions = 1;
  const double one_lru = 2.0 * double(model("cuda-fa2", p, whole).dram.total_read());
  CHECK(one_lru / 1.30e9 < 0.8);
}

TEST_CASE("past the knee, each wave of resident blocks reads the K and V of every head it spans, once") {
  // cuda-fa2, d = 64, N = 8k: 264 resident blocks of 128 query rows span four heads, whose K and V (8 MiB)
  // fit the L2: Q, K and V are read once. (In the H100's sets a few lines still meet a full set: under 0.01%.)
  const Problem small = problem(8192, 64);
  CHECK(model("cuda-fa2", small, h100_lru()).dram.total_read() == qkv_bytes(small, 2));
  const double once = double(qkv_bytes(small, 2));
  CHECK(double(model("cuda-fa2", small).dram.total_read()) == doctest::Approx(once).epsilon(1e-4));
  // d = 128, N = 128k: a head's K and V (64 MiB) outgrow the L2. Non-causal blocks are all as long, so the
  // blocks run in waves of 264; a wave loads each K_j, V_j of a head it spans once (its blocks share it in
  // the same round), and nothing survives from one wave to the next.
  const Problem p = problem(131072, 128);
  const GpuTraffic t = model("cuda-fa2", p, h100_lru());
  const I64 blocks_per_head = 131072 / 128, blocks = 16 * blocks_per_head, wave = 2 * 132;
  I64 heads_spanned = 0;
  for (I64 first = 0; first < blocks; first += wave)
    heads_spanned += (std::min(first + wave, blocks) - 1) / blocks_per_head - first / blocks_per_head + 1;
  const I64 kv_head_bytes = I64{131072} * 128 * 2;
  CHECK(rd(t.dram, TensorId::K) == heads_spanned * kv_head_bytes);
  CHECK(rd(t.dram, TensorId::V) == heads_spanned * kv_head_bytes);
  CHECK(rd(t.dram, TensorId::Q) == 16 * kv_head_bytes);
  // The waves are far apart: the sets change nothing that shows.
  const GpuTraffic sets = model("cuda-fa2", p);
  CHECK(double(rd(sets.dram, TensorId::K)) == doctest::Approx(double(rd(t.dram, TensorId::K))).epsilon(1e-4));
}

TEST_CASE("cuda-fa3-ws: one block per SM takes tiles in groups of heads whose K and V fit half the L2") {
  // N = 8k, d = 128: a head's K and V are 4 MiB, so groups of 6 heads (25 MiB); within a group the last
  // query block of every head first, heads fastest.
  const Problem p = problem(8192, 128);
  const GpuForwardPass pass = gpu_forward_pass("cuda-fa3-ws", p, find_gpu("h100"));
  CHECK(cuda::fa3_ws::heads_per_group(find_gpu("h100").l2_bytes, p.shape, 2, false) == 6);
  const KernelGrid& k = pass.kernels[0];
  CHECK(k.units == 16 * 64);
  CHECK(k.grid_blocks == 132);
  CHECK(resident_units(find_gpu("h100"), k) == 132);
  struct FirstLoad : TrafficObserver {
    int bh = -1, row = -1;
    void on_event(const TileEvent& e) override {
      if (bh < 0 && e.direction == Direction::Load) bh = e.bh, row = e.tile_row;
    }
  };
  auto first_load = [&](I64 unit) {
    FirstLoad f;
    k.walk_unit(unit, f);
    return std::pair{f.bh, f.row};
  };
  CHECK(first_load(0) == std::pair{0, 63});
  CHECK(first_load(5) == std::pair{5, 63});
  CHECK(first_load(6) == std::pair{0, 62});
  CHECK(first_load(6 * 64) == std::pair{6, 63});        // the second group
  CHECK(first_load(12 * 64 + 4) == std::pair{12, 62});  // the last group holds 4 heads
}

TEST_CASE("cuda-fa3-ws at d = 64: three consumers of 64 rows (Br = 192, Bc = 128) where their tiles pad the queries little; the model follows") {
  namespace fa3 = cuda::fa3_ws;
  const auto tiling = [](int seq_q, int seq_k, bool causal, bool dropout = false, int d = 64) {
    return fa3::forward_tiling(Shape{.seq_q = seq_q, .seq_k = seq_k, .head_dim = d}, causal, dropout);
  };
  const auto is = [](cuda::KernelTiling t, int br, int bc) { return t.Br == br && t.Bc == bc && t.warps == (br / 64 + 1) * 4; };
  // Queries that 192-row tiles pad no more than 128-row ones: three consumers, with a mask or without, short keys or
  // long (384, 768, 1536 and 3072 are whole tiles of both; 2048 and 16384 pad 64 and 128 rows more of thousands).
  for (const int n : {384, 768, 1536, 2048, 3072, 16384}) {
    CAPTURE(n);
    CHECK(is(tiling(n, n, false), 192, 128));
    CHECK(is(tiling(n, n, true), 192, 128));
  }
  // 512 and 1024 queries: 1/8 more rows for three. Without a mask three still win over two on 128-key blocks (the
  // short keys); with a mask, or against two on the long keys' 192-key blocks, they do not.
  for (const int n : {512, 1024}) {
    CAPTURE(n);
    CHECK(is(tiling(n, n, false), 192, 128));
    CHECK(is(tiling(n, n, true), 128, 128));
    CHECK(is(tiling(n, fa3::kWideBcMinKeys, false), 128, 192));
  }
  // 128 and 256 queries (half as many rows again) and one query (a decode step): two consumers, whatever the keys.
  for (const int q : {1, 128, 256}) {
    CAPTURE(q);
    CHECK(is(tiling(q, 1000, false), 128, 128));
    CHECK(is(tiling(q, 8192, false), 128, 192));
    CHECK(is(tiling(q, 8192, true), 128, 192));
  }
  // Dropout keeps two consumers on the narrow blocks.
  CHECK(is(tiling(3072, 8192, false, true), 128, 128));
  // The other head dims keep two consumers; d = 128's long keys take 160-key blocks.
  CHECK(is(tiling(3072, 8192, false, false, 128), 128, 160));
  CHECK(is(tiling(3072, 8192, false, false, 256), 128, 64));
  // Below the persistent step (ladder steps 2-4) d = 64's long keys keep two consumers and 192 keys.
  CHECK(fa3::forward_choice(64, 3072, 8192, false, false, 4).consumers == 2);
  CHECK(fa3::forward_consumers(64, true, false) == 2);
  CHECK(fa3::block_cols(64, true, fa3::forward_consumers(64, true, false)) == 192);
  // The timeline build has every forward but the three-consumer ones.
  for (int step = 1; step <= 7; ++step) {
    CAPTURE(step);
    CHECK(fa3::forward_timeline_records(64, 2048, 2048, false, step) == (step < 5));
    CHECK(fa3::forward_timeline_records(64, 384, 384, true, step) == (step < 5));
    CHECK(fa3::forward_timeline_records(64, 256, 2048, false, step));
    CHECK(fa3::forward_timeline_records(128, 2048, 8192, false, step));
  }
  // The model counts tiles of 192 query rows: N = 8k at H = 16 is 16 x ceil(8192 / 192) = 16 x 43.
  const GpuForwardPass pass = gpu_forward_pass("cuda-fa3-ws", problem(8192, 64), find_gpu("h100"));
  CHECK(pass.tiling.Br == 192);
  CHECK(pass.tiling.Bc == 128);
  CHECK(pass.kernels[0].units == 16 * 43);
}

TEST_CASE("cuda-naive's softmax reads each row of S three times: from the L2 while the rows in flight fit it") {
  // 330 units of 16 rows are resident (5 blocks of 8 rows on each of 132 SMs): 5280 rows of N fp32.
  for (const int n : {512, 4096}) {
    CAPTURE(n);
    const Problem p = problem(n, 64);
    const GpuTraffic t = model("cuda-naive", p);
    const I64 s_bytes = I64{16} * n * n * 4;
    CHECK(rd(t.two_level, TensorId::S) == 3 * s_bytes);
    const double reads = double(rd(t.dram, TensorId::S)) / double(s_bytes);
    // 5280 rows of N fp32 in flight, spread over the two partitions: 10 MiB at N = 512, 86 MiB at 4k.
    CHECK(reads == doctest::Approx(n == 512 ? 1.0 : 3.0).epsilon(0.05));
    CHECK(t.kernels.size() == 3);
  }
  // Causal: the row loops stop at the last visible key, so about half of S is read (P is written whole).
  const Problem causal = problem(4096, 64, CausalAlign::TopLeft);
  const GpuTraffic t = model("cuda-naive", causal);
  const double s_bytes = 16.0 * 4096 * 4096 * 4;
  const double visible = double(rd(t.two_level, TensorId::S)) / (3 * s_bytes);  // whole tiles of 256 keys: 0.53
  CHECK(visible > 0.5);
  CHECK(visible < 0.55);
}

TEST_CASE("cuda-fa1: line 2's stores leave O, l and m in the L2, so the first K/V block reads them from there") {
  // d = 64, N = 1k: a head's Q and O are 256 KiB each, and the 16 heads fit the L2 many times over. fa1.cu
  // stores O = 0, l = 0, m = -inf before its loops, so its loads of O_i, l_i, m_i at j = 0 hit: DRAM reads
  // are Q, K and V once. After its loops it reads l and m again to write L.
  const Problem p = problem(1024, 64);
  const GpuTraffic t = model("cuda-fa1", p, h100_lru());
  CHECK(t.dram.total_read() == qkv_bytes(p, 4));
  CHECK(double(model("cuda-fa1", p).dram.total_read()) == doctest::Approx(double(qkv_bytes(p, 4))).epsilon(1e-4));
  const I64 o_bytes = I64{16} * 1024 * 64 * 4, row_bytes = I64{16} * 1024 * 4;
  const I64 Tc = 1024 / cuda::fa1::forward_tiling(64).Bc;
  CHECK(rd(t.two_level, TensorId::O) == Tc * o_bytes);  // the nest's loads, as the paper counts them
  CHECK(t.two_level.written[static_cast<int>(TensorId::O)] == (Tc + 1) * o_bytes);  // and line 2's store
  CHECK(rd(t.two_level, TensorId::m) == (Tc + 1) * row_bytes);
  CHECK(t.two_level.written[static_cast<int>(TensorId::LSE)] == row_bytes);
}

TEST_CASE("the kernels' grids come from the data they export") {
  const Problem p = problem(1000, 128, CausalAlign::None, 2, 4);
  const GpuForwardPass fa2 = gpu_forward_pass("cuda-fa2", p, find_gpu("h100"));
  const cuda::KernelTiling t = cuda::fa2::forward_tiling(128);
  CHECK(fa2.tiling.Br == t.Br);
  CHECK(fa2.tiling.Bc == t.Bc);
  REQUIRE(fa2.kernels.size() == 1);
  CHECK(fa2.kernels[0].units == 2 * 4 * 8);  // ceil(1000 / 128) query blocks per head
  CHECK(fa2.kernels[0].blocks_per_sm == t.blocks_per_sm);
  const GpuForwardPass fa3 = gpu_forward_pass("cuda-fa3-ws", p, find_gpu("h100"));
  CHECK(fa3.kernels[0].grid_blocks == 2 * 4 * 8);  // fewer tiles than SMs: one block each
  CHECK(gpu_forward_pass("cuda-fa3-ws", problem(8192, 64), find_gpu("h100")).kernels[0].grid_blocks == 132);
  const GpuForwardPass fa1 = gpu_forward_pass("cuda-fa1", p, find_gpu("h100"));
  CHECK(fa1.kernels[0].units == 8);
  CHECK(fa1.kernels[0].blocks_per_sm == cuda::fa1::forward_tiling(128).blocks_per_sm);
  Problem gqa = problem(256, 64, CausalAlign::None, 2, 4);
  gqa.shape.heads_kv = 2;
  CHECK(gpu_forward_pass("cuda-naive", gqa, find_gpu("h100")).kernels.size() == 2 * 2 + 1 + 2 * 2);
  CHECK(gpu_modeled_variants() == std::vector<std::string>{"cuda-naive", "cuda-fa1", "cuda-fa2", "cuda-fa3-ws"});
}

TEST_CASE("a variant without a GPU tiling, or a head dim the kernel lacks: one sentence") {
  CHECK_THROWS_WITH_AS(gpu_forward_pass("cpu-fa2", problem(128, 64), find_gpu("h100")),
                       "variant cpu-fa2 has no GPU tiling for the traffic model: cuda-naive, cuda-fa1, cuda-fa2 and "
                       "cuda-fa3-ws have one",
                       InputError);
  CHECK_THROWS_WITH_AS(gpu_forward_pass("cuda-fa2", problem(128, 80), find_gpu("h100")),
                       "variant cuda-fa2 does not support head_dim 80: it supports head dims 32, 64, 96, 128, 256",
                       InputError);
  CHECK_THROWS_WITH_AS(gpu_forward_pass("cuda-fa3-ws", problem(128, 32), find_gpu("h100")),
                       "variant cuda-fa3-ws does not support head_dim 32: it supports head dims 64, 128, 256", InputError);
}

TEST_CASE("a malformed counters file is refused with one sentence naming the file") {
  CHECK_THROWS_WITH_AS(parse_dram_counters("{", "x.json"), doctest::Contains("x.json is not valid JSON"), InputError);
  CHECK_THROWS_WITH_AS(parse_dram_counters("{\"runs\": []}", "x.json"),
                       "x.json has no \"device\"; record the file with scripts/record_dram_counters.sh", InputError);
  const std::string run = R"({"variant": "cuda-fa2", "dtype": "bf16", "batch": 1, "heads": 16, "seq": 1024,
      "head_dim": 64, "causal": "none", "dram_read_bytes": 10, "dram_write_bytes": 2,
      "kernels": [{"name": "k", "grid_size": 128, "dram_read_bytes": 10, "dram_write_bytes": 2}]})";
  const DramCounters ok = parse_dram_counters(R"({"device": "NVIDIA H100 80GB HBM3", "runs": [)" + run + "]}", "x.json");
  REQUIRE(ok.runs.size() == 1);
  CHECK(ok.runs[0].shape.seq_k == 1024);
  CHECK(ok.runs[0].kernels[0].blocks_per_sm == 0);
  std::string bad = run;
  bad.replace(bad.find("\"seq\": 1024"), 11, "\"seq\": -4");
  CHECK_THROWS_WITH_AS(parse_dram_counters(R"({"device": "d", "runs": [)" + bad + "]}", "x.json"),
                       "x.json, run 0: \"seq\" is -4, not a non-negative integer", InputError);
  bad = run;
  bad.replace(bad.find("\"none\""), 6, "\"maybe\"");
  CHECK_THROWS_WITH_AS(parse_dram_counters(R"({"device": "d", "runs": [)" + bad + "]}", "x.json"),
                       doctest::Contains("x.json, run 0: unknown causal alignment 'maybe'"), InputError);
  CHECK_THROWS_WITH_AS(read_dram_counters("/nonexistent/h100-dram-counters.json"),
                       "cannot read the DRAM counters file /nonexistent/h100-dram-counters.json", InputError);
}
