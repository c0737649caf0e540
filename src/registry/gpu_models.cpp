// The GPU level of the traffic model for the CUDA variants (gpu_models.hpp). Each builder turns the data a
// kernel exports (cuda/tilings.hpp: tiles, warps, blocks per SM, launch order) into KernelGrids whose units
// walk their share of the one loop nest (count_part_traffic) with that kernel's tiling.
#include "registry/gpu_models.hpp"

#include <algorithm>
#include <array>

#include "core/mask.hpp"
#include "cpu_reference/tiled.hpp"
#include "cuda/constraints.hpp"
#include "cuda/tilings.hpp"
#include "model/pseudocode.hpp"

namespace flashlab {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

std::string tiles(const cuda::KernelTiling& t) {
  return "Br = " + std::to_string(t.Br) + ", Bc = " + std::to_string(t.Bc) + ", " + std::to_string(t.warps) +
         " warps, " + std::to_string(t.blocks_per_sm) + " blocks per SM";
}

void require_head_dim(std::string_view variant, int d, bool supported, const std::string& supported_dims) {
  if (!supported)
    throw InputError("variant " + std::string(variant) + " does not support head_dim " + std::to_string(d) +
                     ": it supports head dims " + supported_dims);
}

// cuda-naive's softmax reads each row of S several times (its max, its sum, then P): the walk's P phase
// reads S once per tile, so the row's S loads are replayed before it, skipping tiles the causal mask hides
// entirely (the kernel's loops stop at the row's last visible key; P is written whole).
class RepeatedRowReads : public TrafficObserver {
 public:
  RepeatedRowReads(const Problem& p, Tiling t, int reads) : p_(p), t_(t), reads_(reads) {}
  void on_event(const TileEvent& e) override { events_.push_back(e); }
  void replay(TrafficObserver& out) const {
    auto visible = [&](const TileEvent& e) {
      const int r0 = e.tile_row * t_.Br, c0 = e.tile_col * t_.Bc;
      return p_.options.causal == CausalAlign::None ||
             !tile_fully_masked(p_.options.causal, r0, r0 + e.rows, c0, p_.shape.seq_q, p_.shape.seq_k);
    };
    auto s_load = [](const TileEvent& e) { return e.tensor == TensorId::S && e.direction == Direction::Load; };
    for (int pass = 1; pass < reads_; ++pass)
      for (const TileEvent& e : events_)
        if (s_load(e) && visible(e)) out.on_event(e);
    for (const TileEvent& e : events_)
      if (!s_load(e) || visible(e)) out.on_event(e);
  }

