// cuda-fa3-ws backward, what ships: launch_backward (f16 and bf16, d = 64, 128, 256, with and without dropout, and
// the fp32-accumulating build of a ring's block), launch_backward_timeline (the timeline hook compiled in) and the
// scratch sizes. The kernel and its parts are in backward_kernel.cuh, which says what the design is and why.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/dispatch.cuh"
#include "cuda/fa3_ws/backward_config.cuh"
#include "cuda/fa3_ws/backward_scheduler.cuh"
#include "cuda/fa3_ws/backward_prepass.cuh"
#include "cuda/fa3_ws/backward_kernel.cuh"
#include "cuda/fa3_ws/convert_dq.cuh"
#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "cuda/fa3_ws/head_dims.hpp"
#include "cuda/fa3_ws/host_checks.hpp"

namespace flashlab::cuda::fa3_ws {
namespace {

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false, int kC = kConsumers>
void launch_config(DType dtype, const Params& p, cudaStream_t stream) {
  using Cfg = BwdConfig<D, kDropout, kC>;
  const int n_q = (p.seq_q + Cfg::kBr - 1) / Cfg::kBr;
  const BackwardScratchSizes sizes = backward_scratch(p.batch, p.heads_q, p.seq_q, D);
  constexpr int kStatsThreads = 256;
  row_stats_kernel<T, D><<<static_cast<unsigned>((sizes.row_stats * (D / 8) + kStatsThreads - 1) / kStatsThreads), kStatsThreads, 0, stream>>>(
      p, n_q * Cfg::kBr);
  check_cuda(cudaGetLastError(), "the row statistics launch");

  BwdMaps maps;
  maps.q = make_bshd_tensor_map(p.q, dtype, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.d_o = make_bshd_tensor_map(p.d_o, dtype, p.batch, p.seq_q, p.heads_q, D, Cfg::kBr);
  maps.k = make_bshd_tensor_map(p.k, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  maps.v = make_bshd_tensor_map(p.v, dtype, p.batch, p.seq_k, p.heads_kv, D, Cfg::kBc);
  auto kernel = fa3_ws_backward_kernel<T, D, kDropout, kTimeline, kAccumulate, kC>;
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Cfg::kBytes);
  const dim3 grid((p.seq_k + Cfg::kBc - 1) / Cfg::kBc, p.batch * p.heads_kv * p.group_splits);
  kernel<<<grid, Cfg::kThreads, Cfg::kBytes, stream>>>(p, maps);
  check_cuda(cudaGetLastError(), "the backward kernel launch");

  // The conversion may start once every block of the main kernel has (griddepcontrol.launch_dependents there):
  // enough blocks to fill the GPU, each taking pieces until none are left.
  const std::int64_t resident =
      std::int64_t(current_gpu().sms) * blocks_per_sm(reinterpret_cast<const void*>(convert_dq_kernel<T, D, kC>), kConvertThreads);
  cudaLaunchConfig_t config{};
  const std::int64_t pieces = sizes.semaphores - 1;
  config.gridDim = dim3(static_cast<unsigned>(std::min<std::int64_t>(pieces, resident)));
  config.blockDim = dim3(kConvertThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &overlap;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, convert_dq_kernel<T, D, kC>, p, n_q), "the dQ conversion launch");
}

// The launcher of both builds: kTimeline = false, launch_backward; true, launch_backward_timeline.
template <bool kTimeline>
void launch(DType dtype, const Params& p, cudaStream_t stream) {
  expect(dtype == DType::F16 || dtype == DType::BF16, "the backward's inputs are f16 or bf16");
  expect(lists_head_dim<kBackwardHeadDims>(p.head_dim), [&] {
    return "the backward's head dim is one of " + listed_head_dims<kBackwardHeadDims>() + ", not " +
           std::to_string(p.head_dim);
  });
  expect(on_hopper(), "the GPU has compute capability 9.0");
  expect(std::int64_t(p.batch) * p.heads_kv <= kMaxBackwardRows,
         [] { return "at most " + std::to_string(kMaxBackwardRows) + " rows of thread blocks (batch x heads_kv)"; });
  expect(p.heads_kv > 0 && p.heads_q % p.heads_kv == 0 && p.group_splits >= 1 &&
             (p.heads_q / p.heads_kv) % p.group_splits == 0,
         "group_splits divides the query heads per K/V head");
  expect(std::int64_t(p.batch) * p.heads_kv * p.group_splits <= kMaxBackwardRows, [] {
    return "at most " + std::to_string(kMaxBackwardRows) + " rows of thread blocks (batch x heads_kv x group_splits)";
  });
  expect(p.group_splits == 1 || (p.dk_partial != nullptr && p.dv_partial != nullptr && p.kv_tickets != nullptr),
         "a backward with group_splits > 1 has dk_partial, dv_partial and kv_tickets (sizes from backward_split)");
  expect(p.lse_log2 != nullptr && p.D_i != nullptr && p.dq_accum != nullptr && p.dq_semaphore != nullptr,
         "the backward has its scratch (lse_log2, D_i, dq_accum and dq_semaphore; sizes from backward_scratch)");
  const int sums = (p.dq_sum != nullptr) + (p.dk_sum != nullptr) + (p.dv_sum != nullptr);
  expect(sums == 0 || sums == 3, "the backward accumulates into fp32 sums with all three of dq_sum, dk_sum and dv_sum "
                                 "set, or none");
  expect(sums == 0 || p.group_splits == 1, "a ring's block (fp32 sums) takes each group whole (group_splits 1)");
  expect(sums == 0 || !(p.dropout || kTimeline), "the backward accumulates into fp32 sums only without dropout and "
                                                 "outside the timeline build (a ring's block has neither)");
  expect(reinterpret_cast<std::uintptr_t>(p.o) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.d_o) % 16 == 0,
         "O and dO, read in 16-byte vectors, start at 16-byte aligned addresses");
  expect(p.consumers == 2 || (p.consumers == 3 && backward_max_consumers(p.head_dim) == 3), [&] {
    return "the backward runs 2 consumer warpgroups, or 3 at d = 64 (Params::consumers, from backward_plan), not " +
           std::to_string(p.consumers) + " at d = " + std::to_string(p.head_dim);
  });
  expect(p.consumers == 2 || !(kTimeline || sums != 0), "the backward's timeline build and a ring's block (fp32 sums) "
                                                         "run 2 consumer warpgroups (backward_plan with timeline set)");
  if (p.seq_q == 0 || p.seq_k == 0 || p.batch == 0 || p.heads_q == 0) return;
  with_element(dtype, [&]<class T>() {
    dispatch_head_dim<kBackwardHeadDims>(p.head_dim, "cuda-fa3-ws backward", [&]<int D>() {
      if constexpr (kTimeline) {
        launch_config<T, D, false, true>(dtype, p, stream);  // checked: no dropout, two consumers
      } else if (p.dk_sum != nullptr) {
        launch_config<T, D, false, false, true>(dtype, p, stream);  // a ring's block (checked: two consumers)
      } else if (p.consumers == 3) {
        if constexpr (backward_max_consumers(D) == 3) {  // (checked: only there)
          if (p.dropout) launch_config<T, D, true, false, false, 3>(dtype, p, stream);
          else launch_config<T, D, false, false, false, 3>(dtype, p, stream);
        }
      } else if (p.dropout) {
        launch_config<T, D, true, false>(dtype, p, stream);
      } else {
        launch_config<T, D, false, false>(dtype, p, stream);
      }
    });
  });
}

}  // namespace

