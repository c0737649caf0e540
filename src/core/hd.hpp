#pragma once
// FLASHLAB_HD marks code shared by host and device: compiled by g++ as plain C++, by nvcc for both.
#if defined(__CUDACC__)
#define FLASHLAB_HD __host__ __device__ __forceinline__
#else
#define FLASHLAB_HD inline
#endif
