// flashlab verify --plugin libmine.so: someone else's attention kernel, loaded through the C ABI of
// include/flashlab/plugin.h, run through verify/verify.hpp's suite and judged by FlashLab's rule; the
// report says which cases fail, what they have in common, and the first element out of bounds. This file
// is the command and plugins on host memory; verify_cuda.cpp runs plugins on CUDA device memory (a CUDA
// build only) and verify_bench.cpp times a plugin that passed (--bench), beside PyTorch's SDPA (sdpa_child.cpp).
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "cli/commands.hpp"
#include "cli/verify_plugin.hpp"
#include "core/half.hpp"

namespace flashlab::cli {
namespace {

// A loaded plugin: the library stays open as long as the description is used.
class Plugin {
 public:
  Plugin(const std::string& path, const std::string& symbol) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) throw InputError("cannot load the plugin " + path + ": " + dlerror());
    auto entry = reinterpret_cast<flashlab_plugin_entry>(dlsym(handle_, symbol.c_str()));
    if (!entry)
      throw InputError("the plugin " + path + " exports no function '" + symbol +
                       "' (a plugin exports `const flashlab_attention_plugin* " + symbol + "(void)`; --symbol names another)");
    plugin_ = entry();
    if (!plugin_) throw InputError("the plugin's " + symbol + "() returned no description");
    if (plugin_->abi_version != FLASHLAB_PLUGIN_ABI_VERSION)
      throw InputError("the plugin " + path + " was built for plugin ABI " + std::to_string(plugin_->abi_version) +
                       "; this flashlab speaks ABI " + std::to_string(FLASHLAB_PLUGIN_ABI_VERSION) +
                       ": rebuild it against this include/flashlab/plugin.h");
    if (!plugin_->forward) throw InputError("the plugin " + path + " has no forward function");
    if (plugin_->memory != FLASHLAB_MEMORY_HOST && plugin_->memory != FLASHLAB_MEMORY_CUDA)
      throw InputError("the plugin " + path + " says its tensors live in memory " + std::to_string(plugin_->memory) +
                       ", which is neither FLASHLAB_MEMORY_HOST (0) nor FLASHLAB_MEMORY_CUDA (1)");
  }
  ~Plugin() {
    if (handle_) dlclose(handle_);
  }
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;
  const flashlab_attention_plugin& operator*() const { return *plugin_; }
  const flashlab_attention_plugin* operator->() const { return plugin_; }

 private:
  void* handle_ = nullptr;
  const flashlab_attention_plugin* plugin_ = nullptr;
};

// A plugin on host memory as verify's kernel: each call gets host buffers in its element type, the outputs
// poisoned with NaN, and what it wrote goes back to verify as doubles.
KernelUnderTest host_kernel_of(const flashlab_attention_plugin& plugin) {
  KernelUnderTest k;
  k.name = plugin.name ? plugin.name : "plugin";
  k.writes_lse = plugin.writes_lse != 0;
  const flashlab_attention_plugin* p = &plugin;
  if (p->supports)
    k.refuses = plugin_refusal(*p);
  k.forward = [p](const Problem& problem, DType dtype, const Qkv& in) {
    const flashlab_problem a = abi_problem(problem, dtype);
    HostBuffer q(in.q, dtype), kk(in.k, dtype), v(in.v, dtype), o(in.q.dims, dtype);  // O is shaped like Q
    const Shape& s = problem.shape;
    std::vector<float> lse(std::size_t(s.batch) * s.heads_q * s.seq_q, NAN);  // poisoned: a row left unwritten fails
    flashlab_forward_args args{};
    args.q = q.data(), args.k = kk.data(), args.v = v.data(), args.o = o.data();
    args.lse = p->writes_lse ? lse.data() : nullptr;
    args.q_strides = q.strides(), args.k_strides = kk.strides(), args.v_strides = v.strides(), args.o_strides = o.strides();
    char message[512] = "";
    require_ok(p->forward(&a, &args, message, sizeof message), "forward", message);
    ForwardOut out;
    out.o = o.tensor();
    out.lse = HostTensor(lse_dims(s));
    for (std::size_t n = 0; n < lse.size(); ++n) out.lse.data[n] = lse[n];
    return out;
  };
  if (p->backward)
    k.backward = [p](const Problem& problem, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& d_o) {
      const flashlab_problem a = abi_problem(problem, dtype);
      HostBuffer q(in.q, dtype), kk(in.k, dtype), v(in.v, dtype), o(fwd.o, dtype), dout(d_o, dtype);
      HostBuffer dq(in.q.dims, dtype), dk(in.k.dims, dtype), dv(in.v.dims, dtype);
      std::vector<float> lse(fwd.lse.data.begin(), fwd.lse.data.end());
      flashlab_backward_args args{};
      args.q = q.data(), args.k = kk.data(), args.v = v.data(), args.o = o.data(), args.d_o = dout.data();
      args.lse = lse.data();
      args.dq = dq.data(), args.dk = dk.data(), args.dv = dv.data();
      args.q_strides = q.strides(), args.k_strides = kk.strides(), args.v_strides = v.strides(), args.o_strides = o.strides();
      char message[512] = "";
      require_ok(p->backward(&a, &args, message, sizeof message), "backward", message);
      return Grads{dq.tensor(), dk.tensor(), dv.tensor()};
    };
  return k;
}

