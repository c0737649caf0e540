// cuda-fa3-ws (the warp-specialized Hopper forward) and every step of its ablation ladder
// (cuda-fa3-ws-step1 .. step4, and cuda-fa3-ws = step 5) against naive attention in double, by the
// FlashAttention rule of core/tolerance.hpp: the kernel's max error may be at most 2x (O, LSE) the error
// of naive attention run in the same low precision, plus a small slack. Inputs are fresh random numbers
// each run (the seed is printed on failure); the variant poisons O and LSE with NaN before launching, so
// an element it never writes fails the comparison. Each case is checked at every ladder step, head dim
// and dtype, against one reference per (case, head dim, dtype).
//
// The kernel is compiled for sm_90a and runs on compute capability 9.0 only: on any other GPU the
// correctness cases are skipped (with a message saying so) and the refusal sentence is checked instead.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/tolerance.hpp"
#include "cpu_reference/naive.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"  // kTimelineBlocks: the blocks that record
#include "cuda/tilings.hpp"               // kWideBcMinKeys
#include "gpu/flashattention_rule.hpp"
#include "gpu/fresh_inputs.hpp"
#include "gpu/fully_masked_rows.hpp"
#include "model/timeline.hpp"
#include "registry/variants.hpp"

namespace {

using namespace flashlab;

// The ladder, step 1 first, then the shipped kernel and the two FlashAttention-4 rungs (steps 6, 7).
const char* const kLadder[] = {"cuda-fa3-ws-step1", "cuda-fa3-ws-step2",         "cuda-fa3-ws-step3",
                               "cuda-fa3-ws-step4", "cuda-fa3-ws",               "cuda-fa3-ws-eager-rescale",
                               "cuda-fa3-ws-exp2-emulated"};
constexpr DType kDtypes[] = {DType::F16, DType::BF16};
constexpr int kHeadDims[] = {64, 128, 256};

bool on_hopper() { return cuda_compute_capability() == 90; }

// True (and a message in the report) when this GPU cannot run the kernel: the caller returns.
bool skip_unless_hopper() {
  if (on_hopper()) return false;
  MESSAGE("skipped: cuda-fa3-ws runs on compute capability 9.0 (Hopper) only, and this GPU is "
          << cuda_device_name() << " (compute capability " << cuda_compute_capability() / 10 << "."
          << cuda_compute_capability() % 10 << "); the refusal is checked by its own test case");
  return true;
}

// The forward of every ladder step, for every head dim and dtype, on fresh random inputs (reshaped by
// `reshape` when given) against the CPU references (computed once per head dim and dtype, shared by the
// five steps).
void check_problem(Shape shape, const Options& options, void (*reshape)(Qkv&) = nullptr) {
  for (DType dtype : kDtypes)
    for (int d : kHeadDims) {
      shape.head_dim = d;
      const Problem p{.shape = shape, .options = options};
      const std::uint64_t seed = fresh_seed();
      INFO(describe(p, dtype, seed));
      Qkv in = random_qkv(shape, dtype, seed);
      if (reshape != nullptr) {  // then back to values the dtype holds exactly, as random_qkv gives
        reshape(in);
        round_to(in.q, dtype);
        round_to(in.k, dtype);
        round_to(in.v, dtype);
      }
      const ForwardOut ref = naive_forward<double>(p, in);
      const ForwardOut lowp = naive_forward_lowp(p, dtype, in);
      for (const char* name : kLadder) {
        INFO(name);
        const ForwardOut out = find_variant(name).forward(p, dtype, in, nullptr);
        check_output("O", dtype, Quantity::Forward, out.o, ref.o, lowp.o);
        check_output("LSE", dtype, Quantity::Forward, out.lse, ref.lse, lowp.lse);
      }
    }
}

Options opts(CausalAlign align, double dropout_p = 0.0, double scale = 0.0) {
  Options o;
  o.causal = align;
  o.dropout_p = dropout_p;
  o.scale = scale;
  o.seed = fresh_seed();
  return o;
}

Shape shape(int batch, int heads_q, int heads_kv, int seq_q, int seq_k) {
  return Shape{.batch = batch, .heads_q = heads_q, .heads_kv = heads_kv, .seq_q = seq_q, .seq_k = seq_k, .head_dim = 64};
}

}  // namespace

