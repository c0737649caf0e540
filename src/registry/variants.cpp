#include "registry/variants.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "core/layout.hpp"  // dims_string
#include "core/scratch.hpp"
#include "cpu_reference/cpu_variants.hpp"
#include "cpu_reference/fp8.hpp"  // quantize_e4m3_qkv
#ifdef FLASHLAB_HAVE_CUDA
#include "cuda/cuda_variants.hpp"
#include "cuda/device.hpp"
#endif

namespace flashlab {

namespace {

template <std::size_t N>
std::vector<DType> dtypes_of(const DType (&list)[N]) {
  return {list, list + N};
}

// "a", "a and b", "a, b and c" (or "or" for `word`).
std::string spoken_list(const std::vector<std::string>& items, const char* word = "and") {
  std::string list;
  for (std::size_t n = 0; n < items.size(); ++n)
    list += (n == 0 ? "" : n + 1 == items.size() ? std::string(" ") + word + " " : ", ") + items[n];
  return list;
}

// kEverything: a backward with one summation order. kAtomicDq: the fused CUDA kernels whose backward adds
// dQ's partial sums with atomics in arrival order (no deterministic mode).
constexpr Supports kEverything{.causal = true, .dropout = true, .gqa = true, .backward = true, .deterministic = true};
#ifdef FLASHLAB_HAVE_CUDA
constexpr Supports kAtomicDq{.causal = true, .dropout = true, .gqa = true, .backward = true, .deterministic = false};
constexpr Supports kForwardOnly{.causal = true, .dropout = true, .gqa = true, .backward = false};

// A forward-only rung of cuda-fa3-ws's ladder (steps 1-4, and FlashAttention-4's rungs 6 and 7): ladder step kStep
// of the same kernel, with its timeline build, on Hopper only; a block takes query_block_rows query rows.
template <int kStep>
Variant fa3_ws_rung(std::string name, std::string summary, int query_block_rows = cuda::fa3_ws::kQueryRows) {
  return {.name = std::move(name), .device = Device::Cuda, .dtypes = dtypes_of(cuda::fa3_ws::kDTypes),
          .supports = kForwardOnly, .head_dims = HeadDims::listed(cuda::fa3_ws::kHeadDims), .summary = std::move(summary),
          .algorithm = Algorithm::FA2,
          .forward_fn = cuda_fa3_ws_forward<kStep>, .bench_fn = cuda_fa3_ws_bench<kStep>,
          .device_forward_fn = cuda_fa3_ws_forward_on_device<kStep>,
          .needs_compute_capability = cuda::fa3_ws::kComputeCapability, .query_block_rows = query_block_rows,
          .max_query_tiles = cuda::fa3_ws::kMaxQueryTiles, .records_timeline = true,
          .device_scratch_fn = cuda_fa3_ws_device_scratch_bytes};
}

// A row's dtypes and e4m3, for a row with an FP8 forward (its e4m3_head_dims and e4m3_forward_fn).
std::vector<DType> with_e4m3(std::vector<DType> dtypes) {
  dtypes.push_back(DType::E4M3);
  return dtypes;
}
#endif

// "Hopper" for 90: the name of the GPU generation of a compute capability, for the refusal sentence.
std::string gpu_generation(int cc) {
  if (cc >= 100) return "Blackwell";
  if (cc >= 90) return "Hopper";
  if (cc == 89) return "Ada";
  if (cc >= 80) return "Ampere";
  if (cc >= 75) return "Turing";
  if (cc >= 70) return "Volta";
  return "CUDA";
}
std::string describe_capability(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

// "; cuda-fa2 has one" / "; cpu-naive, cpu-fa1 and cpu-fa2 have one": the variants on the same device
// that have a backward for this problem's head dim and dtype, for the "no backward" sentence.
std::string backward_alternatives(const Variant& v, const Problem& p, DType dtype) {
  std::vector<std::string> names;
  for (const Variant& w : variants())
    if (w.device == v.device && w.has_backward() && w.supports_dtype(dtype) && w.head_dims.contains(p.shape.head_dim) &&
        (!w.backward_head_dims || w.backward_head_dims->contains(p.shape.head_dim)))
      names.push_back(w.name);
  if (names.empty()) return "";
  return "; " + spoken_list(names) + (names.size() == 1 ? " has one" : " have one");
}

// "64, 128 and 256" for a list of head dims, "1..256" for a range.
std::string spoken_head_dims(const HeadDims& dims) {
  std::vector<std::string> listed;
  for (int d : dims.only) listed.push_back(std::to_string(d));
  return listed.empty() ? dims.describe() : spoken_list(listed);
}

// "cpu-naive, ... and cuda-fa3-ws": the variants whose backward has a deterministic mode.
std::string deterministic_variants() {
  std::vector<std::string> names;
  for (const Variant& w : variants())
    if (w.has_backward() && w.supports.deterministic) names.push_back(w.name);
  return spoken_list(names);
}

// The e4m3 checks of check_supported, which come before the others: a row with an FP8 forward, forward only,
// without dropout, at the head dims its FP8 kernel is compiled for.
void check_e4m3(const Variant& v, const Problem& p, bool backward) {
  const std::string who = "variant " + v.name;
  std::vector<std::string> own;  // its other dtypes
  for (DType t : v.dtypes)
    if (t != DType::E4M3) own.push_back(to_string(t));
  if (!v.supports_dtype(DType::E4M3) || !v.e4m3_head_dims || v.e4m3_forward_fn == nullptr) {
    std::vector<std::string> fp8;
    for (const Variant& w : variants())
      if (w.supports_dtype(DType::E4M3) && w.e4m3_head_dims && w.e4m3_forward_fn != nullptr) fp8.push_back(w.name);
    throw InputError(who + " takes " + spoken_list(own, "or") + ", not e4m3: " +
                     (fp8.empty() ? std::string("only cuda-fa3-ws has an FP8 (e4m3) kernel, and this build has no CUDA")
                                  : "only " + spoken_list(fp8) + (fp8.size() == 1 ? " has" : " have") +
                                        " an FP8 (e4m3) kernel"));
  }
  if (backward)
    throw InputError(who + " has no FP8 (e4m3) backward pass (FlashAttention-3 ships no FP8 backward either): FP8 "
                     "is forward only, so run the backward in bf16");
  if (p.options.dropout_p > 0)
    throw InputError(who + " has no dropout in its FP8 (e4m3) kernel: drop the dropout, or run in bf16, which has it");
  if (!v.e4m3_head_dims->contains(p.shape.head_dim)) {
    throw InputError(who + " does not support head_dim " + std::to_string(p.shape.head_dim) +
                     " in e4m3: the FP8 kernel takes head dims " + spoken_head_dims(*v.e4m3_head_dims) + " (" +
                     spoken_list(own) + " take " + spoken_head_dims(v.head_dims) + ")");
  }
}

}  // namespace

const std::vector<Variant>& variants() {
  static const std::vector<Variant> table = {
      {.name = "cpu-naive", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "standard attention: S and P materialized (Eigen)",
       .algorithm = Algorithm::Standard,
       .forward_fn = cpu_naive_forward, .backward_fn = cpu_naive_backward},
      {.name = "cpu-fa1", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "tiled, online softmax, K/V loop outer (FA1, Algorithm 1/4)",
       .algorithm = Algorithm::FA1,
       .forward_fn = cpu_fa1_forward, .backward_fn = cpu_fa1_backward},
      {.name = "cpu-fa2", .device = Device::Cpu, .dtypes = dtypes_of(cpu::kDTypes), .supports = kEverything,
       .head_dims = HeadDims::range(1, cpu::kMaxHeadDim), .summary = "tiled, online softmax, Q loop outer (FA2)",
       .algorithm = Algorithm::FA2,
       .forward_fn = cpu_fa2_forward, .backward_fn = cpu_fa2_backward},
#ifdef FLASHLAB_HAVE_CUDA
      // The CUDA rows take their dtypes and head dims from the kernels' own data (cuda/constraints.hpp).
      {.name = "cuda-naive", .device = Device::Cuda, .dtypes = dtypes_of(cuda::unfused::kDTypes),
       .supports = kEverything, .head_dims = HeadDims::range(1, cuda::unfused::kMaxHeadDim),
       .summary = "standard attention on the GPU: S and P in HBM, simple GEMM + softmax kernels",
       .algorithm = Algorithm::Standard,
       .forward_fn = cuda_naive_forward, .backward_fn = cuda_naive_backward, .bench_fn = cuda_naive_bench,
       .device_forward_fn = cuda_naive_forward_on_device, .device_backward_fn = cuda_naive_backward_on_device},
      {.name = "cuda-cublas", .device = Device::Cuda, .dtypes = dtypes_of(cuda::unfused::kDTypes),
       .supports = kEverything, .head_dims = HeadDims::range(1, cuda::unfused::kMaxHeadDim),
       .summary = "standard attention with cuBLAS SGEMMs: the fair unfused baseline", .algorithm = Algorithm::Standard,
       .forward_fn = cuda_cublas_forward, .backward_fn = cuda_cublas_backward, .bench_fn = cuda_cublas_bench,
       .device_forward_fn = cuda_cublas_forward_on_device, .device_backward_fn = cuda_cublas_backward_on_device},
      {.name = "cuda-fa1", .device = Device::Cuda, .dtypes = dtypes_of(cuda::simt::kDTypes), .supports = kAtomicDq,
       .head_dims = HeadDims::range(1, cuda::simt::kMaxHeadDim),
       .summary = "FlashAttention-1 (Algorithms 2/4), fp32 CUDA cores, one block per (batch, head)",
       .algorithm = Algorithm::FA1,
       .forward_fn = cuda_fa1_forward, .backward_fn = cuda_fa1_backward, .bench_fn = cuda_fa1_bench,
       .device_forward_fn = cuda_fa1_forward_on_device, .device_backward_fn = cuda_fa1_backward_on_device},
      {.name = "cuda-fa2-simt", .device = Device::Cuda, .dtypes = dtypes_of(cuda::simt::kDTypes),
       .supports = kAtomicDq, .head_dims = HeadDims::range(1, cuda::simt::kMaxHeadDim),
       .summary = "FlashAttention-2 loop order, fp32 CUDA cores, one block per (batch, head, Q block)",
       .algorithm = Algorithm::FA2,
       .forward_fn = cuda_fa2_simt_forward, .backward_fn = cuda_fa2_simt_backward, .bench_fn = cuda_fa2_simt_bench,
       .device_forward_fn = cuda_fa2_simt_forward_on_device, .device_backward_fn = cuda_fa2_simt_backward_on_device},
      {.name = "cuda-fa2", .device = Device::Cuda, .dtypes = dtypes_of(cuda::fa2::kDTypes), .supports = kAtomicDq,
       .head_dims = HeadDims::listed(cuda::fa2::kHeadDims),
       .summary = "FlashAttention-2 on tensor cores (mma.sync, ldmatrix, cp.async), fp32 accumulation",
       .algorithm = Algorithm::FA2,
       .forward_fn = cuda_fa2_forward, .backward_fn = cuda_fa2_backward, .bench_fn = cuda_fa2_bench,
       .device_forward_fn = cuda_fa2_forward_on_device, .device_backward_fn = cuda_fa2_backward_on_device,
       .device_scratch_fn = cuda_fa2_device_scratch_bytes},
      // cuda-fa3-ws and its ablation ladder: each step adds one scheduling idea to the one before, so
      // `flashlab bench --variants cuda-fa3-ws-step1,...,cuda-fa3-ws` shows what each buys (steps 1-4, 6 and 7: forward only).
      // Each step has a timeline build: `flashlab bench --timeline FILE` records its pipeline.
      fa3_ws_rung<1>("cuda-fa3-ws-step1", "FA3 ladder step 1: one warpgroup, 64 query rows, TMA + wgmma (Hopper)",
                     cuda::fa3_ws::kStep1QueryRows),
      fa3_ws_rung<2>("cuda-fa3-ws-step2", "FA3 ladder step 2: + producer / consumer warpgroups (setmaxnreg), mbarrier "
                                          "pipeline"),
      fa3_ws_rung<3>("cuda-fa3-ws-step3", "FA3 ladder step 3: + ping-pong (the two consumers take turns on the tensor "
                                          "cores)"),
      fa3_ws_rung<4>("cuda-fa3-ws-step4", "FA3 ladder step 4: + intra-warpgroup overlap (softmax of block j+1 during "
                                          "P_j V_j)"),
      // FlashAttention-4's two softmax ideas as rungs of their own: the shipped step with one of them flipped, so that
      // `flashlab bench --variants cuda-fa3-ws-eager-rescale,cuda-fa3-ws,cuda-fa3-ws-exp2-emulated` times each, and
      // --timeline shows the softmax's share of a consumer's time with and without it.
      fa3_ws_rung<6>("cuda-fa3-ws-eager-rescale",
                     "FA4 rung: cuda-fa3-ws without the conditional rescale (O rescaled whenever a row's max rises)"),
      fa3_ws_rung<7>("cuda-fa3-ws-exp2-emulated",
                     "FA4 rung: cuda-fa3-ws with 1 in 8 of P's column groups exponentiated by a cubic on the FMA pipes"),
      // The shipped step also has the backward (a deterministic mode included), at fewer head dims.
      {.name = "cuda-fa3-ws", .device = Device::Cuda, .dtypes = with_e4m3(dtypes_of(cuda::fa3_ws::kDTypes)),
       .supports = kEverything, .head_dims = HeadDims::listed(cuda::fa3_ws::kHeadDims),
       .backward_head_dims = HeadDims::listed(cuda::fa3_ws::kBackwardHeadDims),
       .summary = "FlashAttention-3 design on Hopper: warp-specialized TMA + wgmma, ping-pong, overlap, persistent "
                  "grid (ladder step 5); backward warp-specialized too; an FP8 (e4m3) forward",
       .algorithm = Algorithm::FA2,
       .forward_fn = cuda_fa3_ws_forward<5>, .backward_fn = cuda_fa3_ws_backward, .bench_fn = cuda_fa3_ws_bench<5>,
       .device_forward_fn = cuda_fa3_ws_forward_on_device<5>, .device_backward_fn = cuda_fa3_ws_backward_on_device,
       .needs_compute_capability = cuda::fa3_ws::kComputeCapability, .query_block_rows = cuda::fa3_ws::kQueryRows,
       .max_query_tiles = cuda::fa3_ws::kMaxQueryTiles, .max_backward_rows = cuda::fa3_ws::kMaxBackwardRows,
       .records_timeline = true, .e4m3_head_dims = HeadDims::listed(cuda::fa3_ws::kE4m3HeadDims),
       .e4m3_forward_fn = cuda_fa3_ws_forward_e4m3, .device_e4m3_forward_fn = cuda_fa3_ws_forward_e4m3_on_device,
       .e4m3_timeline_head_dims = HeadDims::listed(cuda::fa3_ws::kE4m3TimelineHeadDims),
       .device_scratch_fn = cuda_fa3_ws_device_scratch_bytes},
#endif
  };
  return table;
}

const char* to_string(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

bool HeadDims::contains(int d) const {
  if (!only.empty()) return std::find(only.begin(), only.end(), d) != only.end();
  return d >= min && d <= max;
}

std::string HeadDims::describe() const {
  std::ostringstream os;
  if (only.empty()) {
    os << min << ".." << max;
  } else {
    for (std::size_t n = 0; n < only.size(); ++n) os << (n ? ", " : "") << only[n];
  }
  return os.str();
}

bool Variant::available() const {
  if (device == Device::Cpu) return true;
  return cuda_device_present() &&
         (needs_compute_capability == 0 || cuda_compute_capability() == needs_compute_capability);
}

bool Variant::supports_dtype(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }

ForwardOut Variant::forward(const Problem& p, DType dtype, const Qkv& in, TrafficObserver* observer) const {
  check_supported(*this, p, dtype, false);
  check_dims(p.shape, in);
  if (dtype == DType::E4M3) return forward_e4m3(p, quantize_e4m3_qkv(in));
  return forward_fn(p, dtype, in, observer);
}

ForwardOut Variant::forward_e4m3(const Problem& p, const E4m3Qkv& in) const {
  check_supported(*this, p, DType::E4M3, false);
  const Shape& s = p.shape;
  const auto require = [](const char* what, std::size_t have, std::int64_t need, const char* extents) {
    if (have != static_cast<std::size_t>(need))
      throw InputError(std::string("the e4m3 ") + what + " holds " + std::to_string(have) +
                       " values but the problem's " + extents + " needs " + std::to_string(need));
  };
  const std::int64_t q = std::int64_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::int64_t kv = std::int64_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
  require("q", in.q.size(), q, "(B, S_q, H_q, d)");
  require("k", in.k.size(), kv, "(B, S_k, H_kv, d)");
  require("v", in.v.size(), kv, "(B, S_k, H_kv, d)");
  require("q's descale", in.q_descale.size(), std::int64_t(s.batch) * s.heads_q, "(B, H_q)");
  require("k's descale", in.k_descale.size(), std::int64_t(s.batch) * s.heads_kv, "(B, H_kv)");
  require("v's descale", in.v_descale.size(), std::int64_t(s.batch) * s.heads_kv, "(B, H_kv)");
  return e4m3_forward_fn(p, in);
}

Grads Variant::backward(const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd,
                        const HostTensor& dO) const {
  check_supported(*this, p, dtype, true);
  check_dims(p.shape, in, &dO);
  if (fwd.o.dims != q_dims(p.shape) || fwd.lse.dims != lse_dims(p.shape))
    throw InputError("the forward outputs passed to the " + name + " backward have shapes " + fwd.o.dims_string() +
                     " and " + fwd.lse.dims_string() + " but the problem needs O (B, S_q, H_q, D) and LSE (B, H_q, S_q)");
  return backward_fn(p, dtype, in, fwd, dO);
}

BenchResult Variant::bench(const Problem& p, DType dtype, const BenchSettings& settings) const {
  if (settings.record_timeline) check_records_timeline(*this, p, dtype, settings.backward);
  check_supported(*this, p, dtype, settings.backward);
  if (!has_device_timer())
    throw InputError("variant " + name + " has no device timer: flashlab bench times it from the host");
  return bench_fn(p, dtype, settings);
}

// The checks the device entry points share: a CPU row cannot read GPU memory, and a CUDA row that can
// run the problem has its device entry point (one without it is a bug of the table).
static void refuse_cpu_row(const Variant& v) {
  if (v.device == Device::Cpu)
    throw InputError("variant " + v.name + " runs on the CPU, so its tensors must be in host memory, not on a CUDA "
                     "device");
}
static void require_entry(const Variant& v, bool present, const char* pass) {
  if (!present) throw std::logic_error("variant " + v.name + " has no device entry point for its " + pass);
}

// The kernels load 16-byte vectors (cp.async, TMA), so every tensor in device memory must start at a
// 16-byte aligned address; cudaMalloc's are, a view at an offset into a larger tensor may not be.
static void require_aligned(const void* data, const char* name) {
  constexpr std::uintptr_t kAlignment = 16;
  if (reinterpret_cast<std::uintptr_t>(data) % kAlignment != 0)
    throw InputError(std::string(name) + " starts at a GPU address that is not a multiple of 16 bytes (a view at an "
                     "offset into a larger tensor?): the kernels load 16-byte vectors, so pass a copy");
}

// What a call's DeviceLaunch asks of the row: a caller's stream or an asynchronous call only from rows that run on
// one, and an asynchronous call brings the scratch the row needs, 256-byte aligned.
static void check_launch(const Variant& v, const Problem& p, DType dtype, bool backward, const DeviceLaunch& launch) {
  if ((launch.stream != nullptr || launch.asynchronous || launch.scratch != nullptr) && !v.runs_on_caller_stream())
    throw InputError("variant " + v.name + " runs its kernels on the legacy default stream and waits for them, so it "
                     "takes no stream, scratch or asynchronous call of the caller's; cuda-fa2 and cuda-fa3-ws do");
  if (!v.runs_on_caller_stream()) return;
  const std::size_t needed = v.device_scratch_bytes(p, dtype, backward);
  if (launch.scratch == nullptr && launch.asynchronous && needed > 0)
    throw InputError("an asynchronous " + std::string(backward ? "backward" : "forward") + " of variant " + v.name +
                     " brings its scratch (" + std::to_string(needed) + " bytes for this problem), since it may not "
                     "allocate or wait");
  if (launch.scratch != nullptr && launch.scratch_bytes < needed)
    throw InputError("the scratch given to variant " + v.name + " has " + std::to_string(launch.scratch_bytes) +
                     " bytes but this problem needs " + std::to_string(needed));
  if (reinterpret_cast<std::uintptr_t>(launch.scratch) % kScratchAlign != 0)
    throw InputError("the scratch given to variant " + v.name + " starts at a GPU address that is not a multiple of " +
                     std::to_string(kScratchAlign) + " bytes");
}

std::size_t Variant::device_scratch_bytes(const Problem& p, DType dtype, bool backward) const {
  if (!runs_on_caller_stream())
    throw std::logic_error("variant " + name + " takes no scratch of the caller's (runs_on_caller_stream)");
  return device_scratch_fn(p, dtype, backward);
}

void Variant::check_device_call(const Problem& p, DType dtype, int device, bool backward) const {
  refuse_cpu_row(*this);
#ifdef FLASHLAB_HAVE_CUDA
  const cuda::CurrentDevice on(device);  // check_supported asks the current device (compute capability)
#else
  (void)device;
#endif
  check_supported(*this, p, dtype, backward);  // in e4m3: the row has an FP8 forward, and this is no backward
  if (dtype == DType::E4M3) {
    require_entry(*this, device_e4m3_forward_fn != nullptr, "FP8 (e4m3) forward");
    return;
  }
  require_entry(*this, backward ? device_backward_fn != nullptr : device_forward_fn != nullptr,
                backward ? "backward" : "forward");
}

void Variant::forward_on_device(const Problem& p, DType dtype, const DeviceForwardIo& io) const {
  check_device_call(p, dtype, io.device, false);
  if (dtype == DType::E4M3)
    throw InputError("variant " + name + "'s FP8 (e4m3) forward reads a descale per (batch, head) of q, k and v "
                     "beside their bytes: run it through forward_e4m3_on_device, which takes them");
  for (auto [data, name] : {std::pair<const void*, const char*>{io.q, "q"}, {io.k, "k"}, {io.v, "v"}, {io.o, "o"},
                            {io.lse, "lse"}})
    require_aligned(data, name);
  check_launch(*this, p, dtype, false, io.launch);
#ifdef FLASHLAB_HAVE_CUDA
  const cuda::CurrentDevice on(io.device);
#endif
  device_forward_fn(p, dtype, io);
}

void Variant::forward_e4m3_on_device(const Problem& p, const DeviceForwardIo& io, const DeviceE4m3Descales& d) const {
  check_device_call(p, DType::E4M3, io.device, false);
  require_e4m3_descales(*this, d.q != nullptr, d.k != nullptr, d.v != nullptr);
  for (auto [data, what] : {std::pair<const void*, const char*>{io.q, "q"}, {io.k, "k"}, {io.v, "v"}, {io.o, "o"},
                            {io.lse, "lse"}})
    require_aligned(data, what);
  for (auto [data, what] : {std::pair<const float*, const char*>{d.q, "q_descale"}, {d.k, "k_descale"},
                            {d.v, "v_descale"}})
    if (reinterpret_cast<std::uintptr_t>(data) % alignof(float) != 0)
      throw InputError(std::string(what) + " starts at a GPU address that is not a multiple of 4 bytes: the kernel "
                       "reads it as float32, so pass a copy");
  check_launch(*this, p, DType::E4M3, false, io.launch);
#ifdef FLASHLAB_HAVE_CUDA
  const cuda::CurrentDevice on(io.device);
#endif
  device_e4m3_forward_fn(p, io, d.q, d.k, d.v);
}

void Variant::backward_on_device(const Problem& p, DType dtype, const DeviceBackwardIo& io) const {
  check_device_call(p, dtype, io.device, true);
  for (auto [data, name] :
       {std::pair<const void*, const char*>{io.q, "q"}, {io.k, "k"}, {io.v, "v"}, {io.o, "o"}, {io.lse, "lse"},
        {io.d_o, "dO"}, {io.dq, "dq"}, {io.dk, "dk"}, {io.dv, "dv"}})
    require_aligned(data, name);
  check_launch(*this, p, dtype, true, io.launch);
#ifdef FLASHLAB_HAVE_CUDA
  const cuda::CurrentDevice on(io.device);
#endif
  device_backward_fn(p, dtype, io);
}

const Variant& find_variant(std::string_view name) {
  for (const Variant& v : variants())
    if (v.name == name) return v;
  std::string known;
  for (const Variant& v : variants()) known += (known.empty() ? "" : ", ") + v.name;
  throw InputError("unknown variant '" + std::string(name) + "': known variants are " + known);
}

void require_e4m3_descales(const Variant& v, bool q_given, bool k_given, bool v_given) {
  std::vector<std::string> missing;
  if (!q_given) missing.push_back("q_descale");
  if (!k_given) missing.push_back("k_descale");
  if (!v_given) missing.push_back("v_descale");
  if (!missing.empty())
    throw InputError("variant " + v.name + "'s FP8 (e4m3) forward needs q_descale, k_descale and v_descale (one float32 "
                     "per (batch, head): (B, H_q) for q, (B, H_kv) for k and v; 1 for bytes stored unscaled), and " +
                     spoken_list(missing) + (missing.size() == 1 ? " is" : " are") + " missing");
}

void check_e4m3_descale(const std::string& name, const std::vector<std::int64_t>& dims, const std::string& dtype_name,
                        const std::vector<std::int64_t>& needed, const std::string& extents) {
  if (dims != needed)
    throw InputError(name + " has shape " + dims_string(dims) + " but the problem needs " + extents + " = " +
                     dims_string(needed) + ": one descale per (batch, head)");
  if (dtype_name != to_string(DType::F32)) throw InputError(name + " is " + dtype_name + " but descales are float32");
}

void check_supported(const Variant& v, const Problem& p, DType dtype, bool backward) {
  validate(p);
  const std::string who = "variant " + v.name;
  if (dtype == DType::E4M3) {
    check_e4m3(v, p, backward);  // then the rest below, as for any dtype (e4m3's head dims are among the row's)
  } else if (!v.supports_dtype(dtype)) {
    std::string list;
    for (DType t : v.dtypes) list += (list.empty() ? "" : ", ") + std::string(to_string(t));
    throw InputError(who + " does not compute in " + to_string(dtype) + ": it supports " + list);
  }
  if (!v.head_dims.contains(p.shape.head_dim))
    throw InputError(who + " does not support head_dim " + std::to_string(p.shape.head_dim) +
                     ": it supports head dims " + v.head_dims.describe());
  if (p.options.causal != CausalAlign::None && !v.supports.causal)
    throw InputError(who + " does not support causal masking");
  if (p.options.dropout_p > 0 && !v.supports.dropout) throw InputError(who + " does not support dropout");
  if (p.shape.heads_q != p.shape.heads_kv && !v.supports.gqa)
    throw InputError(who + " needs heads_q == heads_kv (no grouped-query attention)");
  if (backward && !v.has_backward())
    throw InputError(who + " has no backward pass yet (it is forward only)" + backward_alternatives(v, p, dtype));
  if (backward && v.backward_head_dims && !v.backward_head_dims->contains(p.shape.head_dim))
    throw InputError(who + "'s backward does not support head_dim " + std::to_string(p.shape.head_dim) +
                     ": it supports head dims " + v.backward_head_dims->describe() + " (the forward " +
                     v.head_dims.describe() + ")");
  if (backward && p.options.deterministic && !v.supports.deterministic)
    throw InputError(who + "'s backward adds dQ's partial sums with atomics in arrival order and has no deterministic "
                     "mode; drop --deterministic, or use a variant with one (" + deterministic_variants() + ")");
  if (v.max_query_tiles > 0) {
    const std::int64_t rows = v.query_block_rows;
    const std::int64_t tiles = (p.shape.seq_q + rows - 1) / rows * std::int64_t(p.shape.batch) * p.shape.heads_q;
    if (tiles > v.max_query_tiles)
      throw InputError(who + " runs one tile per (batch, query head, " + std::to_string(rows) +
                       " query rows), and batch x heads_q x ceil(seq_q / " + std::to_string(rows) + ") = " +
                       std::to_string(tiles) + " tiles exceeds its limit of " + std::to_string(v.max_query_tiles));
  }
  if (backward && v.max_backward_rows > 0 &&
      std::int64_t(p.shape.batch) * p.shape.heads_kv > v.max_backward_rows)
    throw InputError(who + "'s backward runs one row of thread blocks per (batch, K/V head), and batch x heads_kv = " +
                     std::to_string(std::int64_t(p.shape.batch) * p.shape.heads_kv) + " exceeds the GPU's limit of " +
                     std::to_string(v.max_backward_rows) + " rows");
  if (v.device == Device::Cuda && !cuda_device_present())
    throw InputError(who + " needs a CUDA GPU and none is available on this machine");
  if (!v.available()) {  // a GPU, but not the one the kernel is compiled for
    const int need = v.needs_compute_capability, have = cuda_compute_capability();
    throw InputError(who + " needs a " + gpu_generation(need) + " GPU (compute capability " + describe_capability(need) +
                     "); this GPU is " + cuda_device_name() + " (compute capability " + describe_capability(have) + ")");
  }
}

void check_records_timeline(const Variant& v, const Problem& p, DType dtype, bool backward) {
  if (backward && v.records_timeline && !v.has_backward())
    throw InputError("variant " + v.name + " has no backward, so --timeline with --backward has nothing to record; "
                     "drop --backward to record its forward, or record cuda-fa3-ws's backward");
  if (!v.records_timeline) {
    std::vector<std::string> names;
    for (const Variant& w : variants())
      if (w.records_timeline) names.push_back(w.name);
    throw InputError("variant " + v.name + " cannot record a timeline: " +
                     (names.empty() ? std::string("only the cuda-fa3-ws variants can, and this build has no CUDA")
                                    : "only " + spoken_list(names) + " can"));
  }
  if (dtype == DType::E4M3 && !(v.e4m3_timeline_head_dims && v.e4m3_timeline_head_dims->contains(p.shape.head_dim)))
    throw InputError("variant " + v.name + " records its FP8 (e4m3) forward's timeline at head dims " +
                     (v.e4m3_timeline_head_dims ? spoken_head_dims(*v.e4m3_timeline_head_dims) : std::string("(none)")) +
                     " only, not " + std::to_string(p.shape.head_dim) +
                     " (at 256 the recording's registers would spill beside the kernel's); bf16 records every head dim");
  if (p.options.dropout_p > 0)
    throw InputError("variant " + v.name + " records a timeline only without dropout (its timeline build has none)");
}

#ifdef FLASHLAB_HAVE_CUDA
bool cuda_device_present() { return cuda::device_present(); }
std::string cuda_device_name() { return cuda::device_name(); }
int cuda_compute_capability() { return cuda::device_compute_capability(); }
int cuda_device_count() { return cuda::device_count(); }
std::shared_ptr<void> allocate_on_cuda_device(std::size_t bytes, int device) {
  return cuda::allocate_poisoned(bytes, device);
}
#else
bool cuda_device_present() { return false; }
std::string cuda_device_name() { return ""; }
int cuda_compute_capability() { return 0; }
int cuda_device_count() { return 0; }
std::shared_ptr<void> allocate_on_cuda_device(std::size_t, int) {
  throw InputError("this FlashLab was built without CUDA, so it cannot hold tensors on a GPU");
}
#endif

}  // namespace flashlab
