// The ring's schedule and its cost model (ring.hpp says what each is for).
//
// The causal mask on global indices is one inequality (core/mask.hpp): query i sees key j iff
// j <= i + shift. Both ranges of a pair have the same stride s (1, or P when striped), so with
// i = q.first + s a and j = k.first + s c it becomes c <= a + floor((q.first - k.first + shift) / s):
// every pair of every layout is a block with a diagonal at a fixed local offset.
#include "model/ring.hpp"

#include <algorithm>
#include <cctype>

#include "core/flops.hpp"
#include "core/mask.hpp"

namespace flashlab {

namespace {

int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Chunk c of n near-equal chunks of [0, length): sizes differ by at most one, the larger ones last.
TokenRange near_equal_chunk(int length, int n, int c) {
  const auto begin = [&](int k) { return static_cast<int>(static_cast<std::int64_t>(length) * k / n); };
  return TokenRange{.first = begin(c), .count = begin(c + 1) - begin(c), .stride = 1};
}

std::vector<TokenRange> share_of(RingLayout layout, int ranks, int length, int rank) {
  switch (layout) {
    case RingLayout::Contiguous: return {near_equal_chunk(length, ranks, rank)};
    case RingLayout::Zigzag: {
      const int chunks = 2 * ranks;
      return {near_equal_chunk(length, chunks, rank), near_equal_chunk(length, chunks, chunks - 1 - rank)};
    }
    case RingLayout::Striped:
      return {TokenRange{.first = rank, .count = (length - rank + ranks - 1) / ranks, .stride = ranks}};
  }
  return {};
}

void check_lengths(RingLayout layout, int ranks, int seq_q, int seq_k) {
  if (ranks < 1) throw InputError("the ring needs at least 1 rank, got " + std::to_string(ranks));
  for (const auto& [name, length] : {std::pair{"seq_q", seq_q}, std::pair{"seq_k", seq_k}}) {
    if (layout == RingLayout::Zigzag && length % (2 * ranks) != 0)
      throw InputError(std::string("the zigzag layout cuts the sequence into 2P = ") + std::to_string(2 * ranks) +
                       " equal chunks, and " + name + " = " + std::to_string(length) +
                       " is not a multiple of it: choose a multiple, or the contiguous or striped layout, which "
                       "take any length of at least P");
    if (length < ranks)
      throw InputError(std::string(name) + " = " + std::to_string(length) + " is shorter than the " +
                       std::to_string(ranks) + " ranks: every rank must hold at least one query and one key");
  }
}

// The pair of q against k, classified against the causal mask.
BlockPair classify(const TokenRange& q, int q_offset, const TokenRange& k, int k_offset, CausalAlign causal,
                   int seq_q, int seq_k) {
  BlockPair pair;
  pair.q = q;
  pair.k = k;
  pair.q_offset = q_offset;
  pair.k_offset = k_offset;
  if (causal == CausalAlign::None) {
    pair.visible_scores = std::int64_t(q.count) * k.count;
    return pair;
  }
  const int offset = floor_div(q.first - k.first + causal_shift(causal, seq_q, seq_k), q.stride);
  if (offset >= k.count - 1) {  // even the first query sees the last key
    pair.visibility = Visibility::Full;
    pair.visible_scores = std::int64_t(q.count) * k.count;
  } else if (q.count - 1 + offset < 0) {  // even the last query sees no key
    pair.visibility = Visibility::Skipped;
  } else {
    pair.visibility = Visibility::Diagonal;
    pair.causal_offset = offset;
    for (int a = 0; a < q.count; ++a) pair.visible_scores += std::clamp(a + offset + 1, 0, k.count);
  }
  return pair;
}

int tokens_in(const std::vector<TokenRange>& ranges) {
  int n = 0;
  for (const TokenRange& r : ranges) n += r.count;
  return n;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const char* to_string(RingLayout layout) {
  switch (layout) {
    case RingLayout::Contiguous: return "contiguous";
    case RingLayout::Zigzag: return "zigzag";
    case RingLayout::Striped: return "striped";
  }
  return "?";
}

RingLayout parse_ring_layout(const std::string& text) {
  const std::string s = lower(text);
  if (s == "contiguous") return RingLayout::Contiguous;
  if (s == "zigzag") return RingLayout::Zigzag;
  if (s == "striped") return RingLayout::Striped;
  throw InputError("unknown ring layout '" + text + "': supported are contiguous, zigzag and striped");
}

const char* to_string(Visibility v) {
  switch (v) {
    case Visibility::Full: return "full";
    case Visibility::Skipped: return "skipped";
    case Visibility::Diagonal: return "diagonal";
  }
  return "?";
}

int RingSchedule::q_tokens(int rank) const { return tokens_in(q_ranges.at(rank)); }
int RingSchedule::kv_tokens(int origin) const { return tokens_in(kv_ranges.at(origin)); }

RingSchedule ring_schedule(RingLayout layout, int ranks, int seq_q, int seq_k, CausalAlign causal) {
  check_lengths(layout, ranks, seq_q, seq_k);
  RingSchedule ring;
  ring.layout = layout;
  ring.ranks = ranks;
  ring.seq_q = seq_q;
  ring.seq_k = seq_k;
  ring.causal = causal;
  for (int r = 0; r < ranks; ++r) {
    ring.q_ranges.push_back(share_of(layout, ranks, seq_q, r));
    ring.kv_ranges.push_back(share_of(layout, ranks, seq_k, r));
  }
  ring.steps.resize(ranks);
  for (int s = 0; s < ranks; ++s)
    for (int r = 0; r < ranks; ++r) {
      RankStep rs;
      rs.kv_origin = ((r - s) % ranks + ranks) % ranks;
      rs.send_to = (r + 1) % ranks;
      int q_offset = 0;
      for (const TokenRange& q : ring.q_ranges[r]) {
        int k_offset = 0;
        for (const TokenRange& k : ring.kv_ranges[rs.kv_origin]) {
          rs.pairs.push_back(classify(q, q_offset, k, k_offset, causal, seq_q, seq_k));
          k_offset += k.count;
        }
        q_offset += q.count;
      }
      ring.steps[s].push_back(std::move(rs));
    }
  return ring;
}

BlockLaunch block_launch(const BlockPair& pair) {
  const int m = pair.q.count, n = pair.k.count;
  switch (pair.visibility) {
    case Visibility::Skipped: return BlockLaunch{.skip = true};
    case Visibility::Full: return BlockLaunch{.keys = n, .align = CausalAlign::None};
    case Visibility::Diagonal: break;
  }
  const std::int64_t reach = std::int64_t(m) + pair.causal_offset;  // keys the last row would see, unclipped
  if (reach <= 0 || m == 0 || n == 0) return BlockLaunch{.skip = true};
  if (reach > n)
    throw InputError("the GPU ring runs a diagonal block as one bottom-right block, and this one's last " +
                     std::to_string(reach - n) + " rows see all of its " + std::to_string(n) +
                     " keys, which would need a block of their own: it supports causal masks with seq_q == seq_k "
                     "(any layout) or no mask");
  return BlockLaunch{.keys = static_cast<int>(reach), .align = CausalAlign::BottomRight};
}

std::int64_t kv_share_bytes(const Shape& s, int tokens, int bytes_per_element) {
  return std::int64_t(s.batch) * s.heads_kv * tokens * s.head_dim * bytes_per_element;
}

RingCost ring_cost(const RingSchedule& ring, const Shape& shape, Pass pass, const RingMachine& m) {
  if (shape.seq_q != ring.seq_q || shape.seq_k != ring.seq_k)
    throw InputError("the ring's schedule was made for seq_q = " + std::to_string(ring.seq_q) + ", seq_k = " +
                     std::to_string(ring.seq_k) + ", not for the shape's " + std::to_string(shape.seq_q) + ", " +
                     std::to_string(shape.seq_k));
  const int P = ring.ranks;
  const bool backward = pass == Pass::Backward;
  const double flops_per_score =
      forward_flops_per_score(shape) * (backward ? kBackwardFlopsPerForward : 1.0);
  RingCost cost;
  cost.pass = pass;
  cost.flops_per_rank.assign(P, 0.0);
  for (int s = 0; s < P; ++s) {
    RingStepCost step;
    step.link_bytes.assign(P, 0);
    step.flops.assign(P, 0.0);
    step.idle_seconds.assign(P, 0.0);
    for (int r = 0; r < P; ++r) {
      const RankStep& rs = ring.steps[s][r];
      for (const BlockPair& pair : rs.pairs) step.flops[r] += flops_per_score * double(pair.visible_scores);
      if (P > 1) {  // one rank has no link
        const int tokens = ring.kv_tokens(rs.kv_origin);
        if (ring.kv_travels_on(s)) step.link_bytes[r] += 2 * kv_share_bytes(shape, tokens, m.kv_bytes_per_element);
        if (backward) step.link_bytes[r] += 2 * kv_share_bytes(shape, tokens, m.grad_bytes_per_element);
      }
      step.seconds = std::max({step.seconds, step.flops[r] / m.flops_per_second,
                               double(step.link_bytes[r]) / m.link_bytes_per_second});
    }
    double max_flops = 0, sum_flops = 0;
    for (int r = 0; r < P; ++r) {
      step.idle_seconds[r] = step.seconds - step.flops[r] / m.flops_per_second;
      max_flops = std::max(max_flops, step.flops[r]);
      sum_flops += step.flops[r];
      cost.flops_per_rank[r] += step.flops[r];
      cost.total_link_bytes += step.link_bytes[r];
    }
    step.imbalance = sum_flops > 0 ? max_flops / (sum_flops / P) : 1.0;
    cost.total_flops += sum_flops;
    cost.seconds += step.seconds;
    cost.steps.push_back(std::move(step));
  }
  const double max_rank = *std::max_element(cost.flops_per_rank.begin(), cost.flops_per_rank.end());
  cost.imbalance = cost.total_flops > 0 ? max_rank / (cost.total_flops / P) : 1.0;
  return cost;
}

}  // namespace flashlab
