#pragma once
// A device call's scratch (DeviceLaunch::scratch of core/device_io.hpp) carved into typed arrays, each starting at a
// multiple of kScratchAlign bytes. The same carving sizes it: a ScratchCarver with no base only counts, so a variant
// writes its layout once and its device_scratch_bytes is what that layout takes (Variant::device_scratch_bytes).
// Plain pointers: this header needs no CUDA.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace flashlab {

inline constexpr std::size_t kScratchAlign = 256;  // cudaMalloc's alignment; PyTorch's allocator gives 512

class ScratchCarver {
 public:
  ScratchCarver() = default;  // counts only
  ScratchCarver(void* base, std::size_t bytes) : base_(static_cast<unsigned char*>(base)), bytes_(bytes) {
    if (reinterpret_cast<std::uintptr_t>(base) % kScratchAlign != 0)
      throw std::logic_error("a device call's scratch starts at a multiple of " + std::to_string(kScratchAlign) +
                             " bytes");
  }

  // The next `count` elements of T (nullptr while counting).
  template <class T>
  T* take(std::size_t count) {
    offset_ = (offset_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    T* at = base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * sizeof(T);
    if (base_ != nullptr && offset_ > bytes_)
      throw std::logic_error("a device call's scratch of " + std::to_string(bytes_) + " bytes is smaller than its " +
                             "layout (the registry checks the size)");
    return at;
  }
  std::size_t used() const { return offset_; }

 private:
  unsigned char* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t offset_ = 0;
};

}  // namespace flashlab