TEST_CASE("cuda-fa3-ws: the table lists every ladder step for the head dims of cuda/constraints.hpp, all but step 5 forward only") {
  for (const char* name : kLadder) {
    const Variant& v = find_variant(name);
    CHECK(v.device == Device::Cuda);
    CHECK(v.head_dims.describe() == "64, 128, 256");
    CHECK(v.supports_dtype(DType::F16));
    CHECK(v.supports_dtype(DType::BF16));
    CHECK_FALSE(v.supports_dtype(DType::F32));
    CHECK(v.has_backward() == (std::string(name) == "cuda-fa3-ws"));  // its backward: gpu_fa3_ws_backward_tests
    CHECK(v.has_device_timer());
    CHECK(v.needs_compute_capability == 90);
    CHECK(v.available() == on_hopper());
  }
}

TEST_CASE("cuda-fa3-ws on a GPU other than Hopper: every step refuses with one sentence, never falls back") {
  if (on_hopper()) {
    MESSAGE("this GPU is a Hopper (compute capability 9.0): the refusal does not apply here");
    return;
  }
  const Problem p{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 16, .seq_k = 16, .head_dim = 64},
                  .options = Options{}};
  const Qkv in = random_qkv(p.shape, DType::F16, 1);
  const int cc = cuda_compute_capability();
  const std::string expected = "needs a Hopper GPU (compute capability 9.0); this GPU is " + cuda_device_name() +
                               " (compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) + ")";
  for (const char* name : kLadder) {
    const Variant& v = find_variant(name);
    const std::string fwd = refusal([&] { (void)v.forward(p, DType::F16, in, nullptr); });
    CHECK_MESSAGE(fwd == "variant " + std::string(name) + " " + expected, fwd);
    const std::string bench = refusal([&] { (void)v.bench(p, DType::F16, BenchSettings{0, 1, false}); });
    CHECK_MESSAGE(bench == "variant " + std::string(name) + " " + expected, bench);
  }
}

TEST_CASE("cuda-fa3-ws, every ladder step: length 1, odd lengths, seq_q != seq_k both ways, no multiple of a block") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 2, 2, 1, 1), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 1, 300), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 300, 1), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 77, 333), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 333, 77), opts(CausalAlign::None));
  check_problem(shape(1, 1, 1, 129, 193), opts(CausalAlign::None));  // one past the 128- and 64-row blocks
}

TEST_CASE("cuda-fa3-ws, every ladder step: many K/V blocks (seq_k = 4096: every pipeline stage wraps many times)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 1, 1, 130, 4096), opts(CausalAlign::None));
  check_problem(shape(1, 1, 1, 70, 4096), opts(CausalAlign::BottomRight));
}

TEST_CASE("cuda-fa3-ws, every ladder step: causal, top-left and bottom-right, seq_q < seq_k and seq_q > seq_k") {
  if (skip_unless_hopper()) return;
  for (CausalAlign align : {CausalAlign::TopLeft, CausalAlign::BottomRight}) {
    check_problem(shape(1, 2, 2, 200, 330), opts(align));
    check_problem(shape(1, 2, 2, 330, 200), opts(align));  // bottom-right: the first 130 rows see no key
  }
  check_problem(shape(1, 1, 1, 1, 500), opts(CausalAlign::TopLeft));  // one query, one visible key
}

TEST_CASE("cuda-fa3-ws, every ladder step: GQA and MQA") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 8, 2, 200, 300), opts(CausalAlign::BottomRight));
  check_problem(shape(1, 4, 1, 257, 129), opts(CausalAlign::None));
}

