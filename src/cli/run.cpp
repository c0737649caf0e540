// flashlab run: one variant on .npy inputs, writing .npy outputs, so NumPy / PyTorch users can check
// FlashLab against their own code and the other way round. The shape comes from the files:
// q (B, S_q, H_q, D), k and v (B, S_k, H_kv, D), dO like q. With --dtype e4m3 the files' values are quantized
// per head (cpu_reference/fp8.hpp, quantize_e4m3_qkv) and run through the variant's FP8 forward; --save-quantized
// writes what the kernel was given.
#include "cli/commands.hpp"
#include "core/layout.hpp"
#include "core/npy.hpp"
#include "cpu_reference/fp8.hpp"

namespace flashlab::cli {
namespace {

// "q ('q.npy')": how an input is named in a sentence about it.
std::string input_name(const char* name, const std::string& path) { return std::string(name) + " ('" + path + "')"; }

// Bf16 has no NumPy dtype: its (exactly representable) values are written as float32; so are the outputs of an
// e4m3 run, whose O the FP8 kernel writes in bf16.
DType file_dtype(DType compute) { return compute == DType::BF16 || compute == DType::E4M3 ? DType::F32 : compute; }

}  // namespace

void RunCommand::add_to(CLI::App& app) {
  app.add_option("--variant", variant, "variant name (see `flashlab check --list`)")->required();
  app.add_option("--q", q, "queries, (B, S_q, H_q, D) .npy")->required();
  app.add_option("--k", k, "keys, (B, S_k, H_kv, D) .npy")->required();
  app.add_option("--v", v, "values, (B, S_k, H_kv, D) .npy")->required();
  app.add_option("--out", out, "output O, written (B, S_q, H_q, D)")->required();
  app.add_option("--lse", lse, "also write the log-sum-exp, (B, H_q, S_q) float32");
  app.add_option("--dout", dout, "upstream gradient dO, (B, S_q, H_q, D): runs the backward pass too");
  app.add_option("--dq", dq, "gradient dQ output (with --dout)");
  app.add_option("--dk", dk, "gradient dK output (with --dout)");
  app.add_option("--dv", dv, "gradient dV output (with --dout)");
  options.add_to(app, "seed of the dropout mask (default 0)");
  app.add_option("--dtype", dtype,
                 "precision the variant computes in: f64, f32, f16, bf16 or e4m3 (default: the files' dtype); "
                 "inputs are rounded to it and outputs written in it, except bf16 outputs, which are "
                 "written as float32 files (NumPy has no bfloat16). e4m3 (fp8) is the FP8 forward of cuda-fa3-ws "
                 "(head dims 64, 128 and 256, no backward, no dropout): q is scaled and rounded to e4m3 per (batch, "
                 "query head), k and v per (batch, kv head), and O's bf16 values are written as float32");
  app.add_option("--save-quantized", save_quantized,
                 "with --dtype e4m3: also write the kernel's inputs into folder DIR: q.npy, k.npy and v.npy hold the "
                 "e4m3 bytes as uint8 (NumPy has no float8: view them as float8_e4m3fn), q_descale.npy (B, H_q), "
                 "k_descale.npy and v_descale.npy (B, H_kv) the float32 descales (value = e4m3 x descale of its "
                 "batch and head)")
      ->type_name("DIR");
}

int RunCommand::run(std::ostream& os, std::ostream& err) const {
  const bool backward = !dout.empty();
  if (backward && (dq.empty() || dk.empty() || dv.empty()))
    throw InputError("--dout runs the backward pass, which needs --dq, --dk and --dv to write the gradients to");
  if (!backward && (!dq.empty() || !dk.empty() || !dv.empty()))
    throw InputError("--dq, --dk and --dv need --dout, the upstream gradient of the output");
  const bool dtype_given = !dtype.empty();
  const DType asked = dtype_given ? parse_dtype(dtype) : DType::F64;  // F64: unused without --dtype
  const bool e4m3 = dtype_given && asked == DType::E4M3;
  if (!save_quantized.empty() && !e4m3)
    throw InputError("--save-quantized writes the e4m3 inputs of an FP8 run: give --dtype e4m3 too");

  const Variant& var = find_variant(variant);
  NpyArray nq = read_npy(q), nk = read_npy(k), nv = read_npy(v);
  NpyArray ndo;
  if (backward) ndo = read_npy(dout);

  // The shape, from the files (shape_of_inputs names any file that disagrees with the others).
  Problem p;
  const InputDims dO_dims{input_name("dO", dout), ndo.tensor.dims};
  p.shape = shape_of_inputs(Layout::BSHD, {input_name("q", q), nq.tensor.dims}, {input_name("k", k), nk.tensor.dims},
                            {input_name("v", v), nv.tensor.dims}, backward ? &dO_dims : nullptr);
  p.options = options.options(0);
  Qkv in{std::move(nq.tensor), std::move(nk.tensor), std::move(nv.tensor)};
  validate(p);

  DType compute = nq.dtype;
  if (dtype_given) {
    compute = asked;
  } else {
    for (const NpyArray* a : {&nk, &nv})
      if (a->dtype != nq.dtype)
        throw InputError("q is " + std::string(to_string(nq.dtype)) + " but another input is " + to_string(a->dtype) +
                         ": pass --dtype to choose the precision to compute in");
    if (backward && ndo.dtype != nq.dtype)
      throw InputError("q is " + std::string(to_string(nq.dtype)) + " but dO is " + to_string(ndo.dtype) +
                       ": pass --dtype to choose the precision to compute in");
  }
  check_supported(var, p, compute, backward);
  require_memory(host_bytes_for_run(var, p.shape, compute, backward), "variant " + var.name + " on this problem");

  ForwardOut fwd;
  std::vector<std::string> quantized_files;
  if (e4m3) {
    // Quantized per head as the FP8 emulation does (finite values only: a NaN or Inf is one sentence here,
    // since it would be the amax of its head); the kernel's inputs are written first when asked for.
    check_supported(var, p, DType::E4M3, false);  // refused before any file is written
    const E4m3Qkv quantized = quantize_e4m3_qkv(in);
    if (!save_quantized.empty()) quantized_files = write_e4m3_npy(save_quantized, p.shape, quantized);
    fwd = var.forward_e4m3(p, quantized);
  } else {
    // NaN or +-Inf in the files: computed on as PyTorch does, with one sentence per tensor on stderr.
    const std::string nan_rows = "the outputs of rows that see them will be NaN";
    warn_non_finite(err, in.q, "q", nan_rows);
    warn_non_finite(err, in.k, "k", nan_rows);
    warn_non_finite(err, in.v, "v", nan_rows);
    if (backward) warn_non_finite(err, ndo.tensor, "dO", "the gradients that depend on them will be NaN");
    for (HostTensor* t : {&in.q, &in.k, &in.v}) round_to(*t, compute);
    fwd = var.forward(p, compute, in, nullptr);
  }
  if (fwd.o.dims != q_dims(p.shape) || fwd.lse.dims != lse_dims(p.shape))
    throw std::runtime_error("variant " + var.name + " returned outputs of the wrong shape");
  const DType written = file_dtype(compute);
  write_npy(out, fwd.o, written);
  os << var.name << " (" << to_string(compute)
     << (e4m3 ? ": q, k, v quantized per (batch, head), O computed in bf16" : "") << "), " << describe(p.shape)
     << ", causal " << to_string(p.options.causal) << "\n";
  for (const std::string& file : quantized_files)
    os << "wrote " << file << (file.find("descale") != std::string::npos ? " f32 descales" : " e4m3 bytes as uint8")
       << "\n";
  os << "wrote " << out << " " << fwd.o.dims_string() << " " << to_string(written)
     << (e4m3 ? " (the kernel's bf16 values)" : "") << "\n";
  if (!lse.empty()) {
    write_npy(lse, fwd.lse, DType::F32);
    os << "wrote " << lse << " " << fwd.lse.dims_string() << " f32\n";
  }
  if (backward) {
    round_to(ndo.tensor, compute);
    const Grads g = var.backward(p, compute, in, fwd, ndo.tensor);
    const std::pair<const std::string*, const HostTensor*> outputs[] = {{&dq, &g.dq}, {&dk, &g.dk}, {&dv, &g.dv}};
    for (auto [path, t] : outputs) {
      write_npy(*path, *t, written);
      os << "wrote " << *path << " " << t->dims_string() << " " << to_string(written) << "\n";
    }
  }
  return kExitOk;
}

}  // namespace flashlab::cli
