// cuda-fa3-ws's FP8 forward against the CPU:
//  * the pre-pass that writes V^T for an e4m3 O += P V (fa3_ws/fp8_transpose_v.cu): every byte of V^T must be the
//    byte of V that fp8_v_key names, and zero where that key is past the end; V is random bytes (any e4m3 pattern
//    moves as it is), V^T starts poisoned;
//  * the forward, through the variant table (the path `flashlab check --dtype e4m3` takes), at every head dim it
//    compiles (d = 64, whose Q and K tiles take the 64-byte swizzle, 128 and 256): inputs quantized per head on the
//    CPU (cpu_reference/fp8.hpp), the kernel's O and LSE (poisoned with NaN first) against naive attention in double
//    on the dequantized inputs, by check_fp8_kernel's rule: O within 2x the error of the CPU emulation of the same FP8
//    arithmetic (FlashAttention's rule, the emulation as the baseline), the LSE within its stated slack;
//  * the timeline build at d = 64 (tests/gpu/test_cuda_fa3_ws.cpp reads d = 128's file back in full): every
//    recording block has its producer's and both consumers' lanes, with loads, GEMMs, softmax and an epilogue;
//  * the same forward with V transposed in shared memory by the producer (launch_forward_e4m3_vt_in_smem, raced
//    against the pre-pass, not what ships), on the same shape families at every head dim: its O and LSE bit for bit
//    the shipped launcher's (the same arithmetic on the same V^T bytes, in the same order), and within
//    check_fp8_kernel's rule on their own.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/half.hpp"
#include "cpu_reference/fp8.hpp"
#include "cuda/fa3_ws/fa3_ws_params.hpp"
#include "gpu/fresh_inputs.hpp"
#include "model/timeline.hpp"
#include "registry/variants.hpp"

namespace {

using namespace flashlab;

// The CPU's V^T: the same rule, written from fp8_layout.cuh's words (within 32 keys, logical k = 16 h + 4 t + j
// holds key 16 h + 8 (j / 2) + 2 t + j % 2).
std::uint8_t expected(const std::vector<std::uint8_t>& v, int b, int h, int d, int k, int seq_k, int heads_kv, int head_dim) {
  const int base = k / 32 * 32, h16 = (k % 32) / 16, t = (k % 16) / 4, j = k % 4;
  const int key = base + 16 * h16 + 8 * (j / 2) + 2 * t + j % 2;
  if (key >= seq_k) return 0;
  return v[((std::size_t(b) * seq_k + key) * heads_kv + h) * head_dim + d];
}

void require_cuda(cudaError_t e) { REQUIRE_MESSAGE(e == cudaSuccess, cudaGetErrorString(e)); }

}  // namespace