TEST_CASE("cuda-fa3-ws, every ladder step: dropout drops the same elements as the CPU reference (same Philox seed)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 2, 2, 200, 333), opts(CausalAlign::None, 0.1));
  check_problem(shape(1, 4, 2, 190, 190), opts(CausalAlign::TopLeft, 0.3));
}

TEST_CASE("cuda-fa3-ws, every ladder step: a given softmax scale, and a negative one") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 2, 2, 150, 203), opts(CausalAlign::None, 0.0, 0.35));
  check_problem(shape(1, 2, 2, 100, 200), opts(CausalAlign::BottomRight, 0.0, -0.09));
}

TEST_CASE("cuda-fa3-ws, every ladder step: batch > 1") {
  if (skip_unless_hopper()) return;
  check_problem(shape(2, 2, 2, 130, 260), opts(CausalAlign::None));
  check_problem(shape(3, 2, 1, 260, 130), opts(CausalAlign::BottomRight, 0.1));
}

TEST_CASE("cuda-fa3-ws, every ladder step: more tiles than SMs (the persistent grid takes several per block)") {
  if (skip_unless_hopper()) return;
  // 2 x 32 heads x 5 blocks of 128 query rows = 320 tiles for the H100's 132 persistent blocks: each block
  // takes two or three from the counter, light and heavy ones under the causal mask, in groups of heads.
  check_problem(shape(2, 32, 8, 600, 700), opts(CausalAlign::BottomRight));
  check_problem(shape(2, 32, 8, 700, 600), opts(CausalAlign::TopLeft, 0.1));
  check_problem(shape(2, 32, 32, 600, 600), opts(CausalAlign::None));
}

TEST_CASE("cuda-fa3-ws: launches one after another give the same bits (the persistent tile counter starts at zero)") {
  if (skip_unless_hopper()) return;
  // The counter the persistent blocks draw tiles from is shared by every launch on the device; each launch
  // must leave it at zero. If one did not, the next would skip tiles and leave the variant's NaN poison in O.
  const Shape s = Shape{.batch = 2, .heads_q = 32, .heads_kv = 8, .seq_q = 600, .seq_k = 600, .head_dim = 128};
  const Problem p{.shape = s, .options = opts(CausalAlign::BottomRight)};
  const std::uint64_t seed = fresh_seed();
  INFO(describe(p, DType::BF16, seed));
  const Qkv in = random_qkv(s, DType::BF16, seed);
  const ForwardOut ref = naive_forward<double>(p, in);
  const ForwardOut lowp = naive_forward_lowp(p, DType::BF16, in);
  const Variant& v = find_variant("cuda-fa3-ws");
  const ForwardOut first = v.forward(p, DType::BF16, in, nullptr);
  (void)v.bench(p, DType::BF16, BenchSettings{2, 3, false});  // five more launches in between
  const ForwardOut second = v.forward(p, DType::BF16, in, nullptr);
  check_output("O, first launch", DType::BF16, Quantity::Forward, first.o, ref.o, lowp.o);
  check_output("O, last launch", DType::BF16, Quantity::Forward, second.o, ref.o, lowp.o);
  CHECK(second.o.data == first.o.data);
  CHECK(second.lse.data == first.lse.data);
}

// K_j grows along the sequence (x 1 at key 0 to x 24 at the last): each row's max rises block after block,
// by far more than the kernel lets its running max lag (2^8), so O_i and l_i are rescaled at many blocks,
// not only the first.
void keys_grow_along_the_sequence(Qkv& in) {
  const auto& d = in.k.dims;  // (B, S_k, H_kv, D)
  for (std::int64_t b = 0; b < d[0]; ++b)
    for (std::int64_t s = 0; s < d[1]; ++s)
      for (std::int64_t h = 0; h < d[2]; ++h)
        for (std::int64_t x = 0; x < d[3]; ++x) in.k.at(b, s, h, x) *= 1.0 + 23.0 * static_cast<double>(s) / static_cast<double>(d[1]);
}