 private:
  const Problem& p_;
  Tiling t_;
  int reads_;
  std::vector<TileEvent> events_;
};

// cuda-naive: per (batch, query head of a group), S = scale Q K^T on simple_gemm, batched over the K/V
// heads; one row softmax over every row; then per (batch, group member) O = P V. A GEMM block is a 16 x 16
// tile of C, far finer than any access worth replaying, so a unit is a row of 16 query rows: across all
// keys in K1 (ceil(S_k / 16) blocks, launched one after another: x is the grid's fastest index), across
// the d columns of O in K3 (ceil(d / 16) blocks), and two softmax blocks of 8 rows in K2. The tiles the
// walk moves are 16 rows by kColumns keys: 16 GEMM blocks wide.
GpuForwardPass naive_pass(const Problem& p, const GpuSpec&) {
  namespace u = cuda::unfused;
  constexpr int kColumns = 16 * u::kGemmTiling.Bc;
  const Shape& s = p.shape;
  require_head_dim("cuda-naive", s.head_dim, s.head_dim <= u::kMaxHeadDim, "1.." + std::to_string(u::kMaxHeadDim));
  GpuForwardPass pass;
  pass.algorithm = Algorithm::Standard;
  pass.dtype = u::kDTypes[0];
  pass.tiling = Tiling{u::kGemmTiling.Br, kColumns};
  const int bpe = dtype_bytes(pass.dtype), Tr = static_cast<int>(ceil_div(s.seq_q, pass.tiling.Br));
  const Tiling t = pass.tiling;
  auto gemm = [&](int b, int g, NestPhase phase, std::int64_t blocks_per_unit, const char* name) {
    KernelGrid k;
    k.name = std::string("simple_gemm ") + name;
    k.units = std::int64_t{s.heads_kv} * Tr;
    k.blocks_per_sm = u::kGemmTiling.blocks_per_sm;
    k.blocks_per_unit = blocks_per_unit;
    k.grid_blocks = k.units * blocks_per_unit;
    k.walk_unit = [p, t, bpe, b, g, phase, Tr](std::int64_t unit, TrafficObserver& o) {
      const int h = static_cast<int>(unit / Tr) * p.shape.group() + g;
      count_part_traffic(Algorithm::Standard, p, t, bpe,
                         NestPart{b * p.shape.heads_q + h, static_cast<int>(unit % Tr), phase}, o);
    };
    return k;
  };
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.group(); ++g)
      pass.kernels.push_back(gemm(b, g, NestPhase::Scores, ceil_div(s.seq_k, u::kGemmTiling.Bc), "S = scale Q K^T"));
  KernelGrid softmax;
  softmax.name = "softmax_forward_kernel";
  softmax.units = std::int64_t{s.batch} * s.heads_q * Tr;
  softmax.blocks_per_sm = u::kSoftmaxBlocksPerSm;
  softmax.blocks_per_unit = t.Br / u::kSoftmaxRowsPerBlock;
  softmax.grid_blocks = ceil_div(std::int64_t{s.batch} * s.heads_q * s.seq_q, u::kSoftmaxRowsPerBlock);
  softmax.walk_unit = [p, t, bpe, Tr](std::int64_t unit, TrafficObserver& o) {
    RepeatedRowReads rows(p, t, u::kSoftmaxReadsOfS);
    count_part_traffic(Algorithm::Standard, p, t, bpe,
                       NestPart{static_cast<int>(unit / Tr), static_cast<int>(unit % Tr), NestPhase::Softmax}, rows);
    rows.replay(o);
  };
  pass.kernels.push_back(softmax);
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.group(); ++g)
      pass.kernels.push_back(gemm(b, g, NestPhase::Output, ceil_div(s.head_dim, u::kGemmTiling.Bc), "O = P V"));
  pass.tiling_note = "simple_gemm " + tiles(u::kGemmTiling) + "; softmax " +
                     std::to_string(u::kSoftmaxRowsPerBlock) + " rows per block, " +
                     std::to_string(u::kSoftmaxBlocksPerSm) + " blocks per SM, reads S " +
                     std::to_string(u::kSoftmaxReadsOfS) + " times; modeled in rows of " + std::to_string(t.Br) +
                     " queries by " + std::to_string(kColumns) + " keys";
  return pass;
}

// What fa1.cu's block does around the paper's nest, at the tiles the nest uses. The nest marks line 2
// ("initialize O, l, m in HBM") as a step, not a transfer, as the paper's count does; the kernel carries it
// out as stores of O = 0, l = 0, m = -inf, through the L2, so the first K/V block's loads of O_i, l_i and m_i
// find them there, not in DRAM. After the loops it reads l and m back to write L = m + log l, which the
// backward pass and the other variants take.
class Fa1InitAndLse : public TrafficObserver {
 public:
  Fa1InitAndLse(const Problem& p, Tiling t, int bytes_per_element, int bh, TrafficObserver& out)
      : p_(p), t_(t), bpe_(bytes_per_element), bh_(bh), out_(out) {}
  void on_event(const TileEvent& e) override {
    out_.on_event(e);
    if (e.direction == Direction::Compute && e.line == lines::fa1_fwd::kInitHbm)
      for (int i = 0; i < query_blocks(); ++i) {
        emit(TensorId::O, Direction::Store, i, p_.shape.head_dim);
        emit(TensorId::l, Direction::Store, i, 1);
        emit(TensorId::m, Direction::Store, i, 1);
      }
  }
  // Call after the nest: L = m + log l, row block by row block.
  void write_lse() {
    for (int i = 0; i < query_blocks(); ++i) {
      emit(TensorId::l, Direction::Load, i, 1);
      emit(TensorId::m, Direction::Load, i, 1);
      emit(TensorId::LSE, Direction::Store, i, 1);
    }
  }

 private:
  int query_blocks() const { return static_cast<int>(ceil_div(p_.shape.seq_q, t_.Br)); }
  void emit(TensorId tensor, Direction direction, int i, int cols) {
    TileEvent e;
    e.algorithm = Algorithm::FA1;
    e.pass = Pass::Forward;
    e.bh = bh_;
    e.tensor = tensor;
    e.direction = direction;
    e.tile_row = i;
    e.rows = std::min(t_.Br, p_.shape.seq_q - i * t_.Br);
    e.cols = cols;
    e.bytes = std::int64_t{e.rows} * cols * bpe_;
    const bool initializing = direction == Direction::Store && tensor != TensorId::LSE;
    e.line = initializing ? lines::fa1_fwd::kInitHbm : lines::fa1_fwd::kReturn;
    out_.on_event(e);
  }

