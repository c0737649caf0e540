// The `flashlab` command, run in-process through run_cli: each bad-input case gets exit code 2 and one
// sentence naming the problem; `run` writes what calling the variant directly computes; `check` passes
// and lists every CPU variant; `trace --json` reports what TrafficCounter counts; `trace --ring` what the
// ring's schedule costs.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "core/fp8.hpp"
#include "core/half.hpp"
#include "core/npy.hpp"
#include "core/scratch.hpp"
#include "cpu_reference/fp8.hpp"
#include "cpu_reference/naive.hpp"
#include "registry/check.hpp"
#include "registry/variants.hpp"
#include "cpu_reference/tiled.hpp"
#include "model/gpu.hpp"
#include "model/ring.hpp"
#include "model/traffic.hpp"
#include "registry/gpu_models.hpp"

using namespace flashlab;

namespace {

struct CliResult {
  int code = -1;
  std::string out, err;
};

CliResult cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult r;
  r.code = run_cli(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// Asserts bad input: exit code 2, one line on stderr starting "flashlab: " and containing `what`.
void expect_bad_input(const std::vector<std::string>& args, const std::string& what) {
  const CliResult r = cli(args);
  INFO("args: " << args.front() << " ...  stderr: " << r.err);
  CHECK(r.code == 2);
  CHECK(r.err.rfind("flashlab: ", 0) == 0);
  CHECK(r.err.find(what) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

// A scratch folder, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() / ("flashlab_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

int count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(needle) != std::string::npos;
  return n;
}

// ---- e4m3 on the CPU: the real FP8 kernel needs a Hopper GPU, so its row's logic is checked on a stand-in ----

// A stand-in FP8 kernel: attention in double on the operands it is given (e4m3 value x descale), O rounded to
// bf16 and the LSE to float as the kernel stores them, O scaled by g_planted_o_scale to plant a wrong result.
// It keeps what it was given in g_e4m3_given.
double g_planted_o_scale = 1.0;
E4m3Qkv g_e4m3_given;

HostTensor dequantized(const std::vector<std::uint8_t>& bytes, const std::vector<float>& descale,
                       std::vector<std::int64_t> dims) {
  HostTensor t(std::move(dims));
  const std::int64_t S = t.dims[1], H = t.dims[2], D = t.dims[3];
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::int64_t b = std::int64_t(n) / (S * H * D), h = std::int64_t(n) / D % H;
    t.data[n] = double(e4m3_bits_to_float(bytes[n])) * descale[std::size_t(b * H + h)];
  }
  return t;
}

ForwardOut stand_in_e4m3_forward(const Problem& p, const E4m3Qkv& in) {
  g_e4m3_given = in;
  const Qkv deq{dequantized(in.q, in.q_descale, q_dims(p.shape)), dequantized(in.k, in.k_descale, kv_dims(p.shape)),
                dequantized(in.v, in.v_descale, kv_dims(p.shape))};
  ForwardOut f = naive_forward<double>(p, deq);
  for (double& x : f.o.data) x = round_to_bf16(x * g_planted_o_scale);
  for (double& x : f.lse.data) x = static_cast<float>(x);
  return f;
}

// cuda-fa3-ws's row as the table has it, for the e4m3 checks, on the CPU (so that check_supported asks for no GPU)
// and in every build: f16, bf16 and e4m3; head dims 64, 128, 256, in e4m3 too (its timeline at 64 and 128).
Variant fp8_row_on_cpu(const std::string& name = "cuda-fa3-ws") {
  static const int kHeadDims[] = {64, 128, 256}, kE4m3Dims[] = {64, 128, 256}, kE4m3TimelineDims[] = {64, 128};
  Variant v = find_variant("cpu-naive");
  v.name = name;
  v.dtypes = {DType::F16, DType::BF16, DType::E4M3};
  v.head_dims = HeadDims::listed(kHeadDims);
  v.e4m3_head_dims = HeadDims::listed(kE4m3Dims);
  v.e4m3_forward_fn = stand_in_e4m3_forward;
  v.records_timeline = true;
  v.e4m3_timeline_head_dims = HeadDims::listed(kE4m3TimelineDims);
  return v;
}

}  // namespace

TEST_CASE("check passes on a small problem and its table has every CPU variant") {
  for (const char* causal : {"none", "top-left", "bottom-right"}) {
    SUBCASE(causal) {
      // seq_q > seq_k with bottom-right alignment leaves fully masked rows (LSE = -inf).
      const CliResult r =
          cli({"check", "--batch",    "2",  "--heads",  "4",    "--heads-kv", "2",   "--seq-q", "37",   "--seq-k",
               "29",    "--head-dim", "24", "--causal", causal, "--dropout",  "0.1", "--seed",  "4242", "--backward"});
      INFO(r.out << r.err);
      CHECK(r.code == 0);
      CHECK(r.out.find("seed 4242") != std::string::npos);
      Problem p;
      p.shape = Shape{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 37, .seq_k = 29, .head_dim = 24};
      p.options.causal = parse_causal(causal);
      p.options.dropout_p = 0.1;
      int expected_pass = 0;
      for (const Variant& v : variants()) {
        CHECK(r.out.find(v.name) != std::string::npos);  // run or SKIP, every row of the table shows
        for (DType t : v.dtypes) {
          if (t == DType::E4M3) continue;  // check runs e4m3 only when asked for
          try {
            check_supported(v, p, t, true);
            expected_pass += 5;  // O, LSE, dQ, dK, dV
          } catch (const InputError&) {
            CHECK(v.device != Device::Cpu);  // every CPU variant runs this problem
          }
        }
      }
      CHECK(count_lines_with(r.out, " PASS") == expected_pass);
      CHECK(count_lines_with(r.out, "FAIL") == 0);
      CHECK(count_lines_with(r.out, "e4m3") == 0);  // not unless asked for, even where a row takes it
    }
  }
}

TEST_CASE("check --list prints every variant of the table") {
  const CliResult r = cli({"check", "--list"});
  CHECK(r.code == 0);
  for (const Variant& v : variants()) {
    CHECK(r.out.find(v.name) != std::string::npos);
    CHECK(r.out.find(v.summary) != std::string::npos);
  }
}

TEST_CASE("the device entry points refuse CPU rows, and every CUDA row has them") {
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 4, .seq_k = 4, .head_dim = 8};
  for (const Variant& v : variants()) {
    INFO("variant " << v.name);
    if (v.device == Device::Cpu) {
      CHECK_THROWS_WITH_AS(v.forward_on_device(p, DType::F32, DeviceForwardIo{}),
                           doctest::Contains("runs on the CPU, so its tensors must be in host memory"), InputError);
      CHECK_THROWS_WITH_AS(v.backward_on_device(p, DType::F32, DeviceBackwardIo{}),
                           doctest::Contains("runs on the CPU"), InputError);
    } else {
      CHECK(bool(v.device_forward_fn));
      CHECK((v.device_backward_fn != nullptr) == v.has_backward());
    }
  }
  if (!cuda_device_present())
    CHECK_THROWS_AS(allocate_on_cuda_device(64, 0), InputError);  // built without CUDA, or no device here
}

TEST_CASE("an FP8 forward's descale is refused unless it is float32 (B, H), in one sentence") {
  const std::vector<std::int64_t> needed{2, 8};
  CHECK_NOTHROW(check_e4m3_descale("q_descale", {2, 8}, "f32", needed, "(B, H_q)"));
  CHECK_THROWS_WITH_AS(check_e4m3_descale("q_descale", {2, 2}, "f32", needed, "(B, H_q)"),
                       "q_descale has shape (2, 2) but the problem needs (B, H_q) = (2, 8): one descale per (batch, head)",
                       InputError);
  CHECK_THROWS_WITH_AS(check_e4m3_descale("k_descale", {2, 8, 1}, "f32", needed, "(B, H_kv)"),
                       doctest::Contains("k_descale has shape (2, 8, 1)"), InputError);
  CHECK_THROWS_WITH_AS(check_e4m3_descale("v_descale", {2, 8}, "f16", needed, "(B, H_kv)"),
                       "v_descale is f16 but descales are float32", InputError);
}

