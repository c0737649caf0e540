// cuda-fa3-ws backward, what ships: launch_backward (f16 and bf16, d = 64, 128, 256, with and without dropout, and
// the fp32-accumulating build of a ring's block), launch_backward_timeline (the timeline hook compiled in) and the
// scratch sizes. The kernel and its parts are in backward_kernel.cuh, which says what the design is and why.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

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

template <class T, int D, bool kDropout, bool kTimeline, bool kAccumulate = false>
void launch_config(DType dtype, const Params& p, cudaStream_t stream) {
  using Cfg = BwdConfig<D, kDropout>;
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
  auto kernel = fa3_ws_backward_kernel<T, D, kDropout, kTimeline, kAccumulate>;
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Cfg::kBytes);
  const dim3 grid((p.seq_k + Cfg::kBc - 1) / Cfg::kBc, p.batch * p.heads_kv * p.group_splits);
  kernel<<<grid, Cfg::kThreads, Cfg::kBytes, stream>>>(p, maps);
  check_cuda(cudaGetLastError(), "the backward kernel launch");

  // The conversion may start once every block of the main kernel has (griddepcontrol.launch_dependents there):
  // enough blocks to fill the GPU, each taking pieces until none are left.
  const std::int64_t resident =
      std::int64_t(current_gpu().sms) * blocks_per_sm(reinterpret_cast<const void*>(convert_dq_kernel<T, D>), kConvertThreads);
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
  check_cuda(cudaLaunchKernelEx(&config, convert_dq_kernel<T, D>, p, n_q), "the dQ conversion launch");
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
  if (p.seq_q == 0 || p.seq_k == 0 || p.batch == 0 || p.heads_q == 0) return;
  with_element(dtype, [&]<class T>() {
    dispatch_head_dim<kBackwardHeadDims>(p.head_dim, "cuda-fa3-ws backward", [&]<int D>() {
      if constexpr (kTimeline) launch_config<T, D, false, true>(dtype, p, stream);  // checked: no dropout
      else if (p.dropout) launch_config<T, D, true, false>(dtype, p, stream);
      else if (p.dk_sum != nullptr) launch_config<T, D, false, false, true>(dtype, p, stream);  // a ring's block
      else launch_config<T, D, false, false>(dtype, p, stream);
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
std::int64_t key_blocks(int batch, int heads_kv, int seq_k, int head_dim) {
  return std::int64_t(batch) * heads_kv * ((seq_k + backward_block_keys(head_dim) - 1) / backward_block_keys(head_dim));
}
std::int64_t blocks_to_fill(int sms) { return 2 * std::int64_t(sms); }
}  // namespace

BackwardSplit backward_split(int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int sms) {
  BackwardSplit split;
  if (batch <= 0 || heads_kv <= 0 || heads_q % heads_kv != 0 || seq_k <= 0 || head_dim <= 0 || sms <= 0) return split;
  const int group = heads_q / heads_kv;
  const std::int64_t blocks = key_blocks(batch, heads_kv, seq_k, head_dim);
  const std::int64_t wanted = blocks_to_fill(sms);
  if (blocks >= wanted) return split;
  int splits = group;
  for (int s = 2; s < group; ++s)
    if (group % s == 0 && blocks * s >= wanted) {
      splits = s;
      break;
    }
  if (splits == 1 || std::int64_t(batch) * heads_kv * splits > kMaxBackwardRows) return split;
  split.group_splits = splits;
  split.partials = std::int64_t(splits) * batch * seq_k * heads_kv * head_dim;
  split.tickets = blocks * backward_consumers(head_dim) * kWarpsPerWarpgroup;
  return split;
}

bool backward_key_blocks_outer(bool causal, int batch, int heads_kv, int seq_k, int head_dim, int sms) {
  if (!causal || batch <= 0 || heads_kv <= 0 || seq_k <= 0 || head_dim <= 0 || sms <= 0) return false;
  return key_blocks(batch, heads_kv, seq_k, head_dim) < blocks_to_fill(sms);
}

void launch_backward(DType dtype, const Params& p, cudaStream_t stream) { launch<false>(dtype, p, stream); }

void launch_backward_timeline(DType dtype, const Params& p, cudaStream_t stream) {
  expect(!p.dropout, "the backward's timeline build runs without dropout");
  expect(p.timeline == nullptr || (p.timeline_count != nullptr && p.timeline_capacity > 0),
         "the backward's timeline build has a record counter and a capacity above 0 beside the record buffer");
  launch<true>(dtype, p, stream);
}

}  // namespace flashlab::cuda::fa3_ws