TEST_CASE("cuda-fa3-ws, every ladder step: row maxima that keep rising along the keys (O rescaled at many blocks)") {
  if (skip_unless_hopper()) return;
  check_problem(shape(1, 2, 2, 130, 1000), opts(CausalAlign::None), keys_grow_along_the_sequence);
  check_problem(shape(1, 2, 2, 300, 700), opts(CausalAlign::BottomRight, 0.1), keys_grow_along_the_sequence);
}

TEST_CASE("cuda-fa3-ws, every ladder step: long keys, where d = 64 and 128 take wider K/V blocks from step 2 on (192, 160 keys)") {
  if (skip_unless_hopper()) return;
  using cuda::fa3_ws::kWideBcMinKeys;  // 2048. No key length below is a multiple of 160 or 192: the last block is ragged
  // At d = 64 from step 5 on, cuda/tilings.hpp's forward_choice picks the consumers: 70 and 100 queries take two (the
  // narrow blocks one key short, the wide ones from 2048 keys), 200 with dropout two, every other case below three.
  check_problem(shape(1, 2, 2, 100, kWideBcMinKeys - 1), opts(CausalAlign::None));  // the narrow blocks, one key short
  check_problem(shape(1, 2, 2, 100, kWideBcMinKeys + 150), opts(CausalAlign::BottomRight));
  check_problem(shape(1, 8, 2, 70, 2222), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 500, 700), opts(CausalAlign::None));      // three consumers on short keys
  check_problem(shape(1, 2, 2, 384, 450), opts(CausalAlign::TopLeft));   // ... under a mask too
  check_problem(shape(1, 2, 2, 300, kWideBcMinKeys), opts(CausalAlign::None));
  check_problem(shape(1, 2, 2, 257, 2500), opts(CausalAlign::TopLeft));
  check_problem(shape(1, 1, 1, 2200, kWideBcMinKeys + 1), opts(CausalAlign::BottomRight));  // seq_q > seq_k
  check_problem(shape(1, 8, 2, 130, 3001), opts(CausalAlign::BottomRight));                   // GQA
  check_problem(shape(1, 2, 2, 200, 2100), opts(CausalAlign::None, 0.1));  // dropout keeps the narrow blocks
  check_problem(shape(1, 2, 2, 130, 2300), opts(CausalAlign::None), keys_grow_along_the_sequence);
}

TEST_CASE("cuda-fa3-ws, every ladder step: fully masked rows give O = 0 and LSE = -inf, never NaN") {
  if (skip_unless_hopper()) return;
  // Bottom-right alignment with seq_q > seq_k: the first seq_q - seq_k queries see no key.
  const Shape s = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 150, .seq_k = 40, .head_dim = 128};
  const Problem p{.shape = s, .options = opts(CausalAlign::BottomRight)};
  const Qkv in = random_qkv(s, DType::BF16, fresh_seed());
  for (const char* name : kLadder) {
    INFO(name);
    check_fully_masked_rows(find_variant(name).forward(p, DType::BF16, in, nullptr), s, s.seq_q - s.seq_k);
  }
}

TEST_CASE("cuda-fa3-ws refuses head dims 32 and 96 and f32, every step but 5 the backward, with one sentence, on any GPU") {
  const Problem p{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 16, .seq_k = 16, .head_dim = 64},
                  .options = Options{}};
  for (const char* name : kLadder) {
    const Variant& v = find_variant(name);
    for (int d : {32, 96}) {
      Problem pd = p;
      pd.shape.head_dim = d;
      const std::string msg = refusal([&] { (void)v.forward(pd, DType::F16, random_qkv(pd.shape, DType::F16, 1), nullptr); });
      CHECK_MESSAGE(msg.find("head_dim " + std::to_string(d)) != std::string::npos, msg);
      CHECK_MESSAGE(msg.find("64, 128, 256") != std::string::npos, msg);
    }
    const std::string f32 = refusal([&] { (void)v.forward(p, DType::F32, random_qkv(p.shape, DType::F32, 2), nullptr); });
    CHECK_MESSAGE(f32.find("f16, bf16") != std::string::npos, f32);

    if (std::string(name) == "cuda-fa3-ws") continue;  // the shipped step has a backward
    const Qkv in = random_qkv(p.shape, DType::F16, 3);
    const ForwardOut fwd{HostTensor(q_dims(p.shape)), HostTensor(lse_dims(p.shape))};
    const std::string bwd =
        refusal([&] { (void)v.backward(p, DType::F16, in, fwd, random_like_o(p.shape, DType::F16, 4)); });
    CHECK_MESSAGE(bwd == "variant " + std::string(name) + " has no backward pass yet (it is forward only); cuda-fa2 and cuda-fa3-ws have one",
                  bwd);
    const std::string bench_bwd = refusal([&] { (void)v.bench(p, DType::F16, BenchSettings{0, 1, true}); });
    CHECK_MESSAGE(bench_bwd == bwd, bench_bwd);
  }
}

