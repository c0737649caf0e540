// flashlab verify --plugin libmine.so: someone else's attention kernel, loaded through the C ABI of
// include/flashlab/plugin.h, run through registry/verify.hpp's suite and judged by FlashLab's rule; the
// report says which cases fail, what they have in common, and the first element out of bounds.
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>

#include "cli/commands.hpp"
#include "core/half.hpp"
#include "flashlab/plugin.h"
#include "verify/verify.hpp"

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
    if (plugin_->memory != FLASHLAB_MEMORY_HOST)
      throw InputError("the plugin " + path + " takes CUDA device memory; this flashlab verifies plugins on host "
                       "memory only (FLASHLAB_MEMORY_HOST)");
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

// A (B, S, H, D) tensor in the plugin's element type, contiguous, and its strides.
struct Buffer {
  std::vector<float> f32;
  std::vector<std::uint16_t> bits;
  DType dtype;
  std::vector<std::int64_t> dims;
  Buffer(const HostTensor& t, DType d) : dtype(d), dims(t.dims) {
    if (d == DType::F32) f32.assign(t.data.begin(), t.data.end());
    else
      for (const double x : t.data)
        bits.push_back(d == DType::F16 ? float_to_f16_bits(float(x)) : float_to_bf16_bits(float(x)));
  }
  Buffer(std::vector<std::int64_t> shape, DType d) : Buffer(HostTensor(std::move(shape), NAN), d) {}  // poisoned
  void* data() { return dtype == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(bits.data()); }
  flashlab_strides strides() const { return {dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1}; }
  HostTensor tensor() const {
    HostTensor t(dims);
    for (std::size_t n = 0; n < t.data.size(); ++n)
      t.data[n] = dtype == DType::F32 ? f32[n] : dtype == DType::F16 ? f16_bits_to_float(bits[n]) : bf16_bits_to_float(bits[n]);
    return t;
  }
};

void call(int rc, const char* what, const char* message) {
  if (rc != 0)
    throw std::runtime_error(std::string(what) + " returned " + std::to_string(rc) + (message[0] ? ": " + std::string(message) : ""));
}

KernelUnderTest kernel_of(const Plugin& plugin) {
  KernelUnderTest k;
  k.name = plugin->name ? plugin->name : "plugin";
  k.writes_lse = plugin->writes_lse != 0;
  const flashlab_attention_plugin* p = &*plugin;
  if (p->supports)
    k.refuses = [p](const Problem& problem, DType dtype) -> std::string {
      if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return "not a plugin dtype";
      const flashlab_problem a = abi_problem(problem, dtype);
      char message[512] = "";
      if (p->supports(&a, message, sizeof message) == 0) return "";
      return message[0] ? message : "refused, without saying why";
    };
  k.forward = [p](const Problem& problem, DType dtype, const Qkv& in) {
    const flashlab_problem a = abi_problem(problem, dtype);
    Buffer q(in.q, dtype), kk(in.k, dtype), v(in.v, dtype), o(in.q.dims, dtype);  // O is shaped like Q
    const Shape& s = problem.shape;
    std::vector<float> lse(std::size_t(s.batch) * s.heads_q * s.seq_q, NAN);  // poisoned: a row left unwritten fails
    flashlab_forward_args args{};
    args.q = q.data(), args.k = kk.data(), args.v = v.data(), args.o = o.data();
    args.lse = p->writes_lse ? lse.data() : nullptr;
    args.q_strides = q.strides(), args.k_strides = kk.strides(), args.v_strides = v.strides(), args.o_strides = o.strides();
    char message[512] = "";
    call(p->forward(&a, &args, message, sizeof message), "forward", message);
    ForwardOut out;
    out.o = o.tensor();
    out.lse = HostTensor({s.batch, s.heads_q, s.seq_q});
    for (std::size_t n = 0; n < lse.size(); ++n) out.lse.data[n] = lse[n];
    return out;
  };
  if (p->backward)
    k.backward = [p](const Problem& problem, DType dtype, const Qkv& in, const ForwardOut& fwd, const HostTensor& d_o) {
      const flashlab_problem a = abi_problem(problem, dtype);
      Buffer q(in.q, dtype), kk(in.k, dtype), v(in.v, dtype), o(fwd.o, dtype), dout(d_o, dtype);
      Buffer dq(in.q.dims, dtype), dk(in.k.dims, dtype), dv(in.v.dims, dtype);
      std::vector<float> lse(fwd.lse.data.begin(), fwd.lse.data.end());
      flashlab_backward_args args{};
      args.q = q.data(), args.k = kk.data(), args.v = v.data(), args.o = o.data(), args.d_o = dout.data();
      args.lse = lse.data();
      args.dq = dq.data(), args.dk = dk.data(), args.dv = dv.data();
      args.q_strides = q.strides(), args.k_strides = kk.strides(), args.v_strides = v.strides(), args.o_strides = o.strides();
      char message[512] = "";
      call(p->backward(&a, &args, message, sizeof message), "backward", message);
      return Grads{dq.tensor(), dk.tensor(), dv.tensor()};
    };
  return k;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

}  // namespace

void VerifyCommand::add_to(CLI::App& app) {
  app.add_option("--plugin", plugin, "shared library implementing include/flashlab/plugin.h")->required();
  app.add_option("--symbol", symbol, "the function the plugin exports (default flashlab_plugin)");
  app.add_option("--suite", suite, "quick (about 20 cases) or full (about 200)");
  seed_option = app.add_option("--seed", seed, "seed of every case's inputs (default: fresh, printed)");
  app.add_option("--dtype", dtypes, "dtypes to try, comma-separated: f32, f16, bf16 (default all three; those the "
                                    "plugin refuses are listed)");
  app.add_option("--head-dims", head_dims, "head dims to try, comma-separated (default 32,64,128,256)");
  app.add_flag("--no-backward", no_backward, "check the forward only, even when the plugin has a backward");
}

int VerifyCommand::run(std::ostream& out, std::ostream& err) const {
  (void)err;
  VerifyRequest request;
  request.suite = parse_verify_suite(suite);
  request.seed = seed_option && seed_option->count() > 0 ? seed : fresh_seed();
  request.backward = !no_backward;
  if (!dtypes.empty()) {
    request.dtypes.clear();
    for (const std::string& d : split(dtypes)) {
      const DType t = parse_dtype(d);
      abi_dtype(t);  // one sentence for f64
      request.dtypes.push_back(t);
    }
  }
  if (!head_dims.empty()) {
    request.head_dims.clear();
    for (const std::string& d : split(head_dims)) {
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
  const Plugin plugin(this->plugin, symbol);
  const KernelUnderTest kernel = kernel_of(plugin);
  const VerifyReport report = verify(kernel, request);

  out << verify_report_text(report, this->plugin);
  return report.ok() ? kExitOk : kExitCheckFailed;
}

}  // namespace flashlab::cli