// The plugin as verify's kernel, on the memory it says it takes; one sentence when this flashlab or this machine
// cannot give it that memory.
KernelUnderTest kernel_of(const flashlab_attention_plugin& plugin, const std::string& path) {
  if (plugin.memory == FLASHLAB_MEMORY_HOST) return host_kernel_of(plugin);
#ifdef FLASHLAB_HAVE_CUDA
  if (!cuda_device_present())
    throw InputError("the plugin " + path + " takes CUDA device memory (FLASHLAB_MEMORY_CUDA), and this machine has "
                     "no CUDA device to run it on");
  return cuda_kernel_of(plugin);
#else
  throw InputError("the plugin " + path + " takes CUDA device memory (FLASHLAB_MEMORY_CUDA), and this flashlab was "
                   "built without CUDA: build FlashLab with the CUDA toolkit (nvcc) to verify it, or give the plugin "
                   "host memory (FLASHLAB_MEMORY_HOST)");
#endif
}

}  // namespace

// ---- what the verify files share (verify_plugin.hpp) ---------------------------------------------------------

flashlab_dtype abi_dtype(DType t) {
  switch (t) {
    case DType::F16: return FLASHLAB_DTYPE_F16;
    case DType::BF16: return FLASHLAB_DTYPE_BF16;
    case DType::F32: return FLASHLAB_DTYPE_F32;
    default: throw InputError(std::string("plugins take f32, f16 or bf16, not ") + to_string(t));
  }
}

flashlab_problem abi_problem(const Problem& p, DType dtype) {
  const Shape& s = p.shape;
  flashlab_problem a{};
  a.batch = s.batch, a.heads_q = s.heads_q, a.heads_kv = s.heads_kv, a.seq_q = s.seq_q, a.seq_k = s.seq_k;
  a.head_dim = s.head_dim;
  a.causal = p.options.causal == CausalAlign::TopLeft       ? FLASHLAB_CAUSAL_TOP_LEFT
             : p.options.causal == CausalAlign::BottomRight ? FLASHLAB_CAUSAL_BOTTOM_RIGHT
                                                            : FLASHLAB_CAUSAL_NONE;
  a.scale = p.softmax_scale();
  a.dtype = abi_dtype(dtype);
  return a;
}

void require_ok(int rc, const char* call, const char* message) {
  if (rc != 0)
    throw std::runtime_error(std::string(call) + " returned " + std::to_string(rc) + (message[0] ? ": " + std::string(message) : ""));
}

std::function<std::string(const Problem&, DType)> plugin_refusal(const flashlab_attention_plugin& plugin) {
  const flashlab_attention_plugin* p = &plugin;
  return [p](const Problem& problem, DType dtype) -> std::string {
    if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return "not a plugin dtype";
    const flashlab_problem a = abi_problem(problem, dtype);
    char message[512] = "";
    if (p->supports(&a, message, sizeof message) == 0) return "";
    return message[0] ? message : "refused, without saying why";
  };
}

HostBuffer::HostBuffer(const HostTensor& t, DType d) : dtype_(d), dims_(t.dims) {
  if (d == DType::F32) f32_.assign(t.data.begin(), t.data.end());
  else
    for (const double x : t.data)
      bits_.push_back(d == DType::F16 ? float_to_f16_bits(float(x)) : float_to_bf16_bits(float(x)));
}
HostBuffer::HostBuffer(std::vector<std::int64_t> dims, DType d) : HostBuffer(HostTensor(std::move(dims), NAN), d) {}
HostBuffer::HostBuffer(const std::vector<float>& values, DType d) : dtype_(d), dims_{std::int64_t(values.size())} {
  if (d == DType::F32) f32_ = values;
  else
    for (const float x : values) bits_.push_back(d == DType::F16 ? float_to_f16_bits(x) : float_to_bf16_bits(x));
}
void* HostBuffer::data() { return dtype_ == DType::F32 ? static_cast<void*>(f32_.data()) : static_cast<void*>(bits_.data()); }
const void* HostBuffer::data() const { return const_cast<HostBuffer*>(this)->data(); }
std::size_t HostBuffer::bytes() const {
  return dtype_ == DType::F32 ? f32_.size() * sizeof(float) : bits_.size() * sizeof(std::uint16_t);
}
flashlab_strides HostBuffer::strides() const { return contiguous_strides(dims_); }