BackwardScratchSizes backward_scratch(int batch, int heads_q, int seq_q, int head_dim) {
  const std::int64_t br = backward_block_rows(head_dim);
  const std::int64_t n_q = (seq_q + br - 1) / br;
  BackwardScratchSizes sizes;
  sizes.row_stats = std::int64_t(batch) * heads_q * n_q * br;
  sizes.dq_accum = sizes.row_stats * head_dim;
  sizes.semaphores = std::int64_t(batch) * heads_q * n_q * dq_pieces(head_dim) + 1;  // a counter per piece, the ticket
  return sizes;
}

namespace {
// The thread blocks of a backward with one per K/V block and (batch, K/V head), and the fewest that give every SM two.
std::int64_t key_blocks(int batch, int heads_kv, int seq_k, int head_dim, int consumers) {
  const int bc = backward_block_keys(head_dim, consumers);
  return std::int64_t(batch) * heads_kv * ((seq_k + bc - 1) / bc);
}
std::int64_t blocks_to_fill(int sms) { return 2 * std::int64_t(sms); }
BackwardSplit split_of(int batch, int heads_kv, int seq_k, int head_dim, int consumers, int splits) {
  BackwardSplit split;
  if (splits == 1) return split;
  split.group_splits = splits;
  split.partials = std::int64_t(splits) * batch * seq_k * heads_kv * head_dim;
  split.tickets = key_blocks(batch, heads_kv, seq_k, head_dim, consumers) * consumers * kWarpsPerWarpgroup;
  return split;
}
}  // namespace