TEST_CASE("cuda-fa2 and cuda-fa3-ws run on a caller's stream, with the scratch their layouts count") {
  Problem p;
  p.shape = Shape{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 100, .seq_k = 300, .head_dim = 128};
  for (const Variant& v : variants()) {
    INFO("variant " << v.name);
    const bool on_stream = v.name == "cuda-fa2" || v.name.rfind("cuda-fa3-ws", 0) == 0;
    CHECK(v.runs_on_caller_stream() == on_stream);
    if (!on_stream) {
      CHECK_THROWS_AS((void)v.device_scratch_bytes(p, DType::BF16, false), std::logic_error);
      continue;
    }
    const std::size_t forward = v.device_scratch_bytes(p, DType::BF16, false);
    if (v.name == "cuda-fa2") {
      CHECK(forward == 0);
      // D_i (B, H_q, S_q) and dQ's fp32 sums (B, S_q, H_q, d), the second from a 256-byte boundary.
      const std::size_t d_i = 2 * 4 * 100 * sizeof(float);
      CHECK(v.device_scratch_bytes(p, DType::BF16, true) ==
            (d_i + kScratchAlign - 1) / kScratchAlign * kScratchAlign + 2 * 100 * 4 * 128 * sizeof(float));
    } else {
      CHECK(forward == 2 * sizeof(int));  // the persistent grid's tile counter
    }
  }
#ifdef FLASHLAB_HAVE_CUDA
  const Variant& fa3 = find_variant("cuda-fa3-ws");
  // The FP8 forward adds V^T after the counter; the backward's four arrays hold at least dQ's fp32 sums.
  CHECK(fa3.device_scratch_bytes(p, DType::E4M3, false) > kScratchAlign + 2 * 300 * 128);
  CHECK(fa3.device_scratch_bytes(p, DType::BF16, true) >= 2 * 100 * 4 * 128 * sizeof(float));
#endif
}

TEST_CASE("check lists a variant that cannot run the problem as SKIP unless it was named") {
  // f16 is not a CPU dtype: unnamed CPU variants are skipped with the reason; named ones are an error.
  const CliResult r = cli({"check", "--seq-q", "8", "--head-dim", "8", "--dtype", "f16"});
  if (!cuda_device_present()) {
    CHECK(r.code == 2);  // nothing could run: that is not a pass
    CHECK(count_lines_with(r.out, "SKIP: variant cpu-fa2 does not compute in f16") == 1);
  }
  expect_bad_input({"check", "--variants", "cpu-fa2", "--dtype", "f16"}, "does not compute in f16");
}

TEST_CASE("bad input: one sentence and exit code 2") {
  TempDir dir;
  const Shape s{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 8, .seq_k = 6, .head_dim = 16};
  const Qkv in = random_qkv(s, DType::F32, 3);
  write_npy(dir.file("q.npy"), in.q, DType::F32);
  write_npy(dir.file("k.npy"), in.k, DType::F32);
  write_npy(dir.file("v.npy"), in.v, DType::F32);
  const std::vector<std::string> qkv = {"--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")};
  auto run_with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--variant", "cpu-fa2", "--out", dir.file("o.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto with_qkv = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = run_with(qkv);
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };

  SUBCASE("mismatched shapes") {
    write_npy(dir.file("v_bad.npy"), HostTensor({1, 6, 2, 15}), DType::F32);
    expect_bad_input(run_with({"--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v_bad.npy")}),
                     "v ('" + dir.file("v_bad.npy") + "') has shape (1, 6, 2, 15)");
    write_npy(dir.file("k_batch.npy"), HostTensor({2, 6, 2, 16}), DType::F32);
    expect_bad_input(run_with({"--q", dir.file("q.npy"), "--k", dir.file("k_batch.npy"), "--v", dir.file("v.npy")}),
                     "k ('" + dir.file("k_batch.npy") + "') has shape (2, 6, 2, 16)");
    write_npy(dir.file("do_bad.npy"), HostTensor({1, 8, 4, 8}), DType::F32);
    expect_bad_input(with_qkv({"--dout", dir.file("do_bad.npy"), "--dq", dir.file("a"), "--dk", dir.file("b"), "--dv",
                               dir.file("c")}),
                     "dO ('" + dir.file("do_bad.npy") + "') has shape");
    write_npy(dir.file("q3.npy"), HostTensor({8, 16}), DType::F32);
    expect_bad_input(run_with({"--q", dir.file("q3.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")}),
                     "must be 4-d");
  }
  SUBCASE("heads_q not a multiple of heads_kv") {
    expect_bad_input({"check", "--heads", "3", "--heads-kv", "2"}, "multiple of heads_kv");
    write_npy(dir.file("k3.npy"), HostTensor({1, 6, 3, 16}), DType::F32);
    write_npy(dir.file("v3.npy"), HostTensor({1, 6, 3, 16}), DType::F32);
    expect_bad_input(run_with({"--q", dir.file("q.npy"), "--k", dir.file("k3.npy"), "--v", dir.file("v3.npy")}),
                     "multiple of the key/value heads");
  }
  SUBCASE("a problem past a kernel's launch limits (as cuda/constraints.hpp exports them for cuda-fa3-ws)") {
    Variant limited = variants().front();
    limited.query_block_rows = 128;
    limited.max_query_tiles = 16;    // cuda-fa3-ws: 2^31 - 1
    limited.max_backward_rows = 6;   // cuda-fa3-ws: 65535
    Problem p;
    p.shape = Shape{.batch = 2, .heads_q = 4, .heads_kv = 4, .seq_q = 257, .seq_k = 64, .head_dim = 64};
    // 2 x 4 x ceil(257 / 128) = 24 tiles > 16.
    CHECK_THROWS_WITH_AS(check_supported(limited, p, DType::F32, false),
                         doctest::Contains("runs one tile per (batch, query head, 128 query rows), and batch x heads_q x "
                                           "ceil(seq_q / 128) = 24 tiles exceeds its limit of 16"),
                         InputError);
    p.shape.seq_q = 256;  // 16 tiles: at the limit, accepted
    CHECK_NOTHROW(check_supported(limited, p, DType::F32, false));
    // The backward's rows: 2 x 4 = 8 > 6; the forward alone does not count them.
    CHECK_THROWS_WITH_AS(check_supported(limited, p, DType::F32, true),
                         doctest::Contains("'s backward runs one row of thread blocks per (batch, K/V head), and batch "
                                           "x heads_kv = 8 exceeds the GPU's limit of 6 rows"),
                         InputError);
    p.shape.heads_kv = 2;  // GQA: 2 x 2 = 4 rows
    CHECK_NOTHROW(check_supported(limited, p, DType::F32, true));
  }
  SUBCASE("unsupported head dim") {
    expect_bad_input({"check", "--head-dim", "300"}, "head_dim 300 is not supported");
    expect_bad_input({"bench", "--variants", "cpu-fa2", "--head-dim", "512", "--seq", "64"}, "head_dim 512");
    // A variant that supports fewer head dims than the problem's (as the CUDA kernels do).
    Variant narrow = variants().front();
    narrow.head_dims = HeadDims{1, 256, {64, 128}};
    Problem p;
    p.shape.head_dim = 80;
    CHECK_THROWS_WITH_AS(check_supported(narrow, p, DType::F32, false),
                         doctest::Contains("does not support head_dim 80: it supports head dims 64, 128"), InputError);
    // Through the command, for any variant of the table with a narrower head-dim set (the CUDA kernels).
    for (const Variant& v : variants()) {
      for (int d = 1; d <= 256; ++d) {
        if (v.head_dims.contains(d)) continue;
        expect_bad_input({"check", "--variants", v.name, "--head-dim", std::to_string(d), "--seq-q", "8"},
                         "does not support head_dim " + std::to_string(d));
        break;
      }
    }
  }
  SUBCASE("malformed or wrong-dtype .npy") {
    std::ofstream(dir.file("garbage.npy")) << "this is not numpy";
    expect_bad_input(run_with({"--q", dir.file("garbage.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")}),
                     "not a .npy file");
    {
      // A valid .npy of int32: NumPy's exact layout, dtype '<i4'.
      std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 1, 1, 1), }";
      while ((10 + header.size() + 1) % 64) header += ' ';
      header += '\n';
      std::string bytes =
          std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + char(0) + header + std::string(4, '\0');
      std::ofstream(dir.file("int.npy"), std::ios::binary) << bytes;
    }
    expect_bad_input(run_with({"--q", dir.file("int.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")}),
                     "dtype '<i4'");
    // f16 files are valid .npy, but no CPU variant computes in f16.
    for (const char* name : {"q16.npy", "k16.npy", "v16.npy"})
      write_npy(dir.file(name), HostTensor({1, 4, 1, 8}), DType::F16);
    expect_bad_input(run_with({"--q", dir.file("q16.npy"), "--k", dir.file("k16.npy"), "--v", dir.file("v16.npy")}),
                     "does not compute in f16");
    // Mixed file dtypes without --dtype.
    write_npy(dir.file("k64.npy"), in.k, DType::F64);
    expect_bad_input(run_with({"--q", dir.file("q.npy"), "--k", dir.file("k64.npy"), "--v", dir.file("v.npy")}),
                     "pass --dtype");
    expect_bad_input(run_with({"--q", dir.file("missing.npy"), "--k", dir.file("k.npy"), "--v", dir.file("v.npy")}),
                     "cannot be opened");
  }
  SUBCASE("SRAM too small for one tile") {
    expect_bad_input({"trace", "--algorithm", "fa2", "--seq-q", "128", "--head-dim", "64", "--sram-bytes", "256"},
                     "an SRAM of 256 bytes");
  }
  SUBCASE("a size that won't fit in memory") {
    // naive attention's S and P for 3M x 3M keys: petabytes.
    expect_bad_input({"check", "--variants", "cpu-naive", "--seq-q", "3000000", "--head-dim", "1"},
                     "memory is available");
  }
  SUBCASE("unknown variant, dtype, causal, algorithm, flag") {
    expect_bad_input({"check", "--variants", "cpu-fa9"}, "unknown variant 'cpu-fa9': known variants are cpu-naive");
    expect_bad_input(with_qkv({"--dtype", "int8"}), "unknown dtype 'int8'");
    expect_bad_input({"check", "--dtype", "int8"}, "unknown dtype 'int8'");
    expect_bad_input({"check", "--causal", "diagonal"}, "unknown causal alignment 'diagonal'");
    expect_bad_input({"trace", "--algorithm", "fa9", "--sram-bytes", "65536"}, "unknown algorithm 'fa9'");
    expect_bad_input({"bench", "--device", "tpu"}, "unknown device 'tpu'");
    expect_bad_input({"check", "--frobnicate"}, "frobnicate");
    expect_bad_input({"check", "--batch", "many"}, "many");
    expect_bad_input({"frobnicate"}, "frobnicate");
  }
  SUBCASE("backward outputs without dO, and dO without outputs") {
    expect_bad_input(with_qkv({"--dq", dir.file("dq.npy")}), "need --dout");
    expect_bad_input(with_qkv({"--dout", dir.file("q.npy")}), "needs --dq, --dk and --dv");
  }
  SUBCASE("out-of-range problem values") {
    expect_bad_input({"check", "--dropout", "1.5"}, "dropout probability must be in [0, 1)");
    expect_bad_input({"check", "--seq-q", "0"}, "seq_q must be at least 1");
    expect_bad_input({"bench", "--seq", "256,abc"}, "'abc' is not one");
  }
  SUBCASE("the FP8 pre-pass's options: only for e4m3, from f32, f16 or bf16, the rotation only with them") {
    expect_bad_input({"bench", "--device", "cuda", "--dtype", "bf16", "--quantize-from", "bf16"},
                     "--quantize-from makes the inputs of the FP8 forward: give --dtype e4m3 too");
    expect_bad_input({"bench", "--device", "cuda", "--quantize-from", "f16"},
                     "--quantize-from makes the inputs of the FP8 forward: give --dtype e4m3 too");
    expect_bad_input({"bench", "--device", "cuda", "--dtype", "e4m3", "--quantize-from", "f64"},
                     "--quantize-from f64: the FP8 pre-pass quantizes f32, f16 or bf16 activations");
    expect_bad_input({"bench", "--device", "cuda", "--dtype", "e4m3", "--quantize-from", "int8"}, "unknown dtype 'int8'");
    expect_bad_input({"bench", "--device", "cuda", "--dtype", "e4m3", "--rotate"},
                     "--rotate is done by the FP8 pre-pass: give --dtype e4m3 --quantize-from f32, f16 or bf16 too");
    expect_bad_input({"bench", "--device", "cuda", "--dtype", "e4m3", "--quantize-from", "bf16", "--one-pass"},
                     "--one-pass runs the forward alone: it takes no --quantize-from");
  }
  SUBCASE("the backward grid: with --backward, cuda-fa3-ws alone, a grid its backward can run on this problem") {
    const std::vector<std::string> fa3 = {"bench", "--device", "cuda", "--variants", "cuda-fa3-ws", "--backward"};
    const auto with = [&](std::initializer_list<std::string> more) {
      std::vector<std::string> args = fa3;
      args.insert(args.end(), more);
      return args;
    };
    expect_bad_input({"bench", "--device", "cuda", "--variants", "cuda-fa3-ws", "--backward-grid", "2,1,rows"},
                     "--backward-grid chooses the backward's grid: give --backward too");
    expect_bad_input({"bench", "--device", "cuda", "--backward", "--backward-grid", "2,1,rows"},
                     "--backward-grid is cuda-fa3-ws's backward grid: give --variants cuda-fa3-ws (and no other)");
    for (const char* malformed : {"2,1", "2,x,rows", "2,2,cols", "2,1,rows,keys", ",1,rows"})
      expect_bad_input(with({"--backward-grid", malformed}),
                       "--backward-grid takes CONSUMERS,SPLITS,ORDER: 2 or 3 consumer warpgroups, the thread blocks "
                       "sharing each group of query heads, and rows or keys (e.g. 2,1,rows or 3,4,keys), not '" +
                           std::string(malformed) + "'");
    expect_bad_input(with({"--backward-grid", "3,1,rows", "--head-dim", "128"}),
                     "--backward-grid: cuda-fa3-ws's backward runs 2 consumer warpgroups, or 3 at head dim 64, not 3 "
                     "at head dim 128");
    expect_bad_input(with({"--backward-grid", "2,3,keys", "--heads", "16", "--heads-kv", "4"}),
                     "--backward-grid: SPLITS, the thread blocks sharing a group of query heads, divides the query "
                     "heads per K/V head (4 here), not 3");
    expect_bad_input(with({"--backward-grid", "2,0,rows"}),
                     "--backward-grid: SPLITS, the thread blocks sharing a group of query heads, divides the query "
                     "heads per K/V head (1 here), not 0");
  }
}