  const Problem& p_;
  Tiling t_;
  int bpe_, bh_;
  TrafficObserver& out_;
};

// cuda-fa1: grid (H_q, B), one block per (batch, head) walking the whole FA1 nest, with the kernel's
// stores of line 2 before it and its pass over l and m for L after it (Fa1InitAndLse).
GpuForwardPass fa1_pass(const Problem& p, const GpuSpec&) {
  const Shape& s = p.shape;
  require_head_dim("cuda-fa1", s.head_dim, s.head_dim <= cuda::simt::kMaxHeadDim,
                   "1.." + std::to_string(cuda::simt::kMaxHeadDim));
  const cuda::KernelTiling kt = cuda::fa1::forward_tiling(cuda::padded_head_dim(s.head_dim));
  GpuForwardPass pass;
  pass.algorithm = Algorithm::FA1;
  pass.dtype = cuda::simt::kDTypes[0];
  pass.tiling = Tiling{kt.Br, kt.Bc};
  const int bpe = dtype_bytes(pass.dtype);
  const Tiling t = pass.tiling;
  KernelGrid k;
  k.name = "fa1_forward_kernel";
  k.units = k.grid_blocks = std::int64_t{s.batch} * s.heads_q;
  k.blocks_per_sm = kt.blocks_per_sm;
  k.walk_unit = [p, t, bpe](std::int64_t unit, TrafficObserver& o) {
    const int bh = static_cast<int>(unit);
    Fa1InitAndLse kernel(p, t, bpe, bh, o);
    count_part_traffic(Algorithm::FA1, p, t, bpe, NestPart{bh}, kernel);
    kernel.write_lse();
  };
  pass.kernels.push_back(k);
  pass.tiling_note = tiles(kt) + "; one block per (batch, head)";
  return pass;
}

std::string listed(std::span<const int> dims) {
  std::string text;
  for (int d : dims) text += (text.empty() ? "" : ", ") + std::to_string(d);
  return text;
}

// cuda-fa2: grid (query blocks, B * H_q), x fastest, the heaviest query block first.
GpuForwardPass fa2_pass(const Problem& p, const GpuSpec&) {
  const Shape& s = p.shape;
  const auto& dims = cuda::fa2::kHeadDims;
  require_head_dim("cuda-fa2", s.head_dim, std::find(std::begin(dims), std::end(dims), s.head_dim) != std::end(dims),
                   listed(dims));
  const cuda::KernelTiling kt = cuda::fa2::forward_tiling(s.head_dim);
  GpuForwardPass pass;
  pass.algorithm = Algorithm::FA2;
  pass.dtype = cuda::fa2::kDTypes[1];  // bf16 (f16 moves the same bytes)
  pass.tiling = Tiling{kt.Br, kt.Bc};
  const int bpe = dtype_bytes(pass.dtype), Tr = static_cast<int>(ceil_div(s.seq_q, kt.Br));
  const Tiling t = pass.tiling;
  KernelGrid k;
  k.name = "forward_kernel";
  k.units = k.grid_blocks = std::int64_t{s.batch} * s.heads_q * Tr;
  k.blocks_per_sm = kt.blocks_per_sm;
  k.walk_unit = [p, t, bpe, Tr](std::int64_t unit, TrafficObserver& o) {
    const int i = cuda::fa2::forward_query_block(static_cast<int>(unit % Tr), Tr);
    count_part_traffic(Algorithm::FA2, p, t, bpe, NestPart{static_cast<int>(unit / Tr), i}, o);
  };
  pass.kernels.push_back(k);
  pass.tiling_note = tiles(kt) + "; grid (query blocks, batch * heads), heaviest query block first";
  return pass;
}