BackwardSplit backward_split(int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int sms, int consumers) {
  if (batch <= 0 || heads_kv <= 0 || heads_q % heads_kv != 0 || seq_k <= 0 || head_dim <= 0 || sms <= 0) return {};
  const int group = heads_q / heads_kv;
  const std::int64_t blocks = key_blocks(batch, heads_kv, seq_k, head_dim, consumers);
  const std::int64_t wanted = blocks_to_fill(sms);
  if (blocks >= wanted) return {};
  int splits = group;
  for (int s = 2; s < group; ++s)
    if (group % s == 0 && blocks * s >= wanted) {
      splits = s;
      break;
    }
  if (std::int64_t(batch) * heads_kv * splits > kMaxBackwardRows) return {};
  return split_of(batch, heads_kv, seq_k, head_dim, consumers, splits);
}

bool backward_key_blocks_outer(bool causal, int batch, int heads_kv, int seq_k, int head_dim, int sms, int consumers) {
  if (!causal || batch <= 0 || heads_kv <= 0 || seq_k <= 0 || head_dim <= 0 || sms <= 0) return false;
  return key_blocks(batch, heads_kv, seq_k, head_dim, consumers) < blocks_to_fill(sms);
}

namespace {
// The plan's estimate, its two constants fitted to measured backward times of three consumers over two, at the FA2
// setting and at a Llama's grouped-query shape (bench/results/h100-fa3-ws-backward-notes.md, its section on three
// consumers, has the rows and the fit): three consumers cover a block's keys in kThreeConsumersTimePerKey of two
// consumers' time a key, and a thread block's fixed cost (K_j, V_j in, the pipeline's first step, dK_j and dV_j out,
// its place in the launch) weighs kFixedSteps steps. Three consumers must beat two by the margin, launching K/V
// block by K/V block must beat row by row by its own, and under a causal mask a replayed grid of two consumers must
// beat the fill rule's (backward_split, backward_key_blocks_outer) by kGridMargin.
constexpr double kThreeConsumersTimePerKey = 0.88;
constexpr double kFixedSteps = 8.0;
constexpr double kThreeConsumersMargin = 0.97;
constexpr double kOrderMargin = 0.98;
constexpr double kGridMargin = 0.98;
constexpr int kRowSharers = 8;
// Estimates beyond this many thread blocks take the even share (the replay would take longer than it is worth, and
// the last blocks weigh little there).
constexpr std::int64_t kReplayedBlocks = 8192;

// The estimated time of a backward launched with `consumers`, `splits` and its order, in steps of two consumers:
// the thread blocks in launch order, each to the SM that frees first (a min-heap of the SMs' finishing times).
double estimated_time(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, CausalAlign align,
                      int consumers, int splits, bool key_blocks_outer, int sms) {
  const int bc = backward_block_keys(head_dim, consumers), br = backward_block_rows(head_dim);
  const int n_kv = (seq_k + bc - 1) / bc, n_q = (seq_q + br - 1) / br;
  const std::int64_t rows = std::int64_t(batch) * heads_kv * splits;
  const double per_step = (consumers == 3 ? kThreeConsumersTimePerKey : 1.0) * consumers / kConsumers;
  const int heads = heads_q / heads_kv / splits;
  std::vector<double> block_time(static_cast<std::size_t>(n_kv));
  double total = 0, longest = 0;
  for (int j = 0; j < n_kv; ++j) {
    const int first_row = first_row_seeing_key(align, j * bc, seq_q, seq_k);
    const int n_i = first_row < seq_q ? n_q - first_row / br : 0;
    block_time[static_cast<std::size_t>(j)] = (heads * n_i + kFixedSteps) * per_step;
    total += block_time[static_cast<std::size_t>(j)] * static_cast<double>(rows);
    longest = std::max(longest, block_time[static_cast<std::size_t>(j)]);
  }
  if (rows * n_kv > kReplayedBlocks) return std::max(total / sms, longest);
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int s = 0; s < sms; ++s) free_at.push(0.0);
  double end = 0;
  const auto launch = [&](int j) {
    const double start = free_at.top();
    free_at.pop();
    free_at.push(start + block_time[static_cast<std::size_t>(j)]);
    end = std::max(end, start + block_time[static_cast<std::size_t>(j)]);
  };
  if (key_blocks_outer) {
    for (int j = 0; j < n_kv; ++j)
      for (std::int64_t r = 0; r < rows; ++r) launch(j);
  } else {
    for (std::int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < n_kv; ++j) launch(j);
  }
  return end;
}