TEST_CASE("run through .npy files writes what calling the variant directly computes") {
  TempDir dir;
  const Shape s{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 19, .seq_k = 23, .head_dim = 16};
  for (DType dtype : {DType::F32, DType::F64}) {
    SUBCASE(to_string(dtype)) {
      Problem p;
      p.shape = s;
      p.options.causal = CausalAlign::BottomRight;
      p.options.dropout_p = 0.25;
      p.options.seed = 99;
      const Qkv in = random_qkv(s, dtype, 11);
      const HostTensor dO = random_like_o(s, dtype, 12);
      write_npy(dir.file("q.npy"), in.q, dtype);
      write_npy(dir.file("k.npy"), in.k, dtype);
      write_npy(dir.file("v.npy"), in.v, dtype);
      write_npy(dir.file("do.npy"), dO, dtype);

      const CliResult r = cli({"run",
                               "--variant",
                               "cpu-fa2",
                               "--q",
                               dir.file("q.npy"),
                               "--k",
                               dir.file("k.npy"),
                               "--v",
                               dir.file("v.npy"),
                               "--out",
                               dir.file("o.npy"),
                               "--lse",
                               dir.file("lse.npy"),
                               "--dout",
                               dir.file("do.npy"),
                               "--dq",
                               dir.file("dq.npy"),
                               "--dk",
                               dir.file("dk.npy"),
                               "--dv",
                               dir.file("dv.npy"),
                               "--causal",
                               "bottom-right",
                               "--dropout",
                               "0.25",
                               "--seed",
                               "99"});
      INFO(r.out << r.err);
      REQUIRE(r.code == 0);

      const Variant& v = find_variant("cpu-fa2");
      const ForwardOut fwd = v.forward(p, dtype, in, nullptr);
      const Grads g = v.backward(p, dtype, in, fwd, dO);
      auto expect_file = [&](const std::string& name, const HostTensor& want, DType file_dtype) {
        const NpyArray a = read_npy(dir.file(name));
        CHECK(a.dtype == file_dtype);
        REQUIRE(a.tensor.dims == want.dims);
        HostTensor rounded = want;
        round_to(rounded, file_dtype);
        int differ = 0;
        for (std::size_t n = 0; n < want.data.size(); ++n)
          differ +=
              !(a.tensor.data[n] == rounded.data[n] || (std::isnan(a.tensor.data[n]) && std::isnan(rounded.data[n])));
        CHECK_MESSAGE(differ == 0, name);
      };
      expect_file("o.npy", fwd.o, dtype);
      expect_file("lse.npy", fwd.lse, DType::F32);
      expect_file("dq.npy", g.dq, dtype);
      expect_file("dk.npy", g.dk, dtype);
      expect_file("dv.npy", g.dv, dtype);
    }
  }
}

