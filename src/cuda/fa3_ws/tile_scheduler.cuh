#pragma once
// cuda-fa3-ws forward, its tile scheduler: which (batch, head, query block) a block works on, in what order
// the grid takes them, and the persistent grid's global tile counter.
#include "core/mask.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/tilings.hpp"

namespace flashlab::cuda::fa3_ws {


// A tile is Br query rows of one (batch, query head): (b, h) and the first row.
struct Tile {
  int b, h, h_kv, row0;
  int n_blocks;  // K/V blocks that hold a visible key for some row of the tile (never a fully masked one)
};

// Tile numbers, in the order the grid takes them. Within a (batch, head) the last query blocks come first:
// they see the most keys under a causal mask.
//  * One tile per block (steps 1-4): tile = blockIdx.x, query blocks fastest or heads fastest
//    (Schedule::kQueryBlocksFastest).
//  * Persistent (step 5): tiles are handed out one at a time from a global counter (the producer fetches
//    the next number while it loads the current tile), so a block that drew light tiles under a causal mask
//    simply takes more of them. They are numbered in groups of p.heads_per_group heads, as many as have
//    their K and V fit in half the L2 (four times as many under a causal mask over long keys:
//    launch_config), and within a group heaviest query block first, heads fastest: the ~132 tiles in
//    flight read the K/V of a few heads, and the light tiles come last, where they fill the gaps of the
//    tail (longest processing time first). Why not a static round-robin: over a query-block-fastest order
//    it gives some blocks only heavy tiles, over a heads-fastest order it spreads the blocks in flight over
//    ~132 heads whose K/V then come from HBM each time (bench/results/h100-fa3-ws-notes.md measures both).
enum class TileOrder { HeadsFastest, MFast, L2Groups };

template <class Sched, bool kPersistent>
constexpr TileOrder tile_order() {
  if constexpr (kPersistent) return TileOrder::L2Groups;
  else return Sched::kQueryBlocksFastest ? TileOrder::MFast : TileOrder::HeadsFastest;
}

template <int kBr, int kBc, TileOrder kOrder>
__device__ __forceinline__ Tile make_tile(const Params& p, int t) {
  const int bh_total = p.batch * p.heads_q;
  const int num_m = (p.seq_q + kBr - 1) / kBr;
  int m_back = 0, bh = 0;  // query block counted from the last one; (batch, head)
  if constexpr (kOrder == TileOrder::MFast) {
    m_back = t % num_m;
    bh = t / num_m;
  } else if constexpr (kOrder == TileOrder::HeadsFastest) {
    m_back = t / bh_total;
    bh = t % bh_total;
  } else {
    const TileAt at = tile_at(t, num_m, bh_total, p.heads_per_group);  // cuda/tilings.hpp
    m_back = num_m - 1 - at.query_block;
    bh = at.bh;
  }
  Tile tile;
  tile.b = bh / p.heads_q;
  tile.h = bh % p.heads_q;
  tile.h_kv = tile.h / (p.heads_q / p.heads_kv);
  tile.row0 = (num_m - 1 - m_back) * kBr;
  const int last_row = min(tile.row0 + kBr, p.seq_q) - 1;
  const int last_key = last_visible_key(p.align, last_row, p.seq_q, p.seq_k);
  tile.n_blocks = last_key < 0 ? 0 : last_key / kBc + 1;
  return tile;
}

// The persistent grid's tile counter (p.tile_counter: the next tile to hand out beyond the first
// gridDim.x, and the blocks that have finished). The last block to finish sets both back to 0, so the
// next launch on the same counter starts from zero without a memset.
__device__ __forceinline__ int fetch_next_tile(const Params& p) {
  return atomicAdd(&p.tile_counter[0], 1) + static_cast<int>(gridDim.x);
}
__device__ __forceinline__ void finish_tiles(const Params& p) {
  if (atomicAdd(&p.tile_counter[1], 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(&p.tile_counter[0], 0);
    atomicExch(&p.tile_counter[1], 0);
  }
}

}  // namespace flashlab::cuda::fa3_ws