// The shortest estimate among the grids of `consumers`: each split of the group, launched row by row, or K/V block by
// K/V block where that is estimated shorter by kOrderMargin. The estimate does not see the L2: row by row, the thread
// blocks running at once share a few heads' Q_i, dO_i and dQ sums; block by block they share them only where there are
// few rows. So the second order is weighed only under a mask, and only where at least kRowSharers of a row's blocks
// run at once (with many rows it was measured slower: the notes above).
struct EstimatedGrid {
  BackwardPlan plan;
  double time = 0;
  bool found = false;  // false: every split has more rows than a grid holds
};
EstimatedGrid shortest_grid(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, CausalAlign align,
                            int consumers, int sms) {
  const bool causal = align != CausalAlign::None;
  EstimatedGrid best;
  const int group = heads_q / heads_kv;
  for (int s = 1; s <= group; ++s) {
    const std::int64_t rows = std::int64_t(batch) * heads_kv * s;
    if (group % s != 0 || rows > kMaxBackwardRows) continue;
    const double by_rows =
        estimated_time(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, consumers, s, false, sms);
    const double by_keys =
        causal && rows * kRowSharers <= sms
            ? estimated_time(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, consumers, s, true, sms)
            : by_rows;
    const bool keys_outer = by_keys < kOrderMargin * by_rows;
    const double t = keys_outer ? by_keys : by_rows;
    if (!best.found || t < best.time) {
      best.found = true;
      best.time = t;
      best.plan.consumers = consumers;
      best.plan.split = split_of(batch, heads_kv, seq_k, head_dim, consumers, s);
      best.plan.key_blocks_outer = keys_outer;
    }
  }
  return best;
}

