#pragma once
// NumPy .npy files (format 1.0/2.0/3.0), little-endian float64, float32 and float16, C order; and uint8 written
// for e4m3 bytes. Malformed, big-endian, Fortran-order or other-dtype files throw InputError naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include "core/fp8.hpp"  // E4m3Qkv
#include "core/problem.hpp"
#include "core/tensor.hpp"

namespace flashlab {

struct NpyArray {
  HostTensor tensor;  // values widened to double
  DType dtype;        // F64, F32 or F16 as stored
};

NpyArray read_npy(const std::string& path);
// Writes `t` with dtype F64, F32 or F16 (BF16 and E4M3 have no NumPy dtype: throws InputError).
void write_npy(const std::string& path, const HostTensor& t, DType dtype);
// Writes raw bytes as a uint8 ('|u1') array of `dims`, C order: how e4m3 tensors are saved (NumPy has no float8;
// numpy.load(...).view(ml_dtypes.float8_e4m3fn) or torch.from_numpy(...).view(torch.float8_e4m3fn) reads them back
// as e4m3). std::logic_error unless bytes.size() is the product of dims.
void write_npy_u8(const std::string& path, const std::vector<std::int64_t>& dims,
                  const std::vector<std::uint8_t>& bytes);

// The inputs of an FP8 forward as .npy files in folder `dir` (made, with its parents, if missing), so that a run
// can be checked elsewhere (`flashlab run --dtype e4m3 --save-quantized DIR`): q.npy, k.npy, v.npy hold the e4m3
// bytes as uint8 (write_npy_u8), shaped (B, S_q, H_q, d) and (B, S_k, H_kv, d); q_descale.npy (B, H_q),
// k_descale.npy and v_descale.npy (B, H_kv) hold the descales as float32, so that a value is its e4m3 value times
// the descale of its (batch, head). Returns the paths written, in that order. InputError when the folder cannot be
// made or a file written; std::logic_error when the sizes are not the shape's.
std::vector<std::string> write_e4m3_npy(const std::string& dir, const Shape&, const E4m3Qkv&);

}  // namespace flashlab