flashlab_strides contiguous_strides(const std::vector<std::int64_t>& dims) {
  return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
}
HostTensor HostBuffer::tensor() const {
  HostTensor t(dims_);
  for (std::size_t n = 0; n < t.data.size(); ++n)
    t.data[n] = dtype_ == DType::F32 ? f32_[n] : dtype_ == DType::F16 ? f16_bits_to_float(bits_[n]) : bf16_bits_to_float(bits_[n]);
  return t;
}

// ---- the command ----------------------------------------------------------------------------------------------

void VerifyCommand::add_to(CLI::App& app) {
  app.add_option("--plugin", plugin, "shared library implementing include/flashlab/plugin.h, on host memory or (in a "
                                     "build with CUDA, on a machine with a GPU) CUDA device memory")->required();
  app.add_option("--symbol", symbol, "the function the plugin exports (default flashlab_plugin)");
  app.add_option("--suite", suite, "quick (about 20 cases) or full (about 200)");
  seed_option = app.add_option("--seed", seed, "seed of every case's inputs (default: fresh, printed)");
  app.add_option("--dtype", dtypes, "dtypes to try, comma-separated: f32, f16, bf16 (default all three; those the "
                                    "plugin refuses are listed)");
  app.add_option("--head-dims", head_dims, "head dims to try, comma-separated (default 32,64,128,256)");
  app.add_flag("--no-backward", no_backward, "check the forward only, even when the plugin has a backward");
  app.add_flag("--bench", bench,
               "when every case passes: time the plugin's forward (and forward + backward) on large problems in the "
               "dtypes it passed, causal and not, beside FlashLab's own variants on the same device (CUDA plugins: "
               "B*N = 16k tokens, H*d = 2048, N = 1024, 4096, 16384; host plugins: B*N = 1024, H*d = 128, N = 256, "
               "1024), and PyTorch's scaled_dot_product_attention on the same problems (run by --python): ms, "
               "TFLOP/s, and the time over the fastest FlashLab variant's and over SDPA's");
  bench_seq_option = app.add_option("--bench-seq", bench_seq,
                                    "with --bench: the sequence lengths N to time, comma-separated (B is the tokens "
                                    "over N, at least 1)");
  python_option = app.add_option("--python", python,
                                 "with --bench: the Python interpreter, with PyTorch, that times SDPA beside the plugin "
                                 "(default python3); without PyTorch the table says why SDPA is not timed");
}

int VerifyCommand::run(std::ostream& out, std::ostream& err) const {
  VerifyRequest request;
  request.suite = parse_verify_suite(suite);
  request.seed = seed_option && seed_option->count() > 0 ? seed : fresh_seed();
  request.backward = !no_backward;
  if (!dtypes.empty()) {
    request.dtypes.clear();
    for (const std::string& d : split_list(dtypes)) {
      const DType t = parse_dtype(d);
      abi_dtype(t);  // one sentence for f64
      request.dtypes.push_back(t);
    }
  }
  if (!head_dims.empty()) {
    request.head_dims.clear();
    for (const std::string& d : split_list(head_dims)) {
      int v = 0;
      try {
        v = std::stoi(d);
      } catch (const std::exception&) {
        throw InputError("--head-dims takes whole numbers, not '" + d + "'");
      }
      if (v <= 0 || v > 256) throw InputError("--head-dims: " + d + " is not a head dim between 1 and 256");
      request.head_dims.push_back(v);
    }
  }
  std::vector<int> bench_seqs;
  if (bench_seq_option && bench_seq_option->count() > 0) {
    if (!bench) throw InputError("--bench-seq sets the lengths --bench times: give --bench too");
    bench_seqs = parse_int_list(bench_seq, "--bench-seq");
  }
  if (python_option && python_option->count() > 0) {
    if (!bench) throw InputError("--python picks the interpreter --bench times PyTorch's SDPA with: give --bench too");
    if (python.empty()) throw InputError("--python takes an interpreter's name or path, not an empty string");
  }
  const Plugin plugin(this->plugin, symbol);
  const KernelUnderTest kernel = kernel_of(*plugin, this->plugin);
  if (plugin->memory == FLASHLAB_MEMORY_CUDA)
    out << "on " << cuda_device_name() << " (CUDA device 0): the plugin's tensors are in its memory\n";
  const VerifyReport report = verify(kernel, request);

  out << verify_report_text(report, this->plugin);
  if (bench) {
    out << "\n";
    if (report.ok())
      print_verify_bench(out, err, *plugin, report, bench_seqs, python);
    else
      out << "bench: not timed, since some case failed (a kernel is timed once it is right)\n";
  }
  return report.ok() ? kExitOk : kExitCheckFailed;
}

}  // namespace flashlab::cli