BackwardPlan plan_backward(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, CausalAlign align,
                           bool timeline, int sms, int consumers) {
  const bool causal = align != CausalAlign::None;
  // Two consumers start from the fill rule: backward_split's splits, backward_key_blocks_outer's order.
  BackwardPlan two;
  two.split = backward_split(batch, heads_q, heads_kv, seq_k, head_dim, sms);
  two.key_blocks_outer = backward_key_blocks_outer(causal, batch, heads_kv, seq_k, head_dim, sms);
  if (batch <= 0 || heads_kv <= 0 || heads_q % heads_kv != 0 || seq_q <= 0 || seq_k <= 0 || sms <= 0) return two;
  double two_time = estimated_time(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, 2, two.split.group_splits,
                                   two.key_blocks_outer, sms);
  // Under a causal mask the rule fills the GPU but does not weigh the blocks' unequal lengths: at a Llama's 16 query
  // heads on 4 K/V heads it shares each group among more thread blocks than the fastest grid does (at 4k four where
  // two are faster, at 8k two where whole groups are; h100-fa3-ws-backward-notes.md, its section on two consumers'
  // replayed grids, has the race). There the replay's shortest grid of two consumers replaces the rule's where it is
  // estimated shorter by kGridMargin. (Without a mask every block is as long, and the rule's grid stands: the replay
  // was not raced there.)
  if (causal) {
    const EstimatedGrid replayed = shortest_grid(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, 2, sms);
    if (replayed.found && replayed.time < kGridMargin * two_time) {
      two = replayed.plan;
      two_time = replayed.time;
    }
  }
  if (timeline || consumers == 2 || backward_max_consumers(head_dim) < 3) return two;
  const EstimatedGrid three = shortest_grid(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, 3, sms);
  if (!three.found) return two;  // (the launcher refuses the problem)
  if (consumers == 3) return three.plan;
  return three.time < kThreeConsumersMargin * two_time ? three.plan : two;
}
}  // namespace

BackwardPlan backward_grid(int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int consumers, int group_splits,
                           bool key_blocks_outer) {
  expect(consumers == 2 || (consumers == 3 && backward_max_consumers(head_dim) == 3),
         [&] { return "the backward runs 2 consumer warpgroups, or 3 at d = 64, not " + std::to_string(consumers) +
                      " at d = " + std::to_string(head_dim); });
  expect(heads_kv > 0 && heads_q % heads_kv == 0 && group_splits >= 1 && (heads_q / heads_kv) % group_splits == 0,
         [&] { return "a backward grid's group splits divide the query heads per K/V head (" +
                      std::to_string(heads_kv > 0 ? heads_q / heads_kv : 0) + "), not " + std::to_string(group_splits); });
  BackwardPlan grid;
  grid.consumers = consumers;
  grid.split = split_of(batch, heads_kv, seq_k, head_dim, consumers, group_splits);
  grid.key_blocks_outer = key_blocks_outer;
  return grid;
}

BackwardPlan backward_plan(int batch, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, CausalAlign align,
                           bool timeline, int sms, int consumers) {
  expect(consumers == 0 || consumers == 2 || (consumers == 3 && backward_max_consumers(head_dim) == 3),
         [&] { return "the backward runs 2 consumer warpgroups, or 3 at d = 64, not " + std::to_string(consumers) +
                      " at d = " + std::to_string(head_dim); });
  // The estimate replays up to kReplayedBlocks launches: kept per problem, since a training step asks for the same
  // few problems on every call.
  using Key = std::tuple<int, int, int, int, int, int, CausalAlign, bool, int, int>;
  static std::mutex mutex;
  static std::map<Key, BackwardPlan> plans;
  const Key key{batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, timeline, sms, consumers};
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto found = plans.find(key); found != plans.end()) return found->second;
  if (plans.size() >= 4096) plans.clear();
  return plans[key] = plan_backward(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, align, timeline, sms, consumers);
}

void launch_backward(DType dtype, const Params& p, cudaStream_t stream) { launch<false>(dtype, p, stream); }

void launch_backward_timeline(DType dtype, const Params& p, cudaStream_t stream) {
  expect(!p.dropout, "the backward's timeline build runs without dropout");
  expect(p.timeline == nullptr || (p.timeline_count != nullptr && p.timeline_capacity > 0),
         "the backward's timeline build has a record counter and a capacity above 0 beside the record buffer");
  launch<true>(dtype, p, stream);
}

}  // namespace flashlab::cuda::fa3_ws