TEST_CASE("the FP8 V^T: every byte where fp8_v_key puts it, zero past the keys, any length") {
  int dev = 0, major = 0, minor = 0;
  require_cuda(cudaGetDevice(&dev));
  require_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  require_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0) {
    // The pre-pass is built for sm_90a alone: elsewhere its launch must fail loudly, not leave V^T unwritten.
    MESSAGE("not a compute capability 9.0 GPU: the sm_90a pre-pass must refuse to launch here");
    void *dv = nullptr, *dvt = nullptr;
    require_cuda(cudaMalloc(&dv, 64));
    require_cuda(cudaMalloc(&dvt, 64 * 32));
    CHECK_THROWS_AS(cuda::fa3_ws::transpose_v_e4m3(dv, dvt, 1, 1, 1, 64, nullptr), std::runtime_error);
    require_cuda(cudaFree(dv));
    require_cuda(cudaFree(dvt));
    return;
  }
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  CAPTURE(seed);
  rng.seed(seed);
  for (const int head_dim : {64, 128, 256})
    for (const int seq_k : {1, 31, 32, 40, 63, 64, 97, 300}) {
      CAPTURE(head_dim);
      CAPTURE(seq_k);
      const int batch = 2, heads_kv = 3, vt_keys = cuda::fa3_ws::fp8_vt_keys(seq_k);
      REQUIRE(vt_keys % 32 == 0);
      REQUIRE(vt_keys >= seq_k);
      REQUIRE(vt_keys < seq_k + 32);
      std::vector<std::uint8_t> v(std::size_t(batch) * seq_k * heads_kv * head_dim);
      for (auto& x : v) x = std::uint8_t(rng());
      const std::size_t vt_bytes = std::size_t(batch) * heads_kv * head_dim * vt_keys;
      void *dv = nullptr, *dvt = nullptr;
      require_cuda(cudaMalloc(&dv, v.size()));
      require_cuda(cudaMalloc(&dvt, vt_bytes));
      require_cuda(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice));
      require_cuda(cudaMemset(dvt, 0xA5, vt_bytes));  // poison: a byte the pre-pass never writes fails below
      cuda::fa3_ws::transpose_v_e4m3(dv, dvt, batch, seq_k, heads_kv, head_dim, nullptr);
      require_cuda(cudaDeviceSynchronize());
      std::vector<std::uint8_t> vt(vt_bytes);
      require_cuda(cudaMemcpy(vt.data(), dvt, vt_bytes, cudaMemcpyDeviceToHost));
      require_cuda(cudaFree(dv));
      require_cuda(cudaFree(dvt));
      int wrong = 0;
      for (int b = 0; b < batch; ++b)
        for (int h = 0; h < heads_kv; ++h)
          for (int d = 0; d < head_dim; ++d)
            for (int k = 0; k < vt_keys; ++k) {
              const std::uint8_t got = vt[((std::size_t(b) * heads_kv + h) * head_dim + d) * vt_keys + k];
              const std::uint8_t want = expected(v, b, h, d, k, seq_k, heads_kv, head_dim);
              if (got != want && wrong++ < 3) {
                CAPTURE(b);
                CAPTURE(h);
                CAPTURE(d);
                CAPTURE(k);
                CHECK(int(got) == int(want));
              }
            }
      CHECK(wrong == 0);
    }
}

namespace {

// One problem at each head dim of the FP8 forward: the kernel and the emulation against naive attention in double on
// the dequantized inputs. The list is written out rather than read from cuda/constraints.hpp, so that a head dim
// dropped from the build fails here (the row refuses it) instead of going untested.
void check_fp8_forward(flashlab::Shape shape, flashlab::CausalAlign align) {
  using namespace flashlab;
  for (const int d : {64, 128, 256}) {
    shape.head_dim = d;
    Options options;
    options.causal = align;
    const Problem p{.shape = shape, .options = options};
    const std::uint64_t seed = fresh_seed();
    INFO(describe(p, DType::F32, seed));
    const Qkv in = random_qkv(shape, DType::F32, seed);
    const EmulatedForward emulated = fp8_attention_emulated(p, in, fp8_kernel_order(p.shape.head_dim));
    // Through the table's row, as `flashlab check --dtype e4m3` runs it: quantized per head as the emulation is
    // (quantize_e4m3_qkv), O and LSE poisoned with NaN before the launch.
    const ForwardOut out = find_variant("cuda-fa3-ws").forward(p, DType::E4M3, in);
    const Fp8KernelCheck c = check_fp8_kernel(p, emulated, out);
    REQUIRE(c.emulation.passes());
    MESSAGE("d=" << d << " O max " << c.o.max_abs << " (emulation " << c.emulation.o.max_abs << ", x"
                 << c.o.max_abs / c.emulation.o.max_abs << "), rmse " << c.o.rmse << " (" << c.emulation.o.rmse
                 << "); LSE max " << c.lse.max_abs << " (limit " << c.lse_limit << ")");
    CHECK(c.o.max_abs <= c.o_limit);
    CHECK(c.lse.max_abs <= c.lse_limit);
    CHECK(c.o.rmse <= kFp8KernelFactor * c.emulation.o.rmse);  // and not only at its worst element
  }
}

flashlab::Shape fp8_shape(int batch, int heads_q, int heads_kv, int seq_q, int seq_k) {
  return flashlab::Shape{.batch = batch, .heads_q = heads_q, .heads_kv = heads_kv, .seq_q = seq_q, .seq_k = seq_k,
                         .head_dim = 128};
}

bool skip_unless_hopper() {
  if (flashlab::cuda_compute_capability() == 90) return false;
  MESSAGE("skipped: the FP8 forward runs on compute capability 9.0 only");
  return true;
}

}  // namespace

