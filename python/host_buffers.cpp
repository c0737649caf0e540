#include "host_buffers.hpp"

#include <cstdint>
#include <cstring>
#include <utility>

#include "core/half.hpp"

namespace flashlab::python {
namespace {


// The buffer protocol's format character of each host dtype (native byte order).
const char* format_of(DType t) {
  switch (t) {
    case DType::F64: return "d";
    case DType::F32: return "f";
    case DType::F16: return "e";
    case DType::BF16: break;
    case DType::E4M3:
      throw InputError("NumPy has no float8 dtype, so e4m3 values cannot be held in a float array: the FP8 forward "
                       "returns O's bf16 values as float32, and its quantized inputs as uint8 bytes");
  }
  throw InputError("NumPy has no bfloat16 dtype, so bf16 results cannot be returned in host memory");
}

bool little_endian_host() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// "float32" for "f", "int64" for "l", ... and "float64 (big-endian)" for ">d": what a sentence calls it.
std::string describe_format(const std::string& format, py::ssize_t itemsize) {
  std::string code = format;
  std::string order;
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '!' || code[0] == '=' || code[0] == '@')) {
    const bool big = code[0] == '>' || code[0] == '!';
    if (code[0] != '=' && code[0] != '@' && big == little_endian_host()) order = big ? " (big-endian)" : " (little-endian)";
    code.erase(0, 1);
  }
  const std::string bits = std::to_string(8 * itemsize);
  std::string kind;
  if (code == "e" || code == "f" || code == "d" || code == "g") kind = "float";
  else if (code == "b" || code == "h" || code == "i" || code == "l" || code == "q") kind = "int";
  else if (code == "B" || code == "H" || code == "I" || code == "L" || code == "Q") kind = "uint";
  else if (code == "?") return "bool" + order;
  else return "buffer format '" + format + "'";
  return kind + bits + order;
}

// The (B, S, H, D) order in which to read a 4-d array given in `layout`: (B, H, S, D) swaps axes 1 and 2.
std::vector<std::size_t> read_order(std::size_t rank, Layout layout) {
  std::vector<std::size_t> order(rank);
  for (std::size_t i = 0; i < rank; ++i) order[i] = i;
  if (rank == kInputRank && layout == Layout::BHSD) std::swap(order[1], order[2]);
  return order;
}

double load(const std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::F64: {
      double x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case DType::F32: {
      float x;
      std::memcpy(&x, p, sizeof x);
      return x;
    }
    case DType::F16: {
      std::uint16_t bits;
      std::memcpy(&bits, p, sizeof bits);
      return f16_bits_to_float(bits);
    }
    case DType::BF16:
    case DType::E4M3: break;  // never an input's dtype (HostInput::dtype)
  }
  return 0;
}

void store(std::byte* p, double x, DType dtype) {
  switch (dtype) {
    case DType::F64: std::memcpy(p, &x, sizeof x); return;
    case DType::F32: {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, sizeof f);
      return;
    }
    case DType::F16: {
      const std::uint16_t bits = float_to_f16_bits(static_cast<float>(x));  // exact: x is an f16 value
      std::memcpy(p, &bits, sizeof bits);
      return;
    }
    case DType::BF16:
    case DType::E4M3: return;  // refused by format_of first
  }
}

}  // namespace

HostInput::HostInput(const py::buffer& array, std::string name) : info_(array.request()), name_(std::move(name)) {}

InputDims HostInput::dims() const { return {name_, std::vector<std::int64_t>(info_.shape.begin(), info_.shape.end())}; }

DType HostInput::dtype() const {
  std::string code = info_.format;
  if (!code.empty() && (code[0] == '@' || code[0] == '=' || code[0] == (little_endian_host() ? '<' : '>')))
    code.erase(0, 1);
  if (code == "d" && info_.itemsize == 8) return DType::F64;
  if (code == "f" && info_.itemsize == 4) return DType::F32;
  if (code == "e" && info_.itemsize == 2) return DType::F16;
  throw InputError(name_ + " has dtype " + describe_format(info_.format, info_.itemsize) +
                   ": supported are float64, float32 and float16 in native byte order (NumPy has no bfloat16)");
}

HostTensor HostInput::to_host_tensor(Layout layout) const {
  const DType type = dtype();
  const std::size_t rank = info_.shape.size();
  const std::vector<std::size_t> order = read_order(rank, layout);
  std::vector<std::int64_t> dims(rank), strides(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    dims[i] = info_.shape[order[i]];
    strides[i] = info_.strides[order[i]];
  }
  HostTensor t(dims);
  // Row-major over `dims`, the source offset kept up to date like an odometer.
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t offset = 0;
  const auto* base = static_cast<const std::byte*>(info_.ptr);
  for (double& x : t.data) {
    x = load(base + offset, type);
    for (std::size_t axis = rank; axis-- > 0;) {
      offset += strides[axis];
      if (++index[axis] < dims[axis]) break;
      offset -= strides[axis] * dims[axis];
      index[axis] = 0;
    }
  }
  return t;
}

HostArray::HostArray(const HostTensor& t, DType dtype, Layout layout) : dtype_(dtype) {
  const py::ssize_t itemsize = dtype_bytes(dtype);
  format_of(dtype);  // refuses bf16 before anything is allocated
  bytes_.resize(t.data.size() * static_cast<std::size_t>(itemsize));
  for (std::size_t n = 0; n < t.data.size(); ++n) store(bytes_.data() + n * itemsize, t.data[n], dtype);
  // Row-major strides of t, then both shown in the caller's layout (the same swap as the read).
  const std::size_t rank = t.dims.size();
  std::vector<py::ssize_t> strides(rank, itemsize);
  for (std::size_t i = rank; i-- > 1;) strides[i - 1] = strides[i] * t.dims[i];
  for (std::size_t axis : read_order(rank, layout)) {
    shape_.push_back(t.dims[axis]);
    strides_.push_back(strides[axis]);
  }
}

py::buffer_info HostArray::buffer() {
  return py::buffer_info(bytes_.data(), dtype_bytes(dtype_), format_of(dtype_), static_cast<py::ssize_t>(shape_.size()),
                         shape_, strides_);
}

}  // namespace flashlab::python