TEST_CASE("run computes on through NaN and +-Inf in its inputs and names each such tensor once on stderr") {
  // As PyTorch does: no error, the outputs are written (rows that see a non-finite value are NaN), and
  // one sentence per offending tensor says which, how many and the first (b, s, h, d) index.
  TempDir dir;
  const Shape s{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 20, .seq_k = 12, .head_dim = 8};
  Qkv in = random_qkv(s, DType::F32, 21);
  HostTensor dO = random_like_o(s, DType::F32, 22);
  const double inf = std::numeric_limits<double>::infinity();
  in.q.at(0, 17, 1, 5) = std::nan("");
  in.q.at(0, 19, 0, 0) = inf;
  in.q.at(0, 19, 1, 7) = -inf;
  in.k.at(0, 3, 0, 2) = inf;
  dO.at(0, 4, 1, 0) = -inf;
  write_npy(dir.file("q.npy"), in.q, DType::F32);
  write_npy(dir.file("k.npy"), in.k, DType::F32);
  write_npy(dir.file("v.npy"), in.v, DType::F32);
  write_npy(dir.file("do.npy"), dO, DType::F32);

  const CliResult r = cli({"run", "--variant", "cpu-fa2", "--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v",
                           dir.file("v.npy"), "--out", dir.file("o.npy"), "--dout", dir.file("do.npy"), "--dq",
                           dir.file("dq.npy"), "--dk", dir.file("dk.npy"), "--dv", dir.file("dv.npy")});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  for (const char* name : {"o.npy", "dq.npy", "dk.npy", "dv.npy"}) CHECK(std::filesystem::exists(dir.file(name)));
  CHECK(r.err.find("warning: q holds 3 non-finite values (NaN or \u00b1Inf), the first at (0, 17, 1, 5); the outputs "
                   "of rows that see them will be NaN\n") != std::string::npos);
  CHECK(r.err.find("warning: k holds 1 non-finite value (NaN or \u00b1Inf), the first at (0, 3, 0, 2);") !=
        std::string::npos);
  CHECK(r.err.find("warning: dO holds 1 non-finite value (NaN or \u00b1Inf), the first at (0, 4, 1, 0);") !=
        std::string::npos);
  CHECK(r.err.find("warning: v ") == std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 3);
  // The row of q's NaN comes out NaN, as in PyTorch.
  const NpyArray o = read_npy(dir.file("o.npy"));
  CHECK(std::isnan(o.tensor.at(0, 17, 1, 0)));

  SUBCASE("finite inputs: nothing on stderr") {
    write_npy(dir.file("q.npy"), random_qkv(s, DType::F32, 23).q, DType::F32);
    write_npy(dir.file("k.npy"), in.v, DType::F32);
    const CliResult clean = cli({"run", "--variant", "cpu-fa2", "--q", dir.file("q.npy"), "--k", dir.file("k.npy"),
                                 "--v", dir.file("v.npy"), "--out", dir.file("o.npy")});
    CHECK(clean.code == 0);
    CHECK(clean.err.empty());
  }
}

TEST_CASE("trace --json totals equal TrafficCounter on the same loop nest") {
  for (const char* alg : {"standard", "fa1", "fa2"}) {
    for (bool backward : {false, true}) {
      SUBCASE((std::string(alg) + (backward ? " backward" : " forward")).c_str()) {
        std::vector<std::string> args = {"trace",   "--algorithm", alg,          "--seq-q", "100",
                                         "--seq-k", "70",          "--head-dim", "32",      "--sram-bytes",
                                         "4096",    "--causal",    "top-left",   "--json"};
        if (backward) args.push_back("--backward");
        const CliResult r = cli(args);
        INFO(r.err);
        REQUIRE(r.code == 0);
        const auto j = nlohmann::json::parse(r.out);

        Problem p;
        p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 100, .seq_k = 70, .head_dim = 32};
        p.options.causal = CausalAlign::TopLeft;
        const Tiling tiling = tiling_from_sram(4096, 32, 2);
        TrafficCounter counter;
        count_traffic(parse_algorithm(alg), backward ? Pass::Backward : Pass::Forward, p, tiling, 2, counter);
        const TrafficTotals& t = counter.totals();
        CHECK(t.total() > 0);
        CHECK(j["total"].get<std::int64_t>() == t.total());
        CHECK(j["total_read"].get<std::int64_t>() == t.total_read());
        CHECK(j["total_written"].get<std::int64_t>() == t.total_written());
        CHECK(j["events"].get<std::int64_t>() == t.events);
        CHECK(j["peak_sram_bytes"].get<std::int64_t>() == t.peak_sram_bytes);
        CHECK(j["tiling"]["Br"].get<int>() == tiling.Br);
        CHECK(j["tiling"]["Bc"].get<int>() == tiling.Bc);
        for (int n = 0; n < int(TensorId::Count); ++n) {
          const char* name = to_string(TensorId(n));
          if (t.read[n] || t.written[n]) {
            REQUIRE(j["tensors"].contains(name));
            CHECK(j["tensors"][name]["read"].get<std::int64_t>() == t.read[n]);
            CHECK(j["tensors"][name]["written"].get<std::int64_t>() == t.written[n]);
          } else {
            CHECK_FALSE(j["tensors"].contains(name));
          }
        }
      }
    }
  }
}

TEST_CASE("trace prints the asymptotic formula labelled as such, and --events one CSV line per event") {
  const CliResult text =
      cli({"trace", "--algorithm", "standard", "--seq-q", "64", "--head-dim", "16", "--sram-bytes", "2048"});
  CHECK(text.code == 0);
  CHECK(text.out.find("asymptotic formula") != std::string::npos);
  CHECK(text.out.find("S ") != std::string::npos);  // standard attention moves S and P through HBM

  const std::vector<std::string> args = {"trace",      "--algorithm", "fa1",          "--seq-q", "16",
                                         "--head-dim", "8",           "--sram-bytes", "256"};
  std::vector<std::string> json_args = args, event_args = args;
  json_args.push_back("--json");
  event_args.push_back("--events");
  const auto j = nlohmann::json::parse(cli(json_args).out);
  const CliResult events = cli(event_args);
  CHECK(events.code == 0);
  CHECK(std::count(events.out.begin(), events.out.end(), '\n') == j["events"].get<std::int64_t>() + 1);  // + header
  expect_bad_input(
      {"trace", "--algorithm", "fa2", "--seq-q", "65536", "--head-dim", "64", "--sram-bytes", "4096", "--events"},
      "--events would print");
}