TEST_CASE("the FP8 forward: within 2x the emulation's error, unmasked, GQA, ragged lengths, many K/V blocks and tiles") {
  if (skip_unless_hopper()) return;
  check_fp8_forward(fp8_shape(2, 4, 2, 300, 300), flashlab::CausalAlign::None);
  check_fp8_forward(fp8_shape(1, 3, 1, 77, 1000), flashlab::CausalAlign::None);  // MQA, seq_q != seq_k
  check_fp8_forward(fp8_shape(1, 2, 2, 1, 1), flashlab::CausalAlign::None);      // length 1
  // 4 x 6 x 7 = 168 tiles, more than an H100's or H200's 132 SMs: persistent blocks take several, and the K/V stages'
  // phases run on from one tile into the next.
  check_fp8_forward(fp8_shape(4, 6, 3, 800, 256), flashlab::CausalAlign::None);
}

TEST_CASE("the FP8 forward: causal, both alignments, seq_q != seq_k both ways") {
  if (skip_unless_hopper()) return;
  for (const auto align : {flashlab::CausalAlign::TopLeft, flashlab::CausalAlign::BottomRight}) {
    check_fp8_forward(fp8_shape(1, 4, 2, 200, 333), align);
    check_fp8_forward(fp8_shape(2, 2, 1, 333, 200), align);  // bottom-right: rows that see no key
    check_fp8_forward(fp8_shape(1, 2, 2, 513, 513), align);
  }
}

TEST_CASE("the FP8 forward's timeline build at d = 64: every recording block's three lanes and their events") {
  if (skip_unless_hopper()) return;
  using namespace flashlab;
  // B = 1, H = 2, N = 1024: 16 tiles of 128 query rows, so the persistent grid has 16 blocks, one tile each, and
  // blocks 0 .. kTimelineBlocks - 1 all record; the K/V blocks of a tile (1024 / e4m3_kernel_block_keys(64)) go round
  // the four stages.
  const Problem p{.shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 1024, .seq_k = 1024, .head_dim = 64},
                  .options = Options{}};
  const BenchResult b = find_variant("cuda-fa3-ws").bench(
      p, DType::E4M3, BenchSettings{.warmup = 1, .iters = 3, .backward = false, .record_timeline = true});
  CHECK(std::isfinite(b.forward_ms));
  CHECK(b.forward_ms > 0);
  REQUIRE(b.timeline.has_value());
  const BenchTimeline& rec = *b.timeline;
  CHECK(rec.recording_ms > 0);
  CHECK_FALSE(rec.buffer_filled);
  CHECK(rec.producer_warpgroups == 1);
  constexpr auto kRecordingBlocks = static_cast<std::uint32_t>(cuda::fa3_ws::kTimelineBlocks);
  CHECK(rec.last_block == kRecordingBlocks - 1);
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::array<int, kPipelineEventCount>> lanes;  // (block, wg)
  for (const TimelineRecord& r : rec.records) {
    REQUIRE(r.block < kRecordingBlocks);
    REQUIRE(r.warpgroup < 3);
    REQUIRE(r.event < kPipelineEventCount);
    CHECK(r.t_end_ns >= r.t_begin_ns);
    ++lanes[{r.block, r.warpgroup}][r.event];
  }
  auto count = [&](std::uint32_t block, std::uint32_t wg, PipelineEvent e) {
    const auto it = lanes.find({block, wg});
    return it == lanes.end() ? 0 : it->second[static_cast<int>(e)];
  };
  constexpr int kKvBlocks = 1024 / e4m3_kernel_block_keys(64);
  for (std::uint32_t block = 0; block < kRecordingBlocks; ++block) {
    INFO("block " << block);
    // The producer: Q, then K_j and V_j of every K/V block, and nothing a consumer does.
    CHECK(count(block, 0, PipelineEvent::TmaIssue) == 1 + 2 * kKvBlocks);
    CHECK(count(block, 0, PipelineEvent::Softmax) == 0);
    CHECK(count(block, 0, PipelineEvent::WgmmaIssue) == 0);
    for (std::uint32_t wg = 1; wg <= 2; ++wg) {
      INFO("consumer warpgroup " << wg);
      CHECK(count(block, wg, PipelineEvent::TmaLanded) == 1 + 2 * kKvBlocks);  // it saw every load land
      CHECK(count(block, wg, PipelineEvent::WgmmaIssue) >= kKvBlocks);
      CHECK(count(block, wg, PipelineEvent::Softmax) == kKvBlocks);  // one per K/V block
      CHECK(count(block, wg, PipelineEvent::Epilogue) == 1);        // one tile per block
      CHECK(count(block, wg, PipelineEvent::TmaIssue) == 0);
    }
  }
}

