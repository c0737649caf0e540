// flashlab verify on a plugin that takes CUDA device memory (FLASHLAB_MEMORY_CUDA). Each call's inputs are copied to
// CUDA device 0, its outputs are poisoned there with NaN (every byte 0xff, which is NaN in f32, f16 and bf16, as the
// host path poisons), the plugin is called with a stream created here, that stream is synchronized, and the outputs
// come back to the host, where verify/ judges them as it judges any kernel: the engine stays host-only. Also --bench's
// timing of such a plugin: CUDA events on the same stream. Compiled only in a build with CUDA (src/cli/CMakeLists.txt);
// every CUDA call is checked.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "cli/verify_plugin.hpp"

namespace flashlab::cli {
namespace {

std::string describe(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

// Throws std::runtime_error naming the call and CUDA's error unless it succeeded.
void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + describe(status));
}
#define VERIFY_CUDA_CHECK(call) check((call), #call)

// Device memory, freed when it goes out of scope.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) { VERIFY_CUDA_CHECK(cudaMalloc(&data_, bytes)); }
  ~DeviceBuffer() { cudaFree(data_); }  // an error here has nowhere to go; a sticky one resurfaces at the next call
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A CUDA event, destroyed when it goes out of scope.
class Event {
 public:
  Event() { VERIFY_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Where the plugin's calls run: a stream on device 0, created here and given to every call, and what verify knows
// about the device between calls. A call that leaves the context broken (a kernel that faulted: every later CUDA call
// fails with the same error until the process exits) is remembered, so that each later case says so in one sentence.
class DeviceSession {
 public:
  DeviceSession() {
    VERIFY_CUDA_CHECK(cudaSetDevice(0));
    // Non-blocking: it does not wait on the default stream, nor the default stream on it. A plugin that launches on
    // the default stream instead of this one is caught in finish().
    VERIFY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~DeviceSession() { cudaStreamDestroy(stream_); }
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;
  cudaStream_t stream() const { return stream_; }

  // Throws when an earlier call broke the context: this case cannot run.
  void require_usable() const {
    if (!broken_.empty()) throw std::runtime_error("not run: " + broken_);
  }
  // A device copy of `host`, queued on the stream (keep `host` until wait()).
  std::unique_ptr<DeviceBuffer> upload(const HostBuffer& host) const {
    auto device = std::make_unique<DeviceBuffer>(host.bytes());
    VERIFY_CUDA_CHECK(cudaMemcpyAsync(device->data(), host.data(), host.bytes(), cudaMemcpyHostToDevice, stream_));
    return device;
  }
  // `bytes` of device memory, every byte 0xff: NaN in f32, f16 and bf16, so an element the plugin never writes fails.
  std::unique_ptr<DeviceBuffer> poisoned(std::size_t bytes) const {
    auto device = std::make_unique<DeviceBuffer>(bytes);
    VERIFY_CUDA_CHECK(cudaMemsetAsync(device->data(), 0xff, bytes, stream_));
    return device;
  }
  void download(void* host, const DeviceBuffer& device) const {
    VERIFY_CUDA_CHECK(cudaMemcpyAsync(host, device.data(), device.bytes(), cudaMemcpyDeviceToHost, stream_));
    VERIFY_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  // Waits for the copies queued so far: the inputs are in place before the plugin runs, whatever stream it uses.
  void wait() const { VERIFY_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // After the plugin's `call` returned rc: waits for the work it queued on the stream, then throws (one sentence)
  // when rc is nonzero, when that work failed, or when the call left work running on a default stream (where verify
  // does not wait for it, so its outputs would be read before they are written).
  void finish(const char* call, int rc, const char* message) {
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    if (synced != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess)
      broken_ = std::string("an earlier ") + call + " left the CUDA context broken (" + describe(synced) +
                "), and CUDA clears that only when the process exits";
    require_ok(rc, call, message);
    if (synced != cudaSuccess)
      throw std::runtime_error(std::string(call) + " returned 0, but the work it queued on the stream failed: " +
                               describe(synced));
    for (cudaStream_t other : {cudaStreamLegacy, cudaStreamPerThread})
      if (cudaStreamQuery(other) == cudaErrorNotReady)
        throw std::runtime_error(std::string(call) + " returned while work it queued on a default stream was still "
                                 "running: launch on args->stream, the stream verify gives (verify waits on that one)");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::string broken_;
};

std::size_t element_bytes(DType dtype) { return dtype == DType::F32 ? sizeof(float) : sizeof(std::uint16_t); }

// `count` values spread evenly over [-sqrt(3), sqrt(3)] (mean 0, variance 1) from a seed (splitmix64): --bench's
// inputs, made quickly enough for tens of millions of elements.
std::vector<float> bench_values(std::size_t count, std::uint64_t seed) {
  std::vector<float> values(count);
  std::uint64_t state = seed;
  const double sqrt3 = std::sqrt(3.0);
  for (float& x : values) {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x = float(sqrt3 * (double(z >> 11) * 0x1p-53 * 2 - 1));
  }
  return values;
}

}  // namespace

KernelUnderTest cuda_kernel_of(const flashlab_attention_plugin& plugin) {
  KernelUnderTest k;
  k.name = plugin.name ? plugin.name : "plugin";
  k.writes_lse = plugin.writes_lse != 0;
  const flashlab_attention_plugin* p = &plugin;
  const auto session = std::make_shared<DeviceSession>();
  if (p->supports)
    k.refuses = plugin_refusal(*p);
  k.forward = [p, session](const Problem& problem, DType dtype, const Qkv& in) {
    session->require_usable();
    const flashlab_problem a = abi_problem(problem, dtype);
    const Shape& s = problem.shape;
    HostBuffer o(in.q.dims, dtype);  // O is shaped like Q; it receives the device's O
    std::vector<float> lse(std::size_t(s.batch) * s.heads_q * s.seq_q);
    const HostBuffer q_host(in.q, dtype), k_host(in.k, dtype), v_host(in.v, dtype);
    const auto q = session->upload(q_host), kk = session->upload(k_host), v = session->upload(v_host);
    const auto o_dev = session->poisoned(o.bytes()), lse_dev = session->poisoned(lse.size() * sizeof(float));
    session->wait();
    flashlab_forward_args args{};
    args.q = q->data(), args.k = kk->data(), args.v = v->data(), args.o = o_dev->data();
    args.lse = p->writes_lse ? static_cast<float*>(lse_dev->data()) : nullptr;
    args.q_strides = contiguous_strides(in.q.dims), args.k_strides = contiguous_strides(in.k.dims);
    args.v_strides = contiguous_strides(in.v.dims), args.o_strides = contiguous_strides(in.q.dims);
    args.stream = session->stream();
    char message[512] = "";
    const int rc = p->forward(&a, &args, message, sizeof message);
    session->finish("forward", rc, message);
    session->download(o.data(), *o_dev);
    session->download(lse.data(), *lse_dev);
    ForwardOut out;
    out.o = o.tensor();
    out.lse = HostTensor(lse_dims(s));
    for (std::size_t n = 0; n < lse.size(); ++n) out.lse.data[n] = lse[n];
    return out;
  };
  if (p->backward)
    k.backward = [p, session](const Problem& problem, DType dtype, const Qkv& in, const ForwardOut& fwd,
                              const HostTensor& d_o) {
      session->require_usable();
      const flashlab_problem a = abi_problem(problem, dtype);
      HostBuffer dq(in.q.dims, dtype), dk(in.k.dims, dtype), dv(in.v.dims, dtype);  // receive the device's
      const std::vector<float> lse(fwd.lse.data.begin(), fwd.lse.data.end());
      const HostBuffer q_host(in.q, dtype), k_host(in.k, dtype), v_host(in.v, dtype), o_host(fwd.o, dtype),
          d_o_host(d_o, dtype);
      const auto q = session->upload(q_host), kk = session->upload(k_host), v = session->upload(v_host),
                 o = session->upload(o_host), dout = session->upload(d_o_host);
      const auto lse_dev = std::make_unique<DeviceBuffer>(lse.size() * sizeof(float));
      VERIFY_CUDA_CHECK(cudaMemcpyAsync(lse_dev->data(), lse.data(), lse_dev->bytes(), cudaMemcpyHostToDevice,
                                        session->stream()));
      const auto dq_dev = session->poisoned(dq.bytes()), dk_dev = session->poisoned(dk.bytes()),
                 dv_dev = session->poisoned(dv.bytes());
      session->wait();
      flashlab_backward_args args{};
      args.q = q->data(), args.k = kk->data(), args.v = v->data(), args.o = o->data(), args.d_o = dout->data();
      args.lse = static_cast<const float*>(lse_dev->data());
      args.dq = dq_dev->data(), args.dk = dk_dev->data(), args.dv = dv_dev->data();
      args.q_strides = contiguous_strides(in.q.dims), args.k_strides = contiguous_strides(in.k.dims);
      args.v_strides = contiguous_strides(in.v.dims), args.o_strides = contiguous_strides(in.q.dims);
      args.stream = session->stream();
      char message[512] = "";
      const int rc = p->backward(&a, &args, message, sizeof message);
      session->finish("backward", rc, message);
      session->download(dq.data(), *dq_dev);
      session->download(dk.data(), *dk_dev);
      session->download(dv.data(), *dv_dev);
      return Grads{dq.tensor(), dk.tensor(), dv.tensor()};
    };
  return k;
}

PluginTimes time_cuda_plugin(const flashlab_attention_plugin& plugin, const Problem& problem, DType dtype,
                             bool backward) {
  const Shape& s = problem.shape;
  const std::vector<std::int64_t> q_shape = q_dims(s), kv_shape = kv_dims(s);
  const std::size_t q_count = std::size_t(s.batch) * s.seq_q * s.heads_q * s.head_dim;
  const std::size_t kv_count = std::size_t(s.batch) * s.seq_k * s.heads_kv * s.head_dim;
  const std::size_t lse_bytes = std::size_t(s.batch) * s.heads_q * s.seq_q * sizeof(float);
  const std::size_t bytes = element_bytes(dtype);
  DeviceSession session;
  // Q, K, V and dO are views of one pool of random values, kShift elements apart: made once, uploaded once.
  constexpr std::size_t kShift = 4096;
  const HostBuffer pool_host(bench_values(std::max(q_count, kv_count) + 3 * kShift, 1), dtype);
  const auto pool = session.upload(pool_host);
  const char* base = static_cast<const char*>(pool->data());
  const auto o = session.poisoned(q_count * bytes), lse = session.poisoned(lse_bytes);
  session.wait();
  const flashlab_problem a = abi_problem(problem, dtype);
  flashlab_forward_args fwd{};
  fwd.q = base, fwd.k = base + kShift * bytes, fwd.v = base + 2 * kShift * bytes, fwd.o = o->data();
  fwd.lse = plugin.writes_lse ? static_cast<float*>(lse->data()) : nullptr;
  fwd.q_strides = fwd.o_strides = contiguous_strides(q_shape);
  fwd.k_strides = fwd.v_strides = contiguous_strides(kv_shape);
  fwd.stream = session.stream();

  Event start, stop;
  // One call, timed by events on the stream around it.
  const auto timed = [&](const char* call, const std::function<int(char*, std::size_t)>& make_call) {
    char message[512] = "";
    VERIFY_CUDA_CHECK(cudaEventRecord(start.get(), session.stream()));
    const int rc = make_call(message, sizeof message);
    VERIFY_CUDA_CHECK(cudaEventRecord(stop.get(), session.stream()));
    session.finish(call, rc, message);
    float ms = 0;
    VERIFY_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    return double(ms);
  };
  PluginTimes times;
  times.forward_ms = bench_median_ms([&] {
    return timed("forward", [&](char* message, std::size_t size) { return plugin.forward(&a, &fwd, message, size); });
  });
  if (!backward || !plugin.backward) return times;
  if (!plugin.writes_lse) {
    times.no_backward = "the plugin writes no LSE, which its backward reads";
    return times;
  }
  const auto dq = session.poisoned(q_count * bytes), dk = session.poisoned(kv_count * bytes),
             dv = session.poisoned(kv_count * bytes);
  session.wait();
  flashlab_backward_args bwd{};
  bwd.q = fwd.q, bwd.k = fwd.k, bwd.v = fwd.v, bwd.o = o->data(), bwd.d_o = base + 3 * kShift * bytes;
  bwd.lse = fwd.lse;  // the plugin's own forward's O and LSE
  bwd.dq = dq->data(), bwd.dk = dk->data(), bwd.dv = dv->data();
  bwd.q_strides = fwd.q_strides, bwd.k_strides = fwd.k_strides, bwd.v_strides = fwd.v_strides;
  bwd.o_strides = fwd.o_strides;
  bwd.stream = session.stream();
  times.backward_ms = bench_median_ms([&] {
    return timed("backward", [&](char* message, std::size_t size) { return plugin.backward(&a, &bwd, message, size); });
  });
  return times;
}

}  // namespace flashlab::cli
