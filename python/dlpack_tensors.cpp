#include "dlpack_tensors.hpp"

#include <iterator>
#include <utility>

#include "core/tensor.hpp"
#include "registry/variants.hpp"

namespace flashlab::python {
namespace {

constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";

// Row-major strides, in elements, of the memory the kernels read for `dims` given in `layout`: (B, S, H, D)
// for a 4-d tensor (so a bhsd tensor's are those of its (B, S, H, D) memory, reordered), as is otherwise.
std::vector<std::int64_t> kernel_strides(const std::vector<std::int64_t>& dims, Layout layout) {
  const bool four_d = dims.size() == kInputRank;
  const std::vector<std::int64_t> memory_dims = four_d ? to_bshd(dims, layout) : dims;
  std::vector<std::int64_t> strides(memory_dims.size(), 1);
  for (std::size_t i = memory_dims.size(); i-- > 1;) strides[i - 1] = strides[i] * memory_dims[i];
  return four_d ? from_bshd(strides, layout) : strides;
}

std::string describe_dtype(DLDataType t) {
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  // DLPack 1.1's 8-bit float codes 7..14 name their format whole (PyTorch's float8_e5m2 is 12).
  const char* float8[] = {"float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
                          "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"};
  if (t.code >= 7 && t.code < 7 + std::size(float8) && t.bits == 8 && t.lanes == 1) return float8[t.code - 7];
  std::string name = t.code < std::size(kinds) ? kinds[t.code] : "code " + std::to_string(t.code) + " ";
  name += std::to_string(t.bits);
  if (t.lanes != 1) name += " x" + std::to_string(t.lanes);
  return name;
}

// DLPack 1.1's type code for float8 e4m3 "fn" (finite, no infinity: the OCP format of core/fp8.hpp, PyTorch's
// torch.float8_e4m3fn). The dlpack.h this module builds against may be older than 1.1 and not name it.
constexpr std::uint8_t kDLFloat8E4m3fnCode = 10;

DType dtype_from(DLDataType t, const std::string& name, bool uint8_is_e4m3) {
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 64) return DType::F64;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 32) return DType::F32;
  if (t.lanes == 1 && t.code == kDLFloat && t.bits == 16) return DType::F16;
  if (t.lanes == 1 && t.code == kDLBfloat && t.bits == 16) return DType::BF16;
  if (t.lanes == 1 && t.code == kDLFloat8E4m3fnCode && t.bits == 8) return DType::E4M3;
  if (t.lanes == 1 && t.code == kDLUInt && t.bits == 8) {
    if (uint8_is_e4m3) return DType::E4M3;
    throw InputError(name + " has dtype uint8: pass dtype='e4m3' to have uint8 tensors read as e4m3 bytes (the FP8 "
                     "forward, with q_descale, k_descale and v_descale), or pass float64, float32, float16 or bfloat16");
  }
  throw InputError(name + " has dtype " + describe_dtype(t) + ": supported are float64, float32, float16 and bfloat16, "
                   "and for the FP8 forward float8_e4m3fn (or uint8 holding e4m3 bytes, with dtype='e4m3')");
}

DLDataType dlpack_dtype(DType t) {
  switch (t) {
    case DType::F64: return {kDLFloat, 64, 1};
    case DType::F32: return {kDLFloat, 32, 1};
    case DType::F16: return {kDLFloat, 16, 1};
    case DType::BF16: return {kDLBfloat, 16, 1};
    case DType::E4M3: break;
  }
  throw InputError(std::string("the Python module makes no ") + to_string(t) +
                   " GPU arrays: the FP8 forward writes O in bf16 and the LSE in f32");
}

std::string describe_memory(int device_type) {
  switch (device_type) {
    case kDLCPU: return "host memory";
    case kDLCUDAHost: return "pinned host memory (kDLCUDAHost)";
    case kDLCUDAManaged: return "CUDA managed memory";
    case kDLROCM: return "ROCm device memory";
    default: return "memory of DLPack device type " + std::to_string(device_type);
  }
}

// What a DeviceArray hands to a consumer: the DLPack struct, its shape and strides, and a share of the memory.
struct Exported {
  DLManagedTensor managed{};
  std::shared_ptr<void> memory;
  std::vector<std::int64_t> shape, strides;
};

void delete_exported(DLManagedTensor* managed) { delete static_cast<Exported*>(managed->manager_ctx); }

// A capsule nobody consumed still owns its tensor (a consumer renames it "used_dltensor" and calls the
// deleter itself).
void destroy_unconsumed_capsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

}  // namespace

DeviceInput::DeviceInput(py::capsule capsule, std::string name, bool uint8_is_e4m3) : name_(std::move(name)) {
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName))
    throw InputError(name_ + "'s __dlpack__() did not return an unused DLPack tensor capsule");
  managed_.reset(static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName)));
  PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);  // ours now: its deleter runs when this object goes
  const DLTensor& t = managed_->dl_tensor;
  if (t.device.device_type != kDLCUDA)
    throw InputError(name_ + " is in " + describe_memory(t.device.device_type) +
                     ": pass tensors in CUDA device memory, or NumPy arrays in host memory");
  dtype_ = dtype_from(t.dtype, name_, uint8_is_e4m3);
  device_ = t.device.device_id;
  dims_.assign(t.shape, t.shape + t.ndim);
  if (t.strides) strides_.assign(t.strides, t.strides + t.ndim);
  data_ = static_cast<char*>(t.data) + t.byte_offset;
}