// cuda-fa3-ws (ladder step 5): a persistent grid of one block per SM; the units are its tiles, in the
// order the global counter hands them out (L2 groups of heads, heaviest query block first).
// `consumers`: 0 for the launcher's choice (forward_tiling), else that many consumer warpgroups on the K/V blocks they
// take (gpu_forward_pass_as_run).
GpuForwardPass fa3_ws_pass_with(const Problem& p, const GpuSpec& gpu, int consumers) {
  const Shape& s = p.shape;
  const auto& dims = cuda::fa3_ws::kHeadDims;
  require_head_dim("cuda-fa3-ws", s.head_dim, std::find(std::begin(dims), std::end(dims), s.head_dim) != std::end(dims),
                   listed(dims));
  cuda::fa3_ws::ForwardChoice choice = cuda::fa3_ws::forward_choice(
      s.head_dim, s.seq_q, s.seq_k, p.options.causal != CausalAlign::None, p.options.dropout_p > 0, 5);
  if (consumers > 0) choice.consumers = consumers;
  const cuda::KernelTiling kt = cuda::fa3_ws::forward_tiling(s.head_dim, choice);
  GpuForwardPass pass;
  pass.algorithm = Algorithm::FA2;
  pass.dtype = cuda::fa3_ws::kDTypes[1];  // bf16
  pass.tiling = Tiling{kt.Br, kt.Bc};
  const int bpe = dtype_bytes(pass.dtype), Tr = static_cast<int>(ceil_div(s.seq_q, kt.Br));
  const int bh_total = s.batch * s.heads_q;
  const int group = cuda::fa3_ws::heads_per_group(gpu.l2_bytes, s, bpe, p.options.causal != CausalAlign::None);
  const Tiling t = pass.tiling;
  KernelGrid k;
  k.name = "fa3_ws_kernel";
  k.units = std::int64_t{bh_total} * Tr;
  k.grid_blocks = std::min<std::int64_t>(k.units, gpu.sms);
  k.blocks_per_sm = kt.blocks_per_sm;
  k.walk_unit = [p, t, bpe, Tr, bh_total, group](std::int64_t unit, TrafficObserver& o) {
    const cuda::fa3_ws::TileAt at = cuda::fa3_ws::tile_at(static_cast<int>(unit), Tr, bh_total, group);
    count_part_traffic(Algorithm::FA2, p, t, bpe, NestPart{at.bh, at.query_block}, o);
  };
  pass.kernels.push_back(k);
  pass.tiling_note = tiles(kt) + "; persistent (one block per SM), tiles in groups of " + std::to_string(group) +
                     " heads, heaviest query block first";
  return pass;
}
GpuForwardPass fa3_ws_pass(const Problem& p, const GpuSpec& gpu) { return fa3_ws_pass_with(p, gpu, 0); }

struct Row {
  std::string_view variant;
  GpuForwardPass (*build)(const Problem&, const GpuSpec&);
};
constexpr std::array kRows = {
    Row{"cuda-naive", naive_pass},
    Row{"cuda-fa1", fa1_pass},
    Row{"cuda-fa2", fa2_pass},
    Row{"cuda-fa3-ws", fa3_ws_pass},
};

}  // namespace

std::vector<std::string> gpu_modeled_variants() {
  std::vector<std::string> names;
  for (const Row& r : kRows) names.emplace_back(r.variant);
  return names;
}

GpuForwardPass gpu_forward_pass(std::string_view variant, const Problem& p, const GpuSpec& gpu) {
  validate(p);
  for (const Row& r : kRows)
    if (r.variant == variant) {
      GpuForwardPass pass = r.build(p, gpu);
      pass.variant = std::string(variant);
      return pass;
    }
  std::string names;
  for (std::size_t n = 0; n < kRows.size(); ++n)
    names += (n == 0 ? "" : n + 1 == kRows.size() ? " and " : ", ") + std::string(kRows[n].variant);
  throw InputError("variant " + std::string(variant) + " has no GPU tiling for the traffic model: " + names +
                   " have one");
}

GpuForwardPass gpu_forward_pass_as_run(std::string_view variant, const Problem& p, const GpuSpec& gpu, int threads) {
  if (variant != "cuda-fa3-ws") return gpu_forward_pass(variant, p, gpu);
  validate(p);
  const int consumers = threads / (4 * cuda::kWarpSize) - 1;
  if (threads % (4 * cuda::kWarpSize) != 0 || consumers < 2 || consumers > 3 || (consumers == 3 && p.shape.head_dim != 64))
    throw InputError("cuda-fa3-ws never ran with " + std::to_string(threads) + " threads a block at d = " +
                     std::to_string(p.shape.head_dim) + ": its forward has a producer warpgroup and two consumer "
                     "warpgroups (384 threads), or three at d = 64 (512)");
  GpuForwardPass pass = fa3_ws_pass_with(p, gpu, consumers);
  pass.variant = std::string(variant);
  return pass;
}

}  // namespace flashlab
