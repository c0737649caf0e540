#pragma once
// The one table of variants. The CLI (check, run, bench), the tests and the app all read it: adding a
// kernel means adding one row in variants.cpp, and it shows up everywhere.
//
// The registry is the only layer that knows every implementation. Each row takes the kernel's
// constraints (dtypes, head dims) from the data the kernel exports, and the row's checked entry points
// (Variant::forward, backward, bench) test a problem against them once, before dispatch: the
// implementations below never look themselves up here.
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/bench.hpp"
#include "core/device_io.hpp"
#include "core/fp8.hpp"  // E4m3Qkv
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "model/traffic.hpp"

namespace flashlab {

enum class Device { Cpu, Cuda };
const char* to_string(Device);

struct Supports {
  bool causal = false, dropout = false, gqa = false, backward = false;
  // Its backward gives bit-identical gradients run to run under Options::deterministic: always (one
  // summation order), or by a mode it switches on for it. False: it adds dQ with atomics in arrival order.
  bool deterministic = false;
};

// Head dims a variant accepts: every d in [min, max], or only the listed ones when `only` is set.
struct HeadDims {
  int min = 1, max = 256;
  std::vector<int> only;
  static HeadDims range(int min, int max) { return HeadDims{min, max, {}}; }
  static HeadDims listed(std::span<const int> dims) { return HeadDims{0, 0, {dims.begin(), dims.end()}}; }
  bool contains(int d) const;
  std::string describe() const;  // "1..256" or "64, 128"
};

// The implementation behind a row (unchecked: the row checks before calling).
using ForwardFn = ForwardOut (*)(const Problem&, DType, const Qkv&, TrafficObserver*);
using BackwardFn = Grads (*)(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
using BenchFn = BenchResult (*)(const Problem&, DType, const BenchSettings&);
// The same kernels on tensors in the caller's device memory (CUDA rows); they return when the device has
// finished.
using DeviceForwardFn = void (*)(const Problem&, DType, const DeviceForwardIo&);
using DeviceBackwardFn = void (*)(const Problem&, DType, const DeviceBackwardIo&);
// The FP8 forward on quantized host inputs (core/fp8.hpp): O in bf16 values, LSE in fp32.
using E4m3ForwardFn = ForwardOut (*)(const Problem&, const E4m3Qkv&);
// The same on the caller's device memory: io.q, io.k, io.v e4m3 bytes, io.o bf16, io.lse fp32, and the descales,
// fp32 (B, H_q), (B, H_kv), (B, H_kv) row-major, in the same device's memory. Returns when the device has finished.
using DeviceE4m3ForwardFn = void (*)(const Problem&, const DeviceForwardIo&, const float* q_descale,
                                     const float* k_descale, const float* v_descale);
// The scratch bytes a device call of the row takes (DeviceLaunch::scratch), for a forward (in e4m3: the FP8 one) or
// a backward. Rows with one run on the stream a call names (DeviceLaunch::stream) and may be asynchronous.
using DeviceScratchFn = std::size_t (*)(const Problem&, DType, bool backward);

// The descales of an FP8 forward's inputs in device memory (E4m3Qkv's q_descale, k_descale, v_descale, on a GPU):
// one fp32 per (batch, head), row-major, (B, H_q) for q, (B, H_kv) for k and v.
struct DeviceE4m3Descales {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
};

struct Variant {
  std::string name;  // stable: scripts and lessons use it
  Device device = Device::Cpu;
  std::vector<DType> dtypes;
  Supports supports;
  HeadDims head_dims;
  // Head dims of its backward where they are fewer than head_dims (nullopt: the same).
  std::optional<HeadDims> backward_head_dims = std::nullopt;
  std::string summary;  // one line
  Algorithm algorithm = Algorithm::FA2;  // its loop nest, hence its modeled HBM traffic
  ForwardFn forward_fn = nullptr;
  BackwardFn backward_fn = nullptr;  // nullptr when !supports.backward
  BenchFn bench_fn = nullptr;        // nullptr: timed from the host around forward/backward
  DeviceForwardFn device_forward_fn = nullptr;    // CUDA rows
  DeviceBackwardFn device_backward_fn = nullptr;  // CUDA rows with a backward
  // 0: any GPU. Otherwise the one compute capability (major * 10 + minor) the kernel is compiled for,
  // e.g. 90 for sm_90a code (wgmma, setmaxnreg), which runs on compute capability 9.0 alone.
  int needs_compute_capability = 0;
  // Launch limits the kernel exports (cuda/constraints.hpp); 0: none. A problem that needs more than
  // max_query_tiles tiles (blocks of query_block_rows query rows, per batch and query head) or, in the backward,
  // more than max_backward_rows rows of thread blocks (one per batch and K/V head) is refused in one sentence.
  int query_block_rows = 0;
  std::int64_t max_query_tiles = 0;
  std::int64_t max_backward_rows = 0;
  // Its bench can record one run's pipeline (BenchSettings::record_timeline, `flashlab bench --timeline`):
  // a timeline build of the kernel exists (the cuda-fa3-ws ladder; the backward too where it has one).
  bool records_timeline = false;
  // Its FP8 forward, where it has one (DType::E4M3 is then in dtypes, and only then): the head dims it takes and
  // its entry point on quantized inputs. Forward only, without dropout; causal and GQA as the row says.
  std::optional<HeadDims> e4m3_head_dims = std::nullopt;
  E4m3ForwardFn e4m3_forward_fn = nullptr;
  DeviceE4m3ForwardFn device_e4m3_forward_fn = nullptr;  // its FP8 forward on device memory (CUDA rows)
  // The head dims at which its FP8 forward's timeline build exists (records_timeline with e4m3).
  std::optional<HeadDims> e4m3_timeline_head_dims = std::nullopt;
  // CUDA rows whose device entries run on a caller's stream (DeviceLaunch): their scratch; nullptr for the rows that
  // run on the legacy default stream alone and wait for their kernels.
  DeviceScratchFn device_scratch_fn = nullptr;

  // CPU: always; CUDA: built with CUDA, a device is present, and it has the compute capability needed.
  bool available() const;
  bool supports_dtype(DType) const;
  bool has_backward() const { return supports.backward && backward_fn != nullptr; }
  bool has_device_timer() const { return bench_fn != nullptr; }

  // Checked entry points: check_supported and the tensors' shapes, then the implementation. Bad input
  // throws InputError (one sentence) before anything is allocated or launched. In DType::E4M3 the forward
  // quantizes the inputs first (quantize_e4m3_qkv: Q per (batch, query head), K and V per (batch, kv head)) and
  // runs forward_e4m3 on them.
  ForwardOut forward(const Problem&, DType, const Qkv&, TrafficObserver* = nullptr) const;
  // The FP8 forward on inputs already quantized (what `flashlab run --save-quantized` writes): check_supported
  // in e4m3, then the sizes of the bytes and descales against the problem.
  ForwardOut forward_e4m3(const Problem&, const E4m3Qkv&) const;
  Grads backward(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO) const;
  // Needs has_device_timer(); with settings.record_timeline also check_records_timeline.
  BenchResult bench(const Problem&, DType, const BenchSettings&) const;

  // Checked entry points on tensors in the memory of CUDA device io.device that the caller owns and has
  // shaped for the problem (core/layout.hpp shape_of_inputs): no host copy. A CPU row is refused with
  // one sentence; otherwise that device is made current for the call, check_supported runs against it,
  // then the kernels. They return when the device has finished (an error raised while a kernel ran
  // throws std::runtime_error here), unless io.launch asks for an asynchronous call (runs_on_caller_stream rows).
  // forward_on_device refuses DType::E4M3 with one sentence: the FP8 forward reads descales, which
  // forward_e4m3_on_device takes.
  void forward_on_device(const Problem&, DType, const DeviceForwardIo&) const;
  void backward_on_device(const Problem&, DType, const DeviceBackwardIo&) const;
  // The FP8 forward on the caller's device memory: io.q, io.k, io.v e4m3 bytes (row-major (B, S, H, d)), io.o
  // bf16, io.lse fp32, and the descales. check_device_call in e4m3, then a missing descale is one sentence, then
  // the tensors' alignment; the row's entry allocates the V^T scratch its pre-pass writes.
  void forward_e4m3_on_device(const Problem&, const DeviceForwardIo&, const DeviceE4m3Descales&) const;
  // What they check before touching memory, for a caller to ask before allocating the outputs: a CPU row
  // is refused, then check_supported runs against device `device` (in e4m3: a row with an FP8 forward, no
  // backward, no dropout, its FP8 head dims).
  void check_device_call(const Problem&, DType, int device, bool backward) const;

  // Whether its device entries run on the stream a call names and can return before the kernels finish
  // (DeviceLaunch): what a library caller such as the PyTorch operators needs. A launch that names a stream or asks
  // for an asynchronous call is refused in one sentence by the other rows, and an asynchronous one without the scratch
  // device_scratch_bytes asks for, by any row.
  bool runs_on_caller_stream() const { return device_scratch_fn != nullptr; }
  // The scratch a device call of this problem takes (0: none); needs runs_on_caller_stream(), after check_device_call.
  std::size_t device_scratch_bytes(const Problem&, DType, bool backward) const;
};

const std::vector<Variant>& variants();
// Throws InputError listing the known names when `name` is not one. (A string_view, not a const
// std::string&: a reference to a temporary name would make GCC 13 warn about the returned reference.)
const Variant& find_variant(std::string_view name);

// Throws InputError (one sentence) unless the variant can run this problem in this dtype:
// head dim, dtype, causal, dropout, GQA, backward, availability, compute capability. In e4m3 first: a row
// with an FP8 forward (the sentence names those that have one), no backward, no dropout, a head dim of
// e4m3_head_dims.
void check_supported(const Variant&, const Problem&, DType, bool backward);

// Throws InputError (one sentence, naming those missing) unless the descales of an FP8 forward's q, k and v are all
// given: Variant::forward_e4m3_on_device asks it, and a caller may ask it before allocating the outputs.
void require_e4m3_descales(const Variant&, bool q_given, bool k_given, bool v_given);
// Throws InputError (one sentence) unless the descale `name` of an FP8 forward has the shape `needed` ((B, H_q) for
// q's, (B, H_kv) for k's and v's, spelled `extents`) and is float32 (`dtype_name`: how the caller's front end names
// its dtype; "f32" passes). The Python module and the PyTorch operators ask it of the tensors they are given.
void check_e4m3_descale(const std::string& name, const std::vector<std::int64_t>& dims, const std::string& dtype_name,
                        const std::vector<std::int64_t>& needed, const std::string& extents);

// Throws InputError (one sentence) unless a bench of the variant can record a timeline of this problem:
// a variant with records_timeline (the sentence names those that have it) and, for a `backward` bench, a
// backward to record (e4m3 has none); in e4m3 a head dim of e4m3_timeline_head_dims; no dropout (the timeline
// builds have none).
void check_records_timeline(const Variant&, const Problem&, DType, bool backward);

bool cuda_device_present();      // false when built without CUDA
std::string cuda_device_name();  // e.g. "NVIDIA H100 80GB HBM3"; "" without a device
int cuda_compute_capability();   // major * 10 + minor, e.g. 90; 0 without a device
int cuda_device_count();         // 0 when built without CUDA

// `bytes` of memory on CUDA device `device` for a call's outputs, every byte 0xff (NaN in every float
// type, so an element no kernel writes fails a check), freed when the last owner lets go. Throws
// InputError when the device is out of memory or does not exist, or when built without CUDA.
std::shared_ptr<void> allocate_on_cuda_device(std::size_t bytes, int device);

}  // namespace flashlab