void DeviceInput::require_kernel_layout(Layout layout) const {
  const std::vector<std::int64_t> want = kernel_strides(dims_, layout);
  // No strides: the producer says the tensor is compact and row-major in its own dims.
  const std::vector<std::int64_t> have = strides_.empty() ? kernel_strides(dims_, Layout::BSHD) : strides_;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i] == 1 || have[i] == want[i]) continue;  // an axis of extent 1 has any stride
    if (dims_.size() == kInputRank && layout == Layout::BHSD)
      throw InputError(name_ + " has strides " + dims_string(have) +
                       " (in elements), but the kernels read (batch, seq, heads, head_dim) memory in place, so a "
                       "(batch, heads, seq, head_dim) tensor must be a transposed view of it, with strides " +
                       dims_string(want) + ", as x.transpose(1, 2) of a contiguous tensor is");
    throw InputError(name_ + " is not contiguous (its strides are " + dims_string(have) +
                     " elements, a contiguous tensor's " + dims_string(want) +
                     "): the kernels read it in place, so pass a contiguous copy");
  }
}

std::size_t DeviceInput::bytes() const {
  std::size_t elements = 1;
  for (std::int64_t d : dims_) elements *= static_cast<std::size_t>(d);
  return elements * static_cast<std::size_t>(dtype_bytes(dtype_));
}

void DeviceInput::require_fits_result(const std::vector<std::int64_t>& dims, DType dtype, int device,
                                      Layout layout) const {
  if (dims_ != dims)
    throw InputError(name_ + " has shape " + dims_string(dims_) + " but the result it is to hold has shape " +
                     dims_string(dims));
  if (dtype_ != dtype)
    throw InputError(name_ + " is " + to_string(dtype_) + " but the result it is to hold is " + to_string(dtype));
  if (device_ != device)
    throw InputError(name_ + " is on CUDA device " + std::to_string(device_) + " but the inputs are on CUDA device " +
                     std::to_string(device));
  require_kernel_layout(layout);
}

void require_same_dtype_and_device(const std::vector<const DeviceInput*>& inputs) {
  const DeviceInput& first = *inputs.front();
  for (const DeviceInput* t : inputs) {
    if (t->dtype() != first.dtype())
      throw InputError(first.name() + " is " + to_string(first.dtype()) + " but " + t->name() + " is " +
                       to_string(t->dtype()) + ": pass them in one dtype");
    if (t->device() != first.device())
      throw InputError(first.name() + " is on CUDA device " + std::to_string(first.device()) + " but " + t->name() +
                       " is on CUDA device " + std::to_string(t->device()) + ": pass every tensor on one device");
  }
}

DeviceArray::DeviceArray(std::vector<std::int64_t> dims, Layout layout, DType dtype, int device)
    : dims_(std::move(dims)), dtype_(dtype), device_(device) {
  strides_ = kernel_strides(dims_, layout);
  std::size_t elements = 1;
  for (std::int64_t d : dims_) elements *= static_cast<std::size_t>(d);
  memory_ = allocate_on_cuda_device(elements * dtype_bytes(dtype_), device_);
}

ResultBuffer::ResultBuffer(const std::optional<py::capsule>& given, std::string name, std::vector<std::int64_t> dims,
                           Layout layout, DType dtype, int device) {
  if (given) {
    given_.emplace(*given, std::move(name));
    given_->require_fits_result(dims, dtype, device, layout);
  } else {
    made_ = std::make_unique<DeviceArray>(std::move(dims), layout, dtype, device);
  }
}

void* ResultBuffer::data() const { return given_ ? given_->data() : made_->data(); }

void ResultBuffer::require_apart_from(const std::vector<const DeviceInput*>& inputs) const {
  if (!given_) return;  // a new DeviceArray overlaps nothing
  const DeviceInput& out = *given_;
  const auto begin = [](const DeviceInput& t) { return reinterpret_cast<std::uintptr_t>(t.data()); };
  for (const DeviceInput* t : inputs)
    if (begin(out) < begin(*t) + t->bytes() && begin(*t) < begin(out) + out.bytes())
      throw InputError(out.name() + " overlaps " + t->name() + " in memory: the kernels would write " + out.name() +
                       " while they read " + t->name() + ", so pass a separate tensor");
}

py::object ResultBuffer::release() { return made_ ? py::cast(std::move(*made_)) : py::none(); }

py::capsule DeviceArray::dlpack(const py::object& /*stream*/) const {
  auto* exported = new Exported{{}, memory_, dims_, strides_};
  DLManagedTensor& m = exported->managed;
  m.dl_tensor.data = memory_.get();
  m.dl_tensor.device = {kDLCUDA, device_};
  m.dl_tensor.ndim = static_cast<std::int32_t>(dims_.size());
  m.dl_tensor.dtype = dlpack_dtype(dtype_);
  m.dl_tensor.shape = exported->shape.data();
  m.dl_tensor.strides = exported->strides.data();
  m.dl_tensor.byte_offset = 0;
  m.manager_ctx = exported;
  m.deleter = delete_exported;
  PyObject* capsule = PyCapsule_New(&m, kCapsuleName, destroy_unconsumed_capsule);
  if (capsule == nullptr) {
    delete exported;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::tuple DeviceArray::dlpack_device() const { return py::make_tuple(static_cast<int>(kDLCUDA), device_); }

}  // namespace flashlab::python