TEST_CASE("cuda-fa3-ws refuses more tiles than its 32-bit tile index holds, before allocating anything") {
  if (skip_unless_hopper()) return;
  // 65536 query heads x ceil(seq_q / Br) blocks of query rows = 2^31 tiles, one past the limit: Br is 64
  // at step 1 and 128 from step 2 on. bench checks before it allocates (forward would need the inputs).
  for (const char* name : kLadder) {
    const int br = std::string(name) == "cuda-fa3-ws-step1" ? 64 : 128;
    const Problem p{.shape = Shape{.batch = 1, .heads_q = 65536, .heads_kv = 1, .seq_q = br * 32768, .seq_k = 1,
                                   .head_dim = 64},
                    .options = Options{}};
    const std::string msg = refusal([&] { (void)find_variant(name).bench(p, DType::F16, BenchSettings{0, 1, false}); });
    CHECK_MESSAGE(msg.find("2147483648 tiles") != std::string::npos, name << ": " << msg);
    CHECK_MESSAGE(msg.find("2147483647") != std::string::npos, name << ": " << msg);
  }
}

TEST_CASE("cuda-fa3-ws bench --timeline, every ladder step and e4m3: the file read back has every warpgroup's lane and events") {
  if (skip_unless_hopper()) return;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flashlab_fa3_timeline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // B = 1, H = 2, N = 1024: 16 tiles of 128 query rows (32 of 64 at step 1), so blocks 0 .. kTimelineBlocks - 1
  // all record and each runs exactly one tile (the persistent grid has min(tiles, SMs) = 16 blocks too).
  const Problem p{.shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 1024, .seq_k = 1024, .head_dim = 128},
                  .options = Options{}};
  constexpr auto kRecordingBlocks = static_cast<std::uint32_t>(flashlab::cuda::fa3_ws::kTimelineBlocks);
  // Every ladder step in f16 and bf16 (the FlashAttention-4 rungs, steps 6 and 7, too), and the FP8 forward (the
  // shipped step, e4m3).
  std::vector<std::pair<DType, int>> runs;
  for (DType dtype : kDtypes)
    for (int step = 1; step <= 7; ++step) runs.emplace_back(dtype, step);
  runs.emplace_back(DType::E4M3, 5);
  for (const auto& [dtype, step] : runs) {
      const std::string name = kLadder[step - 1];
      INFO(name << " " << to_string(dtype));
      const std::string path = (dir / (name + "-" + to_string(dtype) + ".json")).string();
      const BenchResult b = find_variant(name).bench(
          p, dtype, BenchSettings{.warmup = 1, .iters = 5, .backward = false, .record_timeline = true});

      // The bench's own figures: the plain kernel's time as always, and the recording build's.
      CHECK(std::isfinite(b.forward_ms));
      CHECK(b.forward_ms > 0);
      REQUIRE(b.timeline.has_value());
      const BenchTimeline& rec = *b.timeline;
      CHECK(std::isfinite(rec.recording_ms));
      CHECK(rec.recording_ms > 0);
      CHECK(rec.capacity > 0);
      CHECK_FALSE(rec.buffer_filled);
      CHECK_FALSE(rec.records.empty());
      CHECK(rec.first_block == 0);
      CHECK(rec.last_block == kRecordingBlocks - 1);

      // Written as the command line writes it, and read back through the model's reader.
      write_trace_event_file(timeline_of(rec), path);
      const Timeline t = read_trace_event_file(path);
      CHECK(t == timeline_of(rec));
      CHECK(t.spans.size() == rec.records.size());
      CHECK(t.device == cuda_device_name());
      CHECK(t.variant == "cuda-fa3-ws");
      // Steps 6 and 7 say what they are beside their number.
      const std::string rung = step == 6 ? " (step 5, eager rescale)"
                               : step == 7 ? " (step 5, 1 in 8 column groups' exp2 emulated)"
                                           : "";
      CHECK_MESSAGE(t.label.rfind("ladder step " + std::to_string(step) + rung + ", " + to_string(dtype) + ", ", 0) == 0,
                    t.label);
      const std::uint32_t producers = step >= 2 ? 1 : 0;
      const std::uint32_t warpgroups = step >= 2 ? 3 : 1;  // producer + two consumers, or one that does both
      CHECK(t.producer_warpgroups == producers);

      std::map<std::pair<std::uint32_t, std::uint32_t>, std::array<int, kPipelineEventCount>> lanes;  // (block, wg)
      for (const TimelineSpan& s : t.spans) {
        CHECK(s.end_ns >= s.begin_ns);
        if (!is_span(s.event)) CHECK(s.end_ns == s.begin_ns);
        CHECK(s.block < kRecordingBlocks);
        CHECK(s.warpgroup < warpgroups);
        ++lanes[{s.block, s.warpgroup}][static_cast<int>(s.event)];
      }
      auto count = [&](std::uint32_t block, std::uint32_t wg, PipelineEvent e) {
        const auto it = lanes.find({block, wg});
        return it == lanes.end() ? 0 : it->second[static_cast<int>(e)];
      };
      for (std::uint32_t block = 0; block < kRecordingBlocks; ++block) {
        INFO("block " << block);
        for (std::uint32_t wg = 0; wg < warpgroups; ++wg) CHECK_MESSAGE(lanes.count({block, wg}) == 1, "no lane for WG" << wg);
        // Warpgroup 0 issues the loads: Q, then K_j and V_j of every K/V block.
        const int loads = count(block, 0, PipelineEvent::TmaIssue);
        CHECK(loads >= 3);
        if (producers == 1) {  // the producer only loads and waits for free stages
          for (PipelineEvent e : {PipelineEvent::TmaLanded, PipelineEvent::WgmmaIssue, PipelineEvent::WgmmaWait,
                                  PipelineEvent::Softmax, PipelineEvent::Epilogue})
            CHECK_MESSAGE(count(block, 0, e) == 0, "the producer recorded " << to_string(e));
        }
        for (std::uint32_t wg = producers; wg < warpgroups; ++wg) {
          INFO("consumer WG" << wg);
          CHECK(count(block, wg, PipelineEvent::TmaLanded) == loads);  // each consumer saw every load land
          CHECK(count(block, wg, PipelineEvent::WgmmaIssue) > 0);
          CHECK(count(block, wg, PipelineEvent::WgmmaWait) > 0);
          CHECK(count(block, wg, PipelineEvent::Softmax) > 0);
          CHECK(count(block, wg, PipelineEvent::Epilogue) == 1);  // one tile per block
          if (producers == 1) CHECK(count(block, wg, PipelineEvent::TmaIssue) == 0);
        }
      }
    }
  std::filesystem::remove_all(dir);
}

