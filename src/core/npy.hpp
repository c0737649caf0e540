#pragma once
// NumPy .npy files (format 1.0/2.0/3.0), little-endian float64, float32 and float16, C order.
// Malformed, big-endian, Fortran-order or other-dtype files throw InputError naming the file.
#include <string>

#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab {

struct NpyArray {
  HostTensor tensor;  // values widened to double
  DType dtype;        // F64, F32 or F16 as stored
};

NpyArray read_npy(const std::string& path);
// Writes `t` with dtype F64, F32 or F16 (BF16 has no NumPy dtype: throws InputError).
void write_npy(const std::string& path, const HostTensor& t, DType dtype);

}  // namespace flashlab