namespace {

// A device allocation for the length of a test (none for 0 bytes).
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(std::size_t n) {
    if (n > 0) require_cuda(cudaMalloc(&p, n));
  }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

template <class T>
void upload(DeviceBytes& dst, const std::vector<T>& src) {
  require_cuda(cudaMemcpy(dst.p, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// What one FP8 forward wrote: O's bf16 bits (B, S_q, H_q, d) and the LSE (B, H_q, S_q).
struct Fp8Outputs {
  std::vector<std::uint16_t> o;
  std::vector<float> lse;
};

// The FP8 forward on quantized inputs, launched directly: through launch_forward_e4m3 (the V^T pre-pass, then the
// kernel) or launch_forward_e4m3_vt_in_smem (no V^T scratch: Params::vt stays null). O and the LSE are poisoned
// with NaN bytes first.
Fp8Outputs run_fp8_forward(const flashlab::Problem& problem, const flashlab::E4m3Qkv& in, bool vt_in_smem) {
  const flashlab::Shape& s = problem.shape;
  const std::size_t o_elems = std::size_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::size_t lse_elems = std::size_t(s.batch) * s.heads_q * s.seq_q;
  DeviceBytes q(in.q.size()), k(in.k.size()), v(in.v.size());
  DeviceBytes q_descale(in.q_descale.size() * sizeof(float)), k_descale(in.k_descale.size() * sizeof(float)),
      v_descale(in.v_descale.size() * sizeof(float));
  DeviceBytes o(o_elems * 2), lse(lse_elems * sizeof(float)), counter(2 * sizeof(int));
  const auto vt_bytes = static_cast<std::size_t>(cuda::fa3_ws::fp8_vt_bytes(s.batch, s.heads_kv, s.head_dim, s.seq_k));
  DeviceBytes vt(vt_in_smem ? 0 : vt_bytes);
  upload(q, in.q);
  upload(k, in.k);
  upload(v, in.v);
  upload(q_descale, in.q_descale);
  upload(k_descale, in.k_descale);
  upload(v_descale, in.v_descale);
  require_cuda(cudaMemset(counter.p, 0, 2 * sizeof(int)));
  require_cuda(cudaMemset(o.p, 0xff, o_elems * 2));  // NaN in bf16 and in fp32: an element not written fails
  require_cuda(cudaMemset(lse.p, 0xff, lse_elems * sizeof(float)));
  cuda::fa3_ws::Params params;
  params.q = q.p;
  params.k = k.p;
  params.v = v.p;
  params.o = o.p;
  params.lse = static_cast<float*>(lse.p);
  params.batch = s.batch;
  params.heads_q = s.heads_q;
  params.heads_kv = s.heads_kv;
  params.seq_q = s.seq_q;
  params.seq_k = s.seq_k;
  params.head_dim = s.head_dim;
  params.align = problem.options.causal;
  params.scale = static_cast<float>(problem.softmax_scale());
  params.scale_log2 = static_cast<float>(problem.softmax_scale() * 1.4426950408889634);
  params.tile_counter = static_cast<int*>(counter.p);
  params.q_descale = static_cast<const float*>(q_descale.p);
  params.k_descale = static_cast<const float*>(k_descale.p);
  params.v_descale = static_cast<const float*>(v_descale.p);
  params.vt = vt.p;
  if (vt_in_smem) cuda::fa3_ws::launch_forward_e4m3_vt_in_smem(params, nullptr);
  else cuda::fa3_ws::launch_forward_e4m3(params, nullptr);
  require_cuda(cudaGetLastError());
  require_cuda(cudaDeviceSynchronize());
  Fp8Outputs out{std::vector<std::uint16_t>(o_elems), std::vector<float>(lse_elems)};
  require_cuda(cudaMemcpy(out.o.data(), o.p, o_elems * 2, cudaMemcpyDeviceToHost));
  require_cuda(cudaMemcpy(out.lse.data(), lse.p, lse_elems * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

// Elements whose bytes differ (NaN equals NaN only with the same bits).
template <class T>
std::size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  return n + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

// One problem at each head dim, the V transpose in the producer against the pre-pass's and against the emulation.
void check_fp8_vt_in_smem(flashlab::Shape shape, flashlab::CausalAlign align) {
  using namespace flashlab;
  for (const int d : {64, 128, 256}) {
    shape.head_dim = d;
    Options options;
    options.causal = align;
    const Problem p{.shape = shape, .options = options};
    const std::uint64_t seed = fresh_seed();
    INFO(describe(p, DType::F32, seed));
    const Qkv in = random_qkv(shape, DType::F32, seed);
    const E4m3Qkv quantized = quantize_e4m3_qkv(in);
    const Fp8Outputs pre_pass = run_fp8_forward(p, quantized, /*vt_in_smem=*/false);
    const Fp8Outputs in_smem = run_fp8_forward(p, quantized, /*vt_in_smem=*/true);
    CHECK(differing(in_smem.o, pre_pass.o) == 0);
    CHECK(differing(in_smem.lse, pre_pass.lse) == 0);
    ForwardOut out{HostTensor(q_dims(shape)), HostTensor(lse_dims(shape))};
    REQUIRE(out.o.data.size() == in_smem.o.size());
    REQUIRE(out.lse.data.size() == in_smem.lse.size());
    std::transform(in_smem.o.begin(), in_smem.o.end(), out.o.data.begin(),
                   [](std::uint16_t bits) { return double(bf16_bits_to_float(bits)); });
    std::copy(in_smem.lse.begin(), in_smem.lse.end(), out.lse.data.begin());
    const Fp8KernelCheck c = check_fp8_kernel(p, fp8_attention_emulated(p, in, fp8_kernel_order(p.shape.head_dim)), out);
    REQUIRE(c.emulation.passes());
    MESSAGE("V^T in shared memory, d=" << d << ": O max " << c.o.max_abs << " (emulation " << c.emulation.o.max_abs
                                       << "); LSE max " << c.lse.max_abs << " (limit " << c.lse_limit << ")");
    CHECK(c.o.max_abs <= c.o_limit);
    CHECK(c.lse.max_abs <= c.lse_limit);
    CHECK(c.o.rmse <= kFp8KernelFactor * c.emulation.o.rmse);
  }
}

}  // namespace

TEST_CASE("the FP8 forward with V transposed in the producer: the pre-pass's O and LSE bit for bit, unmasked, GQA, "
          "ragged lengths, many K/V blocks and tiles") {
  if (skip_unless_hopper()) return;
  check_fp8_vt_in_smem(fp8_shape(2, 4, 2, 300, 300), flashlab::CausalAlign::None);
  check_fp8_vt_in_smem(fp8_shape(1, 3, 1, 77, 1000), flashlab::CausalAlign::None);  // MQA; 8 K/V blocks a tile
  check_fp8_vt_in_smem(fp8_shape(1, 2, 2, 1, 1), flashlab::CausalAlign::None);      // one key: 127 zero-filled
  // 168 tiles over at most 132 blocks: the staging buffers' and V^T stages' phases run on from tile to tile.
  check_fp8_vt_in_smem(fp8_shape(4, 6, 3, 800, 256), flashlab::CausalAlign::None);
}

TEST_CASE("the FP8 forward with V transposed in the producer: causal, both alignments, seq_q != seq_k both ways") {
  if (skip_unless_hopper()) return;
  for (const auto align : {flashlab::CausalAlign::TopLeft, flashlab::CausalAlign::BottomRight}) {
    check_fp8_vt_in_smem(fp8_shape(1, 4, 2, 200, 333), align);
    check_fp8_vt_in_smem(fp8_shape(2, 2, 1, 333, 200), align);  // bottom-right: rows (and tiles) that see no key
    check_fp8_vt_in_smem(fp8_shape(1, 2, 2, 513, 513), align);
  }
}
