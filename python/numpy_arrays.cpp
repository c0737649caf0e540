#include "numpy_arrays.hpp"

#include <algorithm>

namespace flashlab::python {
namespace {

constexpr std::size_t kRank = 4;

py::module_ numpy() { return py::module_::import("numpy"); }

// (B, H, S, D) <-> (B, S, H, D): the same swap of axes 1 and 2 both ways.
py::array swap_seq_and_heads(const py::array& a) { return a.attr("transpose")(0, 2, 1, 3); }

const char* numpy_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "float64";
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: break;
  }
  throw InputError("NumPy has no bfloat16 dtype, so bf16 results cannot be returned as NumPy arrays");
}

}  // namespace

std::vector<std::int64_t> dims_of(const py::array& a) {
  return std::vector<std::int64_t>(a.shape(), a.shape() + a.ndim());
}

DType dtype_of(const py::array& a, const std::string& name) {
  for (DType t : {DType::F64, DType::F32, DType::F16})
    if (a.dtype().equal(py::dtype(numpy_name(t)))) return t;
  throw InputError(name + " has dtype " + py::str(a.dtype()).cast<std::string>() +
                   ": supported are float64, float32 and float16 in native byte order (NumPy has no bfloat16)");
}

HostTensor to_host_tensor(const py::array& a, Layout layout) {
  py::array view = a;
  if (a.ndim() == static_cast<py::ssize_t>(kRank) && layout == Layout::BHSD) view = swap_seq_and_heads(a);
  // NumPy does the strided, exact widening copy to float64.
  const auto values = py::array_t<double, py::array::c_style>::ensure(numpy().attr("ascontiguousarray")(view, "float64"));
  HostTensor t(dims_of(values));
  std::copy(values.data(), values.data() + values.size(), t.data.begin());
  return t;
}

py::array to_numpy(const HostTensor& t, DType dtype, Layout layout) {
  py::array_t<double, py::array::c_style> values(t.dims);
  std::copy(t.data.begin(), t.data.end(), values.mutable_data());
  // Exact: a variant's outputs are representable in its dtype (core/tensor.hpp).
  py::array out = values.attr("astype")(numpy_name(dtype));
  if (t.dims.size() == kRank && layout == Layout::BHSD) out = swap_seq_and_heads(out);
  return out;
}

}  // namespace flashlab::python
