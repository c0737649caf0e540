// cuda-fa3-ws's backward launch plan (cuda/fa3_ws/fa3_ws_params.hpp, backward_plan): which grid of thread blocks runs a
// problem, on a GPU of 132 SMs (an H100's or H200's). Host code: no GPU needed, so these run wherever the CUDA
// library builds, CI included. The kernels on those grids are held to the reference by gpu_fa3_ws_backward_tests.
#include <doctest/doctest.h>

#include <exception>
#include <string>

#include "core/problem.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"

namespace {

using namespace flashlab;
namespace fa3 = cuda::fa3_ws;
constexpr int kSms = 132;

std::string refusal(auto call) {
  try {
    call();
  } catch (const std::exception& e) {  // a caller's mistake, not the user's input: a logic error
    return e.what();
  }
  return "(no refusal)";
}

TEST_CASE("the fill rule: groups shared among thread blocks until every SM has two, launched K/V block first") {
  // One K/V block a (batch, K/V head) at d = 64 and 128, 132 of them: half the group a thread block is the fewest
  // that gives every SM two; and under a causal mask such a small grid launches K/V block by K/V block.
  for (int heads_q : {4, 6})
    for (int d : {64, 128}) {
      INFO("heads_q " << heads_q << ", d " << d);
      const fa3::BackwardSplit split = fa3::backward_split(kSms, heads_q, 1, 128, d, kSms);
      CHECK(split.group_splits == 2);
      CHECK(split.partials == std::int64_t(2) * kSms * 128 * 1 * d);  // per split, (batch, key, K/V head, column)
      CHECK(fa3::backward_key_blocks_outer(true, kSms, 1, 128, d, kSms));
      CHECK_FALSE(fa3::backward_key_blocks_outer(false, kSms, 1, 128, d, kSms));
    }
  // Batch 1 and long keys: enough K/V blocks, one thread block per group, launched row by row.
  CHECK(fa3::backward_split(1, 16, 4, 4 * kSms * 128, 128, kSms).group_splits == 1);
  CHECK_FALSE(fa3::backward_key_blocks_outer(true, 1, 4, 4 * kSms * 128, 128, kSms));
}

TEST_CASE("cuda-fa3-ws's backward plan: three consumers at d = 64 where the grid stays even, two elsewhere") {
  // The policy's estimates are in backward.cu; these are problems far enough from its margins that a small change of
  // its constants keeps them.
  const auto plan = [](int batch, int heads_q, int heads_kv, int seq, int d, CausalAlign align, bool timeline = false) {
    return fa3::backward_plan(batch, heads_q, heads_kv, seq, seq, d, align, timeline, 132);
  };
  // The FA2 setting (B N = 16k tokens, H d = 2048): long, even grids.
  for (CausalAlign align : {CausalAlign::None, CausalAlign::TopLeft}) {
    INFO("causal " << to_string(align));
    CHECK(plan(8, 32, 32, 2048, 64, align).consumers == 3);
    CHECK_FALSE(plan(8, 32, 32, 2048, 64, align).key_blocks_outer);  // 256 rows: row by row shares the L2
    CHECK(plan(1, 32, 32, 16384, 64, align).consumers == 3);
    CHECK(plan(1, 32, 32, 16384, 128, align).consumers == 2);  // three only at d = 64
    CHECK(plan(8, 32, 32, 2048, 64, align, /*timeline=*/true).consumers == 2);
  }
  // A Llama's attention (16 query heads on 4 K/V heads, batch 1, causal): at 2k, 192-key blocks leave 44 thread
  // blocks a group split for 132 SMs, and the first ones take most of the time; at 16k three pay once each group is
  // shared among thread blocks and the longest blocks are launched first.
  const fa3::BackwardPlan llama_2k = plan(1, 16, 4, 2048, 64, CausalAlign::TopLeft);
  CHECK(llama_2k.consumers == 2);
  CHECK(llama_2k.split.group_splits == fa3::backward_split(1, 16, 4, 2048, 64, 132).group_splits);
  const fa3::BackwardPlan llama_16k = plan(1, 16, 4, 16384, 64, CausalAlign::TopLeft);
  CHECK(llama_16k.consumers == 3);
  CHECK(llama_16k.split.group_splits > 1);
  CHECK(llama_16k.key_blocks_outer);  // (row by row, the first rows' longest blocks would end alone)
  CHECK(llama_16k.split.tickets == 4 * ((16384 + 191) / 192) * 3 * 4);  // per (K/V head, K/V block, consumer warp)
  // Two consumers at d = 128, the same attention: under the mask the replay's grids, not the fill rule's. At 4k the rule
  // shares each group among four thread blocks; half the group a block, launched K/V block by K/V block, is estimated
  // 11% shorter. At 16k a group a block, row by row. Without a mask the rule stands.
  const fa3::BackwardPlan llama_4k_d128 = plan(1, 16, 4, 4096, 128, CausalAlign::TopLeft);
  CHECK(fa3::backward_split(1, 16, 4, 4096, 128, 132).group_splits == 4);
  CHECK(llama_4k_d128.consumers == 2);
  CHECK(llama_4k_d128.split.group_splits == 2);
  CHECK(llama_4k_d128.key_blocks_outer);
  const fa3::BackwardPlan llama_16k_d128 = plan(1, 16, 4, 16384, 128, CausalAlign::TopLeft);
  CHECK(llama_16k_d128.split.group_splits == 1);
  CHECK_FALSE(llama_16k_d128.key_blocks_outer);
  CHECK(plan(1, 16, 4, 4096, 128, CausalAlign::None).split.group_splits == 4);
  // A small problem: two.
  CHECK(plan(1, 2, 2, 200, 64, CausalAlign::None).consumers == 2);
  // Asked for: three at d = 64 whatever the estimate, and a sentence elsewhere.
  CHECK(fa3::backward_plan(1, 2, 2, 200, 200, 64, CausalAlign::None, false, 132, 3).consumers == 3);
  // (the GQA case of gpu_fa3_ws_backward_tests' three-consumer test: its group is shared among thread blocks)
  CHECK(fa3::backward_plan(2, 8, 2, 200, 400, 64, CausalAlign::TopLeft, false, 132, 3).split.group_splits > 1);
  std::string d128;
  try {
    (void)fa3::backward_plan(1, 2, 2, 200, 200, 128, CausalAlign::None, false, 132, 3);
  } catch (const std::exception& e) {  // a caller's mistake, not the user's input: a logic error
    d128 = e.what();
  }
  CHECK_MESSAGE(d128.find("the backward runs 2 consumer warpgroups, or 3 at d = 64, not 3 at d = 128") != std::string::npos,
                d128);
}

TEST_CASE("a grid of the caller's: its split's scratch, and a sentence for a grid the kernel cannot run") {
  // A Llama's attention at 4k, d = 128: two consumers (Bc = 128 keys), each group of 4 query heads in two blocks.
  const fa3::BackwardPlan grid = fa3::backward_grid(1, 16, 4, 4096, 128, 2, 2, true);
  CHECK(grid.consumers == 2);
  CHECK(grid.key_blocks_outer);
  CHECK(grid.split.group_splits == 2);
  CHECK(grid.split.partials == std::int64_t(2) * 1 * 4096 * 4 * 128);
  CHECK(grid.split.tickets == std::int64_t(4) * (4096 / 128) * 2 * 4);  // per (K/V head, K/V block, consumer warp)
  // Whole groups: no partial sums.
  const fa3::BackwardPlan whole = fa3::backward_grid(1, 16, 4, 4096, 64, 3, 1, false);
  CHECK(whole.consumers == 3);
  CHECK(whole.split.group_splits == 1);
  CHECK(whole.split.partials == 0);
  CHECK(refusal([] { (void)fa3::backward_grid(1, 16, 4, 4096, 128, 2, 3, false); })
            .find("a backward grid's group splits divide the query heads per K/V head (4), not 3") != std::string::npos);
  CHECK(refusal([] { (void)fa3::backward_grid(1, 16, 4, 4096, 128, 3, 1, false); })
            .find("the backward runs 2 consumer warpgroups, or 3 at d = 64, not 3 at d = 128") != std::string::npos);
}

}  // namespace