TEST_CASE("trace --ring: one row per step of the ring's schedule, and --json equal to ring_cost") {
  for (const bool backward : {false, true}) {
    CAPTURE(backward);
    std::vector<std::string> args = {"trace",  "--ring",     "3",  "--layout", "zigzag", "--heads",  "4",
                                     "--heads-kv", "2",      "--seq-q", "96",  "--seq-k",  "48",     "--head-dim",
                                     "64",     "--causal",   "bottom-right", "--tflops", "100",  "--link-gbs", "50",
                                     "--json"};
    if (backward) args.push_back("--backward");
    const CliResult r = cli(args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    const Shape s{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 96, .seq_k = 48, .head_dim = 64};
    const RingCost cost =
        ring_cost(ring_schedule(RingLayout::Zigzag, 3, 96, 48, CausalAlign::BottomRight), s,
                  backward ? Pass::Backward : Pass::Forward,
                  RingMachine{.flops_per_second = 100e12, .link_bytes_per_second = 50e9, .kv_bytes_per_element = 2,
                              .grad_bytes_per_element = 4});
    REQUIRE(j["steps"].size() == 3);
    CHECK(cost.total_link_bytes > 0);
    for (int step = 0; step < 3; ++step) {
      CHECK(j["steps"][step]["link_bytes"].get<std::vector<std::int64_t>>() == cost.steps[step].link_bytes);
      CHECK(j["steps"][step]["flops"].get<std::vector<double>>() == cost.steps[step].flops);
      CHECK(j["steps"][step]["seconds"].get<double>() == doctest::Approx(cost.steps[step].seconds));
      CHECK(j["steps"][step]["imbalance"].get<double>() == doctest::Approx(cost.steps[step].imbalance));
    }
    CHECK(j["total_flops"].get<double>() == cost.total_flops);
    CHECK(j["total_link_bytes"].get<std::int64_t>() == cost.total_link_bytes);
    CHECK(j["imbalance"].get<double>() == doctest::Approx(cost.imbalance));
  }

  const CliResult text = cli({"trace", "--ring", "4", "--seq-q", "1024", "--causal", "top-left"});
  INFO(text.err);
  REQUIRE(text.code == 0);
  CHECK(text.out.find("ring attention over 4 ranks, contiguous layout, forward") != std::string::npos);
  for (const char* column : {"step", "bytes per link", "work per rank", "idle per rank", "imbalance"})
    CHECK(text.out.find(column) != std::string::npos);
  // One row per step and a total: contiguous causal leaves rank 0 idle from step 1 on.
  int step_rows = 0;
  std::istringstream lines(text.out);
  for (std::string line; std::getline(lines, line);)
    step_rows += line.size() > 1 && std::isdigit(static_cast<unsigned char>(line[0])) && line[1] == ' ';
  CHECK(step_rows == 4);
  CHECK(count_lines_with(text.out, "all ") == 1);
  CHECK(count_lines_with(text.out, "4.000") == 1);  // step 3: one rank of four does all the work

  expect_bad_input({"trace", "--ring", "0"}, "the ring needs at least 1 rank, got 0");
  expect_bad_input({"trace", "--ring", "2", "--layout", "spiral"},
                   "unknown ring layout 'spiral': supported are contiguous, zigzag and striped");
  expect_bad_input({"trace", "--ring", "3", "--layout", "zigzag", "--seq-q", "100"}, "is not a multiple of it");
  expect_bad_input({"trace", "--ring", "8", "--seq-q", "4"}, "seq_q = 4 is shorter than the 8 ranks");
  expect_bad_input({"trace", "--ring", "5000", "--seq-q", "8192"}, "it takes 1 to 1024");
  expect_bad_input({"trace", "--layout", "zigzag", "--sram-bytes", "4096"}, "--layout belongs to the ring's trace");
  expect_bad_input({"trace", "--ring", "2", "--sram-bytes", "4096"}, "--sram-bytes does not apply to --ring");
}

TEST_CASE("trace --variant --gpu: the paper's count, the L2 model and the compulsory traffic of the real kernels") {
  const CliResult r = cli({"trace", "--variant", "cuda-fa2", "--gpu", "h100", "--heads", "4", "--seq-q", "3000",
                           "--head-dim", "64", "--causal", "top-left", "--json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const auto j = nlohmann::json::parse(r.out);
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 4, .heads_kv = 4, .seq_q = 3000, .seq_k = 3000, .head_dim = 64};
  p.options.causal = CausalAlign::TopLeft;
  const GpuSpec& gpu = find_gpu("h100");
  const GpuTraffic t = model_gpu_traffic(gpu, p.shape, gpu_forward_pass("cuda-fa2", p, gpu).kernels);
  CHECK(j["gpu"]["device_name"] == "NVIDIA H100 80GB HBM3");
  CHECK(j["tiling"]["Br"] == 128);
  CHECK(j["two_level"]["read"].get<std::int64_t>() == t.two_level.total_read());
  CHECK(j["l2_model"]["read"].get<std::int64_t>() == t.dram.total_read());
  CHECK(j["l2_model"]["written"].get<std::int64_t>() == t.dram.total_written());
  CHECK(j["compulsory"]["read"].get<std::int64_t>() == t.compulsory.total_read());
  CHECK(j["tensors"]["K"]["two_level"]["read"].get<std::int64_t>() > j["tensors"]["K"]["l2_model"]["read"].get<std::int64_t>());
  const CliResult text = cli({"trace", "--variant", "cuda-naive", "--gpu", "h200", "--heads", "2", "--seq-q", "512"});
  CHECK(text.code == 0);
  CHECK(text.out.find("NVIDIA H200") != std::string::npos);
  CHECK(text.out.find("softmax_forward_kernel") != std::string::npos);
  CHECK(text.out.find("compulsory") != std::string::npos);

  expect_bad_input({"trace", "--variant", "cpu-fa2", "--gpu", "h100"}, "variant cpu-fa2 has no GPU tiling");
  expect_bad_input({"trace", "--variant", "cuda-fa2", "--gpu", "a100"}, "unknown GPU 'a100': the model describes h100, h200");
  expect_bad_input({"trace", "--variant", "cuda-fa2"}, "name it with --gpu");
  expect_bad_input({"trace", "--gpu", "h100"}, "name one with --variant");
  expect_bad_input({"trace", "--variant", "cuda-fa2", "--gpu", "h100", "--sram-bytes", "4096"},
                   "--sram-bytes belongs to the paper's two-level trace");
  expect_bad_input({"trace", "--variant", "cuda-fa2", "--gpu", "h100", "--head-dim", "80"}, "does not support head_dim 80");
  expect_bad_input({"trace", "--seq-q", "64"}, "--sram-bytes is required");
}

TEST_CASE("bench writes a JSON row per variant and size, with time, memory and modeled traffic") {
  TempDir dir;
  const CliResult r =
      cli({"bench", "--device", "cpu", "--variants", "cpu-naive,cpu-fa2", "--seq", "32,64", "--head-dim", "8",
           "--warmup", "0", "--iters", "1", "--backward", "--json", dir.file("b.json"), "--csv", dir.file("b.csv")});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::ifstream f(dir.file("b.json"));
  const auto j = nlohmann::json::parse(f);
  CHECK(!j["device"].get<std::string>().empty());
  CHECK(j["command"].get<std::string>().find("bench --device cpu") != std::string::npos);
  CHECK(!j["date"].get<std::string>().empty());
  const auto& rows = j["rows"];
  REQUIRE(rows.size() == 4);
  for (const auto& row : rows) {
    CHECK(row["status"] == "ok");
    CHECK(row["forward_ms"].get<double>() > 0);
    CHECK(row["backward_ms"].get<double>() > 0);
    CHECK(row["forward_tflops"].get<double>() > 0);
    CHECK(row["modeled_hbm_bytes_forward"].get<std::int64_t>() > 0);
    CHECK(row["extra_bytes"].get<std::int64_t>() >= 0);
  }
  // The modeled traffic is the variant's own loop nest: naive moves S and P, FA2 does not.
  CHECK(rows[1]["modeled_hbm_bytes_forward"].get<std::int64_t>() >
        rows[3]["modeled_hbm_bytes_forward"].get<std::int64_t>());
  std::ifstream csv(dir.file("b.csv"));
  const std::string csv_text((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
  CHECK(std::count(csv_text.begin(), csv_text.end(), '\n') == 5);  // header + 4 rows
}

TEST_CASE("bench --heads-kv times grouped-query attention, and says when the heads do not divide") {
  TempDir dir;
  const CliResult r = cli({"bench", "--device", "cpu", "--variants", "cpu-fa2", "--seq", "32", "--head-dim", "8",
                           "--heads", "4", "--heads-kv", "2", "--warmup", "0", "--iters", "1", "--backward", "--json",
                           dir.file("b.json")});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("heads 4 on 2 K/V heads") != std::string::npos);
  std::ifstream f(dir.file("b.json"));
  const auto j = nlohmann::json::parse(f);
  CHECK(j["settings"]["heads_kv"] == 2);
  REQUIRE(j["rows"].size() == 1);
  CHECK(j["rows"][0]["status"] == "ok");
  CHECK(j["rows"][0]["heads_q"] == 4);
  CHECK(j["rows"][0]["heads_kv"] == 2);
  CHECK(j["rows"][0]["backward_ms"].get<double>() > 0);
  expect_bad_input({"bench", "--device", "cpu", "--heads", "4", "--heads-kv", "3"},
                   "heads_q (4) must be a multiple of heads_kv (3)");
  expect_bad_input({"bench", "--device", "cpu", "--heads", "4", "--heads-kv", "-1"}, "heads_kv must be at least 1");
  expect_bad_input({"bench", "--ring", "2", "--heads", "4", "--heads-kv", "2"}, "--ring times multi-head attention");
}

TEST_CASE("bench reports a size that won't fit as a skipped row and goes on with the sweep") {
  TempDir dir;
  const CliResult r = cli({"bench", "--device", "cpu", "--variants", "cpu-naive", "--seq", "32,3000000,64",
                           "--head-dim", "8", "--warmup", "0", "--iters", "1", "--json", dir.file("b.json")});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  std::ifstream f(dir.file("b.json"));
  const auto rows = nlohmann::json::parse(f)["rows"];
  REQUIRE(rows.size() == 3);
  CHECK(rows[0]["status"] == "ok");
  CHECK(rows[1]["status"] == "skipped");
  CHECK(rows[1]["reason"].get<std::string>().find("memory is available") != std::string::npos);
  CHECK(rows[2]["status"] == "ok");
  CHECK(r.out.find("skipped: ") != std::string::npos);
}

TEST_CASE("bench --timeline: one variant that records one (with --backward, one with a backward), else one sentence") {
  TempDir dir;
  const std::string file = dir.file("timeline.json");
  // The variants that can record, from the table (none in a build without CUDA): the sentence names them.
  std::vector<std::string> recorders;
  for (const Variant& v : variants())
    if (v.records_timeline) recorders.push_back(v.name);
  SUBCASE("a variant without a timeline build") {
    for (const char* name : {"cpu-naive", "cpu-fa2"}) {
      const CliResult r = cli({"bench", "--variants", name, "--seq", "64", "--head-dim", "8", "--timeline", file});
      INFO(r.err);
      expect_bad_input({"bench", "--variants", name, "--seq", "64", "--head-dim", "8", "--timeline", file},
                       "variant " + std::string(name) + " cannot record a timeline: only ");
      if (recorders.empty()) {
        CHECK(r.err.find("only the cuda-fa3-ws variants can, and this build has no CUDA") != std::string::npos);
      } else {
        for (const std::string& n : recorders) CHECK(r.err.find(n) != std::string::npos);
      }
      CHECK(r.out.empty());  // refused before anything ran
    }
    CHECK_FALSE(std::filesystem::exists(file));
  }
  SUBCASE("with --backward, on a variant whose backward has no timeline build") {
    expect_bad_input(
        {"bench", "--variants", "cpu-naive", "--seq", "64", "--head-dim", "8", "--backward", "--timeline", file},
        "variant cpu-naive cannot record a timeline: only ");
    // The ladder steps below the shipped one record their forward and have no backward (CUDA builds only; asked
    // of the registry, which bench asks before it needs a GPU).
    Problem p;
    p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 64, .seq_k = 64, .head_dim = 64};
    for (const Variant& v : variants())
      if (v.records_timeline && !v.has_backward())
        CHECK_THROWS_WITH_AS(check_records_timeline(v, p, v.dtypes.front(), true),
                             doctest::Contains(("variant " + v.name + " has no backward, so --timeline with --backward "
                                                "has nothing to record").c_str()),
                             InputError);
    CHECK_FALSE(std::filesystem::exists(file));
  }
  SUBCASE("no variant named, several variants, several lengths") {
    expect_bad_input({"bench", "--seq", "64", "--timeline", file}, "--timeline records one variant's run: name it");
    expect_bad_input({"bench", "--variants", "cpu-naive,cpu-fa2", "--seq", "64", "--timeline", file},
                     "--variants names 2");
    expect_bad_input({"bench", "--variants", "cpu-naive", "--seq", "32,64", "--timeline", file}, "--seq lists 2 lengths");
    CHECK_FALSE(std::filesystem::exists(file));
  }
  SUBCASE("the registry refuses it the same way, on any variant of the table without a timeline build") {
    // Through Variant::bench, before anything else is checked: CUDA variants (cuda-fa2, ...) too, with or
    // without a GPU here.
    Problem p;
    p.shape = Shape{.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 64, .seq_k = 64, .head_dim = 64};
    const BenchSettings settings{.warmup = 0, .iters = 1, .backward = false, .record_timeline = true};
    int refused = 0;
    for (const Variant& v : variants()) {
      if (v.records_timeline) continue;
      const std::string sentence = "variant " + v.name + " cannot record a timeline: only ";
      CHECK_THROWS_WITH_AS((void)v.bench(p, v.dtypes.front(), settings), doctest::Contains(sentence.c_str()),
                           InputError);
      ++refused;
    }
    CHECK(refused > 0);  // the loop checked something (every CPU variant is such a row)
    // A variant that records one: its backward only where it has one, only without dropout.
    Variant recorder = variants().front();
    recorder.records_timeline = true;
    REQUIRE(recorder.has_backward());
    CHECK_NOTHROW(check_records_timeline(recorder, p, DType::F32, false));
    CHECK_NOTHROW(check_records_timeline(recorder, p, DType::F32, true));
    Variant forward_only = recorder;
    forward_only.backward_fn = nullptr;
    forward_only.device_backward_fn = nullptr;
    REQUIRE_FALSE(forward_only.has_backward());
    CHECK_THROWS_WITH_AS(check_records_timeline(forward_only, p, DType::F32, true),
                         doctest::Contains("has no backward, so --timeline with --backward has nothing to record"),
                         InputError);
    p.options.dropout_p = 0.1;
    CHECK_THROWS_WITH_AS(check_records_timeline(recorder, p, DType::F32, false),
                         doctest::Contains("records a timeline only without dropout"), InputError);
    CHECK_FALSE(std::filesystem::exists(file));
  }
}

TEST_CASE("bench --one-pass: one pass on a GPU for Nsight Compute, with no timing loop beside it") {
  expect_bad_input({"bench", "--device", "cpu", "--one-pass"}, "--one-pass brackets one GPU pass for Nsight Compute");
  expect_bad_input({"bench", "--device", "cuda", "--one-pass", "--iters", "3"}, "takes no --warmup or --iters");
  expect_bad_input({"bench", "--device", "cuda", "--one-pass", "--warmup", "0"}, "takes no --warmup or --iters");
  expect_bad_input({"bench", "--device", "cuda", "--one-pass", "--timeline", "t.json"}, "give one of them");
  CHECK(cli({"bench", "--help"}).out.find("--one-pass") != std::string::npos);
}

TEST_CASE("bench --ring: one sentence for what it does not take") {
  expect_bad_input({"bench", "--ring", "0"}, "--ring takes the number of ranks P, at least 1, not 0");
  expect_bad_input({"bench", "--ring", "4", "--device", "cpu"}, "it takes --device cuda");
  expect_bad_input({"bench", "--ring", "4", "--variants", "cuda-fa1"}, "--variants names one of them, not cuda-fa1");
  expect_bad_input({"bench", "--ring", "4", "--one-pass"}, "--ring times whole ring passes");
  expect_bad_input({"bench", "--ring", "4", "--csv", "x.csv"}, "not CSV");
  expect_bad_input({"bench", "--ring", "4", "--layouts", "spiral"}, "spiral");
  expect_bad_input({"bench", "--ring", "4", "--layouts", ","}, "--layouts names no layout");
  expect_bad_input({"bench", "--ring", "4", "--dtype", "e4m3"}, "the ring has no FP8 (e4m3) path yet");
  if (!cuda_device_present()) expect_bad_input({"bench", "--ring", "4"}, "--ring needs a CUDA GPU");
}

TEST_CASE("ring: one sentence for what it refuses before starting any rank") {
  expect_bad_input({"ring"}, "--gpus is required");
  expect_bad_input({"ring", "--gpus", "0"}, "--gpus takes the number of ranks P, at least 1, not 0");
  expect_bad_input({"ring", "--gpus", "2", "--layout", "spiral"}, "unknown ring layout 'spiral'");
  expect_bad_input({"ring", "--gpus", "2", "--check", "--json", "x.json"}, "--check times nothing");
  expect_bad_input({"ring", "--gpus", "2", "--dtype", "f64"}, "flashlab ring takes f16 or bf16");
  expect_bad_input({"ring", "--gpus", "2", "--blocks", "cuda-fa1"}, "the ring's blocks run on cuda-fa3-ws or cuda-fa2, not cuda-fa1");
  expect_bad_input({"ring", "--gpus", "3", "--layout", "zigzag", "--seq-q", "100"}, "is not a multiple of it");
#ifndef FLASHLAB_HAVE_CUDA
  expect_bad_input({"ring", "--gpus", "2"}, "this flashlab was built without CUDA, so it has no GPU ring");
#elif !defined(FLASHLAB_HAVE_NCCL)
  expect_bad_input({"ring", "--gpus", "2"}, "this flashlab was built without NCCL");
#else
  if (cuda_device_count() < 2)
    expect_bad_input({"ring", "--gpus", "2"}, "a ring of 2 ranks over NCCL needs 2 GPUs, one process per GPU, and this "
                                              "machine has " + std::to_string(cuda_device_count()));
#endif
}

TEST_CASE("bench --help documents --timeline") {
  const CliResult r = cli({"bench", "--help"});
  CHECK(r.code == 0);
  CHECK(r.out.find("--timeline FILE.json") != std::string::npos);
  CHECK(r.out.find("Trace Event JSON") != std::string::npos);
}

TEST_CASE("run --dtype chooses the precision: f16 files computed and written in f32") {
  TempDir dir;
  const Shape s{.batch = 1, .heads_q = 2, .heads_kv = 2, .seq_q = 9, .seq_k = 13, .head_dim = 8};
  const Qkv in = random_qkv(s, DType::F16, 5);  // values representable in f16
  write_npy(dir.file("q.npy"), in.q, DType::F16);
  write_npy(dir.file("k.npy"), in.k, DType::F16);
  write_npy(dir.file("v.npy"), in.v, DType::F16);
  const CliResult r = cli({"run", "--variant", "cpu-fa1", "--q", dir.file("q.npy"), "--k", dir.file("k.npy"), "--v",
                           dir.file("v.npy"), "--out", dir.file("o.npy"), "--dtype", "f32", "--causal", "top-left"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  Problem p;
  p.shape = s;
  p.options.causal = CausalAlign::TopLeft;
  const ForwardOut want = find_variant("cpu-fa1").forward(p, DType::F32, in, nullptr);
  const NpyArray o = read_npy(dir.file("o.npy"));
  CHECK(o.dtype == DType::F32);
  REQUIRE(o.tensor.dims == want.o.dims);
  for (std::size_t n = 0; n < want.o.data.size(); ++n) CHECK(o.tensor.data[n] == static_cast<float>(want.o.data[n]));
}

TEST_CASE("e4m3: the rows that take it, and one sentence for every row, pass or option that does not") {
  // Exactly the rows with an FP8 forward list e4m3: cuda-fa3-ws where the build has CUDA, none otherwise.
  std::vector<std::string> fp8_rows;
  for (const Variant& v : variants()) {
    INFO("variant " << v.name);
    CHECK(v.supports_dtype(DType::E4M3) == (v.e4m3_head_dims.has_value() && v.e4m3_forward_fn != nullptr));
    if (v.supports_dtype(DType::E4M3)) fp8_rows.push_back(v.name);
  }
#ifdef FLASHLAB_HAVE_CUDA
  REQUIRE(fp8_rows == std::vector<std::string>{"cuda-fa3-ws"});
  CHECK(find_variant("cuda-fa3-ws").e4m3_head_dims->only == std::vector<int>{64, 128, 256});  // as fp8_row_on_cpu
#else
  CHECK(fp8_rows.empty());
#endif
  const std::string only = fp8_rows.empty()
                               ? "only cuda-fa3-ws has an FP8 (e4m3) kernel, and this build has no CUDA"
                               : "only cuda-fa3-ws has an FP8 (e4m3) kernel";
  Problem p;
  p.shape = Shape{.batch = 1, .heads_q = 4, .heads_kv = 2, .seq_q = 64, .seq_k = 80, .head_dim = 128};
  p.options.causal = CausalAlign::BottomRight;

  SUBCASE("every other row: what it takes, and who has an FP8 kernel") {
    CHECK_THROWS_WITH_AS(check_supported(find_variant("cpu-fa2"), p, DType::E4M3, false),
                         doctest::Contains(("variant cpu-fa2 takes f64 or f32, not e4m3: " + only).c_str()), InputError);
    int refused = 0;
    for (const Variant& v : variants()) {
      if (v.supports_dtype(DType::E4M3)) continue;
      std::string own;
      for (DType t : v.dtypes) own += (own.empty() ? "" : " or ") + std::string(to_string(t));
      const std::string sentence = "variant " + v.name + " takes " + own + ", not e4m3: " + only;
      CHECK_THROWS_WITH_AS(check_supported(v, p, DType::E4M3, false), doctest::Contains(sentence.c_str()), InputError);
      ++refused;
    }
    CHECK(refused >= 3);  // the CPU rows at least (and cuda-fa2, the ladder steps 1-4 where built)
  }
  SUBCASE("the FP8 row: forward only, no dropout, head dims 64, 128 and 256") {
    const Variant fp8 = fp8_row_on_cpu();
    CHECK_NOTHROW(check_supported(fp8, p, DType::E4M3, false));  // causal and GQA are fine
    p.shape.head_dim = 256;
    CHECK_NOTHROW(check_supported(fp8, p, DType::E4M3, false));
    p.shape.head_dim = 128;
    CHECK_THROWS_WITH_AS(check_supported(fp8, p, DType::E4M3, true),
                         doctest::Contains("variant cuda-fa3-ws has no FP8 (e4m3) backward pass (FlashAttention-3 ships "
                                           "no FP8 backward either): FP8 is forward only, so run the backward in bf16"),
                         InputError);
    CHECK_NOTHROW(check_supported(fp8, p, DType::BF16, true));  // which it has
    Problem dropout = p;
    dropout.options.dropout_p = 0.1;
    CHECK_THROWS_WITH_AS(check_supported(fp8, dropout, DType::E4M3, false),
                         doctest::Contains("variant cuda-fa3-ws has no dropout in its FP8 (e4m3) kernel"), InputError);
    CHECK_NOTHROW(check_supported(fp8, dropout, DType::BF16, false));
    p.shape.head_dim = 64;
    CHECK_NOTHROW(check_supported(fp8, p, DType::E4M3, false));
    for (int d : {16, 32, 96}) {
      p.shape.head_dim = d;
      const std::string sentence = "variant cuda-fa3-ws does not support head_dim " + std::to_string(d) +
                                   " in e4m3: the FP8 kernel takes head dims 64, 128 and 256 (f16 and bf16 take 64, "
                                   "128 and 256)";
      CHECK_THROWS_WITH_AS(check_supported(fp8, p, DType::E4M3, false), doctest::Contains(sentence.c_str()), InputError);
    }
    // The timeline build has the FP8 kernel too (forward only, like every e4m3 run), at d = 64 and 128.
    p.shape.head_dim = 64;
    CHECK_NOTHROW(check_records_timeline(fp8, p, DType::E4M3, false));
    p.shape.head_dim = 128;
    CHECK_NOTHROW(check_records_timeline(fp8, p, DType::E4M3, false));
    CHECK_NOTHROW(check_records_timeline(fp8, p, DType::BF16, false));
    p.shape.head_dim = 256;
    CHECK_THROWS_WITH_AS(check_records_timeline(fp8, p, DType::E4M3, false),
                         doctest::Contains("variant cuda-fa3-ws records its FP8 (e4m3) forward's timeline at head dims "
                                           "64 and 128 only, not 256"),
                         InputError);
    CHECK_NOTHROW(check_records_timeline(fp8, p, DType::BF16, false));
  }
#ifdef FLASHLAB_HAVE_CUDA
  SUBCASE("the table's cuda-fa3-ws row says the same, before it asks for a GPU") {
    const Variant& fa3 = find_variant("cuda-fa3-ws");
    CHECK_THROWS_WITH_AS(check_supported(fa3, p, DType::E4M3, true), doctest::Contains("no FP8 (e4m3) backward pass"),
                         InputError);
    p.shape.head_dim = 32;
    CHECK_THROWS_WITH_AS(check_supported(fa3, p, DType::E4M3, false),
                         doctest::Contains("the FP8 kernel takes head dims 64, 128 and 256"), InputError);
    p.shape.head_dim = 128;
    // It has an FP8 entry on device memory (forward_e4m3_on_device, with the descales).
    if (fa3.available()) CHECK_NOTHROW(fa3.check_device_call(p, DType::E4M3, 0, false));
  }
#endif
}

TEST_CASE("e4m3: Variant::forward quantizes per head and hands the kernel what quantize_e4m3_qkv makes") {
  const Variant fp8 = fp8_row_on_cpu();
  Problem p;
  p.shape = Shape{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 20, .seq_k = 24, .head_dim = 128};
  const Qkv in = random_qkv(p.shape, DType::F64, 12);
  g_planted_o_scale = 1.0;
  const ForwardOut out = fp8.forward(p, DType::E4M3, in);
  const E4m3Qkv want = quantize_e4m3_qkv(in);
  CHECK(g_e4m3_given.q == want.q);
  CHECK(g_e4m3_given.k == want.k);
  CHECK(g_e4m3_given.v == want.v);
  CHECK(g_e4m3_given.q_descale == want.q_descale);
  CHECK(g_e4m3_given.k_descale == want.k_descale);
  CHECK(g_e4m3_given.v_descale == want.v_descale);
  CHECK(out.o.dims == q_dims(p.shape));
  // forward_e4m3 checks the sizes of what it is given against the problem, in one sentence each.
  E4m3Qkv short_q = want;
  short_q.q.pop_back();
  CHECK_THROWS_WITH_AS(fp8.forward_e4m3(p, short_q),
                       doctest::Contains("the e4m3 q holds 20479 values but the problem's (B, S_q, H_q, d) needs 20480"),
                       InputError);
  E4m3Qkv few_descales = want;
  few_descales.k_descale.resize(2);
  CHECK_THROWS_WITH_AS(fp8.forward_e4m3(p, few_descales),
                       doctest::Contains("the e4m3 k's descale holds 2 values but the problem's (B, H_kv) needs 4"),
                       InputError);
  // A row without an FP8 kernel refuses before looking at them.
  CHECK_THROWS_WITH_AS(find_variant("cpu-fa1").forward(p, DType::E4M3, in), doctest::Contains("not e4m3"), InputError);
}

TEST_CASE("e4m3 check: the emulation's rows, then the kernel held to 2x the emulation's error") {
  const Variant fp8 = fp8_row_on_cpu("fp8-stand-in");
  CheckRequest request;
  request.problem.shape = Shape{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 48, .seq_k = 64, .head_dim = 128};
  request.problem.options.causal = CausalAlign::TopLeft;
  request.problem.options.seed = 31;
  request.dtype = DType::E4M3;
  request.variants = {&fp8};
  const auto rows_of = [](const CheckReport& r, const std::string& variant) {
    std::vector<const CheckRow*> rows;
    for (const CheckRow& row : r.rows)
      if (row.variant == variant) rows.push_back(&row);
    return rows;
  };
  SUBCASE("a kernel as exact as bf16's O allows passes") {
    g_planted_o_scale = 1.0;
    const CheckReport r = Check(request).run();
    const auto emulation = rows_of(r, "fp8-emulation"), kernel = rows_of(r, "fp8-stand-in");
    REQUIRE(emulation.size() == 2);
    REQUIRE(kernel.size() == 2);
    CHECK(r.rows.front().variant == "fp8-emulation");  // its rows come first
    for (const CheckRow* row : emulation) {
      CHECK(row->device == "cpu");
      CHECK(row->dtype == "e4m3");
      CHECK(row->bound.find("(worst case)") != std::string::npos);
      CHECK(row->result == "PASS");
    }
    CHECK(kernel[0]->output == "O");
    CHECK(kernel[0]->bound.rfind("abs <= 2 x ", 0) == 0);
    CHECK(kernel[0]->bound.find("(emulation's)") != std::string::npos);
    CHECK(kernel[1]->output == "LSE");
    CHECK(kernel[0]->result == "PASS");
    CHECK(kernel[1]->result == "PASS");
    CHECK(*kernel[0]->max_abs_error < *emulation[0]->max_abs_error);  // bf16's rounding alone, smaller than P's
    CHECK(r.passed == 4);
    CHECK(r.failed == 0);
  }
  SUBCASE("an O 5% too large fails, and the LSE still passes") {
    g_planted_o_scale = 1.05;
    const CheckReport r = Check(request).run();
    g_planted_o_scale = 1.0;
    const auto kernel = rows_of(r, "fp8-stand-in");
    REQUIRE(kernel.size() == 2);
    CHECK(kernel[0]->result == "FAIL");
    CHECK(kernel[1]->result == "PASS");
    CHECK(r.failed == 1);
  }
  SUBCASE("with --backward, its grads are a SKIP with the sentence; named, it is refused") {
    request.backward = true;
    CHECK_THROWS_WITH_AS(Check{request}, doctest::Contains("no FP8 (e4m3) backward pass"), InputError);
  }
}

TEST_CASE("e4m3 through the command: refused in one sentence where no FP8 kernel can run it") {
  TempDir dir;
  const Shape s{.batch = 1, .heads_q = 2, .heads_kv = 1, .seq_q = 8, .seq_k = 8, .head_dim = 16};
  const Qkv in = random_qkv(s, DType::F32, 3);
  write_npy(dir.file("q.npy"), in.q, DType::F32);
  write_npy(dir.file("k.npy"), in.k, DType::F32);
  write_npy(dir.file("v.npy"), in.v, DType::F32);
  auto run_args = [&](const std::string& variant, std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--variant", variant, "--q", dir.file("q.npy"), "--k", dir.file("k.npy"),
                                     "--v", dir.file("v.npy"), "--out", dir.file("o.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  const std::string cpu_row = "variant cpu-fa2 takes f64 or f32, not e4m3: only cuda-fa3-ws has an FP8 (e4m3) kernel";
  expect_bad_input(run_args("cpu-fa2", {"--dtype", "e4m3"}), cpu_row);
  expect_bad_input(run_args("cpu-fa2", {"--dtype", "fp8"}), cpu_row);
  expect_bad_input({"check", "--variants", "cpu-fa2", "--dtype", "float8_e4m3fn", "--head-dim", "128"}, cpu_row);
  expect_bad_input({"bench", "--variants", "cpu-fa2", "--dtype", "e4m3", "--seq", "64", "--head-dim", "128"}, cpu_row);
  expect_bad_input({"check", "--dtype", "e5m2"}, "unknown dtype 'e5m2'");
  CHECK_FALSE(std::filesystem::exists(dir.file("o.npy")));
  // --save-quantized belongs to an e4m3 run, and nothing is written without one.
  expect_bad_input(run_args("cpu-fa2", {"--save-quantized", dir.file("saved")}),
                   "--save-quantized writes the e4m3 inputs of an FP8 run: give --dtype e4m3 too");
  expect_bad_input(run_args("cpu-fa2", {"--dtype", "f32", "--save-quantized", dir.file("saved")}), "give --dtype e4m3");
  // A variant that refuses e4m3 refuses before the quantized inputs are written.
  expect_bad_input(run_args("cpu-fa2", {"--dtype", "e4m3", "--save-quantized", dir.file("saved")}), cpu_row);
  CHECK_FALSE(std::filesystem::exists(dir.file("saved")));
  if (!cuda_device_present()) {
    // Every row a SKIP, each saying why: no pass, so no success either.
    const CliResult r = cli({"check", "--dtype", "e4m3", "--head-dim", "128", "--seq-q", "16"});
    CHECK(r.code == 2);
    CHECK(r.err.find("no variant available here can run this problem") != std::string::npos);
    CHECK(count_lines_with(r.out, "SKIP: " + cpu_row) == 1);
    CHECK(r.out.find("\nfp8-emulation ") == std::string::npos);  // no row of it: nothing ran to be held to it
  }
#ifdef FLASHLAB_HAVE_CUDA
  // The FP8 row's own refusals come before it asks for a GPU, so they read the same on any machine.
  expect_bad_input(run_args("cuda-fa3-ws", {"--dtype", "e4m3"}),
                   "variant cuda-fa3-ws does not support head_dim 16 in e4m3: the FP8 kernel takes head dims 64, 128 and 256");
  expect_bad_input(run_args("cuda-fa3-ws", {"--dtype", "e4m3", "--dout", dir.file("q.npy"), "--dq", dir.file("a"),
                                            "--dk", dir.file("b"), "--dv", dir.file("c")}),
                   "has no FP8 (e4m3) backward pass (FlashAttention-3 ships no FP8 backward either)");
  // check asks about the forward first, so without a Hopper GPU here it stops at that.
  expect_bad_input({"check", "--variants", "cuda-fa3-ws", "--dtype", "e4m3", "--head-dim", "128", "--backward"},
                   find_variant("cuda-fa3-ws").available() ? "run the backward in bf16" : "needs a ");
  expect_bad_input({"check", "--variants", "cuda-fa3-ws", "--dtype", "e4m3", "--head-dim", "128", "--dropout", "0.1"},
                   "has no dropout in its FP8 (e4m3) kernel");
  expect_bad_input({"bench", "--variants", "cuda-fa3-ws-step3", "--device", "cuda", "--dtype", "e4m3", "--seq", "64"},
                   cuda_device_present() ? "variant cuda-fa3-ws-step3 takes f16 or bf16, not e4m3" : "needs a CUDA GPU");
  CHECK_FALSE(std::filesystem::exists(dir.file("o.npy")));
#endif
}

TEST_CASE("the help of run, check and bench documents e4m3") {
  const CliResult run = cli({"run", "--help"});
  CHECK(run.code == 0);
  CHECK(run.out.find("--save-quantized DIR") != std::string::npos);
  CHECK(run.out.find("uint8") != std::string::npos);
  CHECK(run.out.find("e4m3") != std::string::npos);
  for (const char* command : {"check", "bench"}) {
    const CliResult r = cli({command, "--help"});
    CHECK(r.code == 0);
    CHECK(r.out.find("bf16 or e4m3") != std::string::npos);
  }
}