TEST_CASE("cuda-fa3-ws bench --timeline: d = 64 where steps 5-7 run three consumers is one sentence; two consumers and steps 1-4 record") {
  if (skip_unless_hopper()) return;
  const auto problem = [](int seq_q, int seq_k, CausalAlign causal = CausalAlign::None) {
    return Problem{.shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = seq_q, .seq_k = seq_k, .head_dim = 64},
                   .options = Options{.causal = causal}};
  };
  const BenchSettings record{.warmup = 0, .iters = 1, .backward = false, .record_timeline = true};
  // Steps 5-7 run three consumer warpgroups for these (cuda/tilings.hpp, forward_choice), which the timeline build
  // does not have: long keys, and short ones under a mask.
  for (const char* name : {"cuda-fa3-ws", "cuda-fa3-ws-eager-rescale", "cuda-fa3-ws-exp2-emulated"}) {
    INFO(name);
    for (const Problem& p : {problem(2048, 2048), problem(384, 500, CausalAlign::TopLeft)}) {
      const std::string msg = refusal([&] { (void)find_variant(name).bench(p, DType::BF16, record); });
      CHECK_MESSAGE(msg == "cuda-fa3-ws records no forward timeline of " + std::to_string(p.shape.seq_q) +
                               " queries at d = 64 from ladder step 5 on: it runs three consumer warpgroups there, "
                               "which have no registers to spare for the recording; record steps 1-4, or a query "
                               "count such as 256, where it runs two",
                    msg);
    }
    // 256 queries on the same keys run two consumers (on the wide blocks), which record: a producer and two lanes.
    const BenchResult two = find_variant(name).bench(problem(256, 2048), DType::BF16, record);
    REQUIRE(two.timeline.has_value());
    std::uint32_t lanes = 0;
    for (const TimelineRecord& r : two.timeline->records) lanes = std::max(lanes, r.warpgroup + 1u);
    CHECK(lanes == 3);
  }
  // Below step 5 d = 64 keeps two consumers (with 192 keys a block for long keys) and records.
  const BenchResult step4 = find_variant("cuda-fa3-ws-step4").bench(problem(2048, 2048), DType::BF16, record);
  REQUIRE(step4.timeline.has_value());
  CHECK_FALSE(step4.timeline->records.empty());
  // The backward's timeline is another build, which the three consumers of the forward do not touch.
  const BenchResult backward = find_variant("cuda-fa3-ws").bench(
      problem(2048, 2048), DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = true, .record_timeline = true});
  REQUIRE(backward.timeline.has_value());
  CHECK_FALSE(backward.timeline->records.empty());
  // Where the backward's plan takes three consumer warpgroups (a long, even grid: the FA2 setting at 2k), the
  // timing runs them and the recording runs two, a producer and two lanes, and the label says so.
  Problem fa2_setting = problem(2048, 2048);
  fa2_setting.shape.batch = 8;
  fa2_setting.shape.heads_q = fa2_setting.shape.heads_kv = 32;
  const BenchResult three = find_variant("cuda-fa3-ws").bench(
      fa2_setting, DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = true, .record_timeline = true});
  REQUIRE(three.timeline.has_value());
  std::uint32_t backward_lanes = 0;
  for (const TimelineRecord& r : three.timeline->records) backward_lanes = std::max(backward_lanes, r.warpgroup + 1u);
  CHECK(backward_lanes == 3);
  CHECK_MESSAGE(three.timeline->label.find("(recorded with 2 consumer warpgroups; the timed runs had 3)") !=
                    std::string::npos,
                three.timeline->label);
}

TEST_CASE("cuda-fa3-ws bench --timeline with dropout is one sentence") {
  if (skip_unless_hopper()) return;
  Problem p{.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 256, .seq_k = 256, .head_dim = 64},
            .options = Options{}};
  p.options.dropout_p = 0.1;
  const std::string dropout = refusal([&] {
    (void)find_variant("cuda-fa3-ws-step2").bench(p, DType::BF16, BenchSettings{.warmup = 0, .iters = 1, .backward = false,
                                                                                .record_timeline = true});
  });
  CHECK_MESSAGE(dropout == "variant cuda-fa3-ws-step2 records a timeline only without dropout (its timeline build has none)",
                dropout);
}
