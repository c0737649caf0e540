#pragma once
// The one table of variants. The CLI (check, run, bench), the tests and the app all read it: adding a
// kernel means adding one row in variants.cpp, and it shows up everywhere.
#include <cstddef>
#include <string>
#include <vector>

#include "problem.hpp"
#include "tensor.hpp"

namespace flashlab {

class TrafficObserver;  // cpu_reference/traffic.hpp

enum class Device { Cpu, Cuda };
const char* to_string(Device);

struct Supports {
  bool causal = false, dropout = false, gqa = false, backward = false;
};

// Head dims a variant accepts: every d in [min, max], or only the listed ones when `only` is set.
struct HeadDims {
  int min = 1, max = 256;
  std::vector<int> only;
  bool contains(int d) const;
  std::string describe() const;  // "1..256" or "64, 128"
};

// Device timing of one configuration, inputs already resident (bench only; never in tests).
struct BenchSettings {
  int warmup = 3;
  int iters = 20;
  bool backward = true;
};
struct BenchResult {
  double forward_ms = 0;          // median
  double backward_ms = -1;        // median; < 0 when not measured
  std::size_t peak_bytes = 0;     // peak device (or host) memory during the run
  std::size_t io_bytes = 0;       // of which inputs and outputs (q, k, v, o, lse, and grads)
};

using ForwardFn = ForwardOut (*)(const Problem&, DType, const Qkv&, TrafficObserver*);
using BackwardFn = Grads (*)(const Problem&, DType, const Qkv&, const ForwardOut&, const HostTensor& dO);
using BenchFn = BenchResult (*)(const Problem&, DType, const BenchSettings&);

struct Variant {
  std::string name;  // stable: scripts and lessons use it
  Device device;
  std::vector<DType> dtypes;
  Supports supports;
  HeadDims head_dims;
  std::string summary;  // one line
  Algorithm algorithm;  // its loop nest, hence its modeled HBM traffic
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;  // nullptr when !supports.backward
  BenchFn bench = nullptr;        // nullptr: timed from the host around forward/backward

  bool available() const;  // CPU: always; CUDA: built with CUDA and a device is present
  bool supports_dtype(DType) const;
};

const std::vector<Variant>& variants();
// Throws InputError listing the known names when `name` is not one.
const Variant& find_variant(const std::string& name);

// Throws InputError (one sentence) unless the variant can run this problem in this dtype:
// head dim, dtype, causal, dropout, GQA, backward, availability.
void check_supported(const Variant&, const Problem&, DType, bool backward);

bool cuda_device_present();     // false when built without CUDA
std::string cuda_device_name();  // e.g. "NVIDIA H100 80GB HBM3"; "" without a device

}  // namespace flashlab
