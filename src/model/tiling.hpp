#pragma once
// Tilings of the attention loop nest: Br query rows by Bc key columns per tile, and the paper's rule
// for choosing them from an SRAM size. Every loop nest (CPU, traffic model) and every kernel that
// reports its tiles speaks in these.
#include <cstdint>

namespace flashlab {

// Block sizes: Br query rows by Bc key columns.
struct Tiling {
  int Br = 0, Bc = 0;
};

// The paper's choice for an SRAM of `sram_bytes` (M elements = sram_bytes / bytes_per_element):
// Bc = ceil(M / 4d), Br = min(Bc, d). Throws InputError when M cannot hold one row each of
// Q, K, V and O (M < 4d).
Tiling tiling_from_sram(std::int64_t sram_bytes, int head_dim, int bytes_per_element);

}  // namespace flashlab
