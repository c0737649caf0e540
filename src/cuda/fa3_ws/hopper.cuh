#pragma once
// The Hopper (sm_90a) vocabulary of cuda-fa3-ws, one small named helper per instruction:
//  * TMA and mbarriers through cuda::ptx (CCCL 3.0): bulk tensor copies that complete on an mbarrier
//    with a transaction-byte count, and parity waits on those barriers.
//  * Inline PTX for what CCCL 3.0 does not wrap: wgmma (fence / commit / wait and the mma_async
//    shapes in wgmma_ops.cuh), setmaxnreg, named barriers (bar.sync / bar.arrive), elect.sync, and ldmatrix /
//    stmatrix (the FP8 forward's V transpose in shared memory).
//  * The swizzles: where TMA puts element (row, col) of a tile, and the wgmma shared-memory matrix descriptor
//    that reads it back.
// Tiles are stored as panels 128 bytes wide (the widest box a 128B swizzle allows: 64 columns of 16-bit
// elements): a (rows, d) tile is d / kPanelCols<T> panels of (rows, kPanelCols<T>), each rows * 128 bytes,
// 1024-byte aligned. Inside a panel, row r's 16-byte chunk c sits at chunk c ^ (r % 8): the 8-row x 128-byte
// "swizzle atom" the copy engine writes and wgmma reads.
// One tile is narrower: a row of e4m3 Q or K at d = 64 is only 64 bytes, so there the (rows, d) tile is one panel
// 64 bytes wide under the 64-byte swizzle (kPanelRowBytesOf<T, D>): the atom is 8 rows x 64 bytes (512, so such a
// tile is 512-byte aligned), and row r's chunk c (of 4) sits at chunk c ^ ((r / 2) % 4). Both are one rule on the
// shared address: its 16-byte chunk bits are XORed with the bits three above them (128B: bits 4-6 with 7-9; 64B:
// bits 4-5 with 7-8). The descriptor helpers take the width as a template argument, 128 unless given.
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "cuda/fa3_ws/element.cuh"
#include "cuda/fa3_ws/wgmma_ops.cuh"

namespace flashlab::cuda::fa3_ws {

namespace ptx = ::cuda::ptx;

inline constexpr int kPanelRowBytes = 128;   // bytes per panel row (the swizzle width)
template <class T>
inline constexpr int kPanelCols = kPanelRowBytes / ElementTraits<T>::kBytes;  // elements per panel row: 64 of 16 bits
inline constexpr int kSwizzleAtomRows = 8;   // rows per swizzle atom
inline constexpr int kSwizzleAtomBytes = kSwizzleAtomRows * kPanelRowBytes;  // 1024: tile alignment
inline constexpr int kWarpgroupThreads = 128;

// The panel row (and swizzle width) of a K-major tile whose rows are `row_bytes` long: a whole 128-byte panel, or
// the whole row where it is shorter. Only 64 bytes is shorter (e4m3 at d = 64); host and device both read this.
__host__ __device__ constexpr int panel_row_bytes(int row_bytes) {
  return row_bytes < kPanelRowBytes ? row_bytes : kPanelRowBytes;
}
// The same for a (rows, D) tile of T: Q_i, K_j (and the backward's (rows, d) tiles, always 128).
template <class T, int D>
inline constexpr int kPanelRowBytesOf = panel_row_bytes(D * ElementTraits<T>::kBytes);

// A swizzle width (bytes per panel row, 128 or 64) and what follows from it.
template <int kRowBytes>
struct Swizzle {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "cuda-fa3-ws swizzles 128- or 64-byte panel rows");
  static constexpr int kAtomBytes = kSwizzleAtomRows * kRowBytes;  // 1024 or 512: the atom, and a tile's alignment
  static constexpr int kKSteps = kRowBytes / kWgmmaRowBytes;        // wgmma k-steps per row: 4 or 2
  // The wgmma descriptor's layout type (bits 62-63): 1 = 128B swizzle, 2 = 64B swizzle.
  static constexpr std::uint64_t kDescLayout = kRowBytes == 128 ? 1 : 2;
};

// ---- 128-byte swizzle ----------------------------------------------------------------------------------

// Byte offset of element (row, col) of type T in a (rows, d) tile stored as 128B-swizzled panels. (Nothing writes or
// reads a 64-byte-swizzled tile but TMA and wgmma, so that swizzle has no such helper.)
template <class T>
__host__ __device__ constexpr std::uint32_t swizzle128_offset(int row, int col, int rows) {
  constexpr int kBytes = ElementTraits<T>::kBytes, kPerChunk = 16 / kBytes;  // elements per 16-byte chunk
  const int panel = col / kPanelCols<T>, c = col % kPanelCols<T>;
  return static_cast<std::uint32_t>(panel * rows * kPanelRowBytes + row * kPanelRowBytes +
                                    (((c / kPerChunk) ^ (row % kSwizzleAtomRows)) * 16) + (c % kPerChunk) * kBytes);
}

// ---- wgmma shared-memory matrix descriptor ---------------------------------------------------------

// Descriptor of a swizzled operand at shared address `addr` (bits 0-13: addr >> 4; 16-29: leading byte offset >> 4;
// 32-45: stride byte offset >> 4; 49-51 base offset 0 (atoms aligned to their own size); 62-63: the layout type,
// 1 = 128B, 2 = 64B).
template <int kRowBytes = kPanelRowBytes>
__device__ __forceinline__ std::uint64_t make_smem_desc(std::uint32_t addr, std::uint32_t lbo_bytes, std::uint32_t sbo_bytes) {
  return static_cast<std::uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (Swizzle<kRowBytes>::kDescLayout << 62);
}
// The descriptor of an operand `bytes` (a multiple of 16) past `desc`'s: its start field (bits 0-13, the address
// / 16) plus bytes / 16. A shared-memory address is below 2^18, so the field cannot carry into the next one, and
// the k-steps of a tile cost one 32-bit add each on the low word instead of a mask, a shift and an or (which the
// compiler cannot drop: it does not know the address's bound). The tile's own descriptor is then built once per
// product, not once per k-step.
__device__ __forceinline__ std::uint64_t desc_advanced(std::uint64_t desc, std::uint32_t bytes) {
  std::uint64_t out;
  asm("{\n.reg .b32 lo, hi;\nmov.b64 {lo, hi}, %1;\nadd.u32 lo, lo, %2;\nmov.b64 %0, {lo, hi};\n}\n"
      : "=l"(out)
      : "l"(desc), "r"(bytes >> 4));
  return out;
}
// K-major operand (rows = M or N, K along the panel row): SBO = one atom (the next 8 rows: 1024, or 512 under the
// 64-byte swizzle); LBO is unused with a swizzle, set to 16 bytes (encoded 1). k-step kk (one wgmma's K: 32 bytes,
// whatever the type) starts 32 kk bytes into its panel (4 k-steps per 128-byte panel, 2 per 64-byte one); the
// hardware applies the swizzle to the address it forms, so the start simply moves.
template <int kRowBytes = kPanelRowBytes>
__device__ __forceinline__ std::uint64_t desc_k_major(std::uint32_t tile_addr, int tile_rows, int kk) {
  using Sw = Swizzle<kRowBytes>;
  const std::uint32_t offset = (kk / Sw::kKSteps) * tile_rows * kRowBytes + (kk % Sw::kKSteps) * kWgmmaRowBytes;
  return desc_advanced(make_smem_desc<kRowBytes>(tile_addr, 16, Sw::kAtomBytes), offset);
}
// MN-major (transposed) operand: K runs down the rows (keys of V), M or N along the 128-byte row (columns
// of V; for the backward's dS^T, queries). PTX ISA canonical layout for 128B swizzle, MN-major: ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO)):
// LBO = bytes from one 64-column panel to the next (tile_rows * 128), SBO = bytes from one group of 8
// K-rows to the next (1024). k-step s (kWgmmaK rows: 16) starts 16 * 128 bytes further down the panel. Only 16-bit
// types have MN-major operands: an 8-bit wgmma takes both operands K-major.
template <class T>
__device__ __forceinline__ std::uint64_t desc_mn_major(std::uint32_t tile_addr, int tile_rows, int s) {
  static_assert(ElementTraits<T>::kBytes == 2, "desc_mn_major: an 8-bit wgmma operand is K-major");
  const std::uint32_t offset = s * ElementTraits<T>::kWgmmaK * kPanelRowBytes;
  return desc_advanced(make_smem_desc(tile_addr, tile_rows * kPanelRowBytes, kSwizzleAtomBytes), offset);
}

// ---- wgmma ---------------------------------------------------------------------------------------------

// Orders this thread's earlier register / shared writes before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmma's issued since the last commit.
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed wgmma groups are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving reads / writes of a register that an in-flight wgmma owns across this point.
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void reg_fence(std::uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <class R, int N>
__device__ __forceinline__ void reg_fence(R (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}
template <class R, int N, int M>
__device__ __forceinline__ void reg_fence(R (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i) reg_fence(r[i]);
}

// The four wgmma forms the passes use, for element type T (wgmma_ops.cuh generates one per type and N). One
// instruction is k = ElementTraits<T>::kWgmmaK deep: 16 for 16-bit types, 32 for 8-bit ones.
// d (64 x N) (+)= A (64 x k) B (k x N); A and B K-major in shared memory (SS form).
template <class T, int N>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
  wgmma_ops::Ss<T, N>::mma(d, desc_a, desc_b, scale_d);
}
// d (64 x N) (+)= A (64 x k, registers) B (k x N in shared memory) (RS form): for 16-bit T, B MN-major (V stored
// (keys, d)); for 8-bit T, K-major (V^T stored (d, keys)).
template <class T, int N>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4], std::uint64_t desc_b, int scale_d) {
  wgmma_ops::Rs<T, N>::mma(d, a, desc_b, scale_d);
}
// d (64 x N) (+)= A (64 x 16) B (16 x N); A and B both MN-major in shared memory (desc_mn_major): the
// backward's dQ = dS K, with dS stored transposed as (keys, queries) and K as (keys, d).
template <class T, int N>
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
  wgmma_ops::SsTt<T, N>::mma(d, desc_a, desc_b, scale_d);
}
// d (64 x N) (+)= A (64 x 16) B (16 x N); A K-major, B MN-major, both in shared memory: the backward's dV += P^T dO
// and dK += dS^T Q where P^T and dS^T come from shared memory rather than the registers (d = 256; d = 64 at Br = 128).
template <class T, int N>
__device__ __forceinline__ void wgmma_ss_nt(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b, int scale_d) {
  wgmma_ops::SsNt<T, N>::mma(d, desc_a, desc_b, scale_d);
}

// ---- register reallocation, named barriers, election ----------------------------------------------------

// Raises this warpgroup's register allocation to kRegs per thread (waits until the pool has them).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Lowers this warpgroup's register allocation to kRegs per thread, returning the rest to the pool.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Waits at hardware barrier `id` until `threads` threads (this one included) have arrived or synced.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Counts this thread at barrier `id` (of `threads`) without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// True in exactly one active lane of the warp (elect.sync).
__device__ __forceinline__ bool elect_one() {
  std::uint32_t elected = 0;
  asm volatile(
      "{\n.reg .pred P;\n"
      "elect.sync _|P, %1;\n"
      "selp.u32 %0, 1, 0, P;\n}\n"
      : "=r"(elected)
      : "r"(0xffffffffu));
  return elected != 0;
}
// Reads the global nanosecond timer (for the optional timeline).
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// ---- ldmatrix / stmatrix (the FP8 forward's V transpose in shared memory) ----------------------------------

// Loads four 8 x 8 matrices of 16-bit elements, transposed, from shared memory (ldmatrix .trans): lane l gives the
// address of row l % 8 of matrix l / 8 (16 bytes); each thread gets one word per matrix, the elements at column
// lane / 4 of rows 2 (lane % 4) (low half) and 2 (lane % 4) + 1 (high half).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// Stores four 8 x 8 matrices of 16-bit elements to shared memory (stmatrix, not transposed): lane l gives the
// address of row l % 8 of matrix l / 8 (16 bytes); word i of each thread goes to matrix i, row lane / 4, bytes
// 4 (lane % 4) .. 4 (lane % 4) + 3.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t addr, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                            std::uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
// Where TMA puts byte `offset` of a tile whose rows are kRowBytes long (128 or 64) under that width's swizzle: the
// 16-byte chunk bits XORed with the bits three above them (the rule above; the tile 1024-byte aligned).
template <int kRowBytes>
__host__ __device__ constexpr std::uint32_t swizzled_offset(std::uint32_t offset) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "cuda-fa3-ws swizzles 128- or 64-byte panel rows");
  return offset ^ (((offset >> 7) & (kRowBytes / 16 - 1)) << 4);
}

// ---- small numeric helpers ---------------------------------------------------------------------------

// The value of x, which the compiler cannot see through (keeps loop-invariant math inside a loop).
template <class X>
__device__ __forceinline__ X opaque(X x) {
  if constexpr (sizeof(X) == 8) {
    std::uint64_t u;
    memcpy(&u, &x, 8);
    asm volatile("mov.b64 %0, %0;\n" : "+l"(u));
    memcpy(&x, &u, 8);
  } else {
    std::uint32_t u;
    memcpy(&u, &x, 4);
    asm volatile("mov.b32 %0, %0;\n" : "+r"(u));
    memcpy(&x, &u, 4);
  }
  return x;
}
// Each of xs replaced by its opaque copy, in the order given (the order is the caller's: it decides which value
// the compiler recomputes from first, and so the code it schedules).
template <class... X>
__device__ __forceinline__ void pin(X&... xs) {
  ((xs = opaque(xs)), ...);
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: exp2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- mbarriers and TMA (cuda::ptx) ---------------------------------------------------------------------

// One thread: sets the barrier's expected arrival count.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, std::uint32_t count) { ptx::mbarrier_init(bar, count); }
// Makes initialized barriers visible to the copy engine (then a __syncthreads).
__device__ __forceinline__ void mbar_init_fence() { ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster); }
// Counts one arrival and adds `bytes` to the transactions this phase waits for (the TMA issuer).
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}
// Counts one arrival (a consumer releasing a stage).
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) { (void)ptx::mbarrier_arrive(bar); }
// A consumer warp releases a stage: one arrival per warp (the empty barriers count one per consumer warp), once
// every lane is past its reads.
__device__ __forceinline__ void mbar_arrive_per_warp(std::uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
// Spins until the barrier's phase with parity `parity` has completed. A pipeline that never completes one hangs
// here: tools/fa3_harness waits for its kernels with a host-side deadline and names the launch that did not end.
// No printf or timer belongs in this loop: a printf is a function call, and ptxas serializes every wgmma of a
// kernel whose wgmma pipeline crosses a call (C7510).
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}
// Copies one box of a 4-D tensor map into shared memory; completion counts bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const void* tensor_map, int c0, int c1, int c2, int c3,
                                            std::uint64_t* bar) {
  const std::int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_shared, ptx::space_global, smem_dst, tensor_map, coords, bar);
}
// Orders this thread's generic-proxy shared-memory accesses with later async-proxy (TMA / wgmma) ones.
__device__ __forceinline__ void fence_proxy_async_smem() { ptx::fence_proxy_async(ptx::space_shared); }

// Shared-window address of a generic pointer into shared memory.
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- the block's shared memory -------------------------------------------------------------------------

// The dynamic shared window is only 16-byte aligned: the tiles start at the next swizzle atom, smem_raw +
// swizzle_atom_pad(smem_raw), so each layout asks for kSmemAlignSlack bytes beyond its tiles and barriers. (The
// kernel adds the pad to its own extern __shared__ array: a helper returning the pointer hands the compiler a
// generic one, which changes how the forward's volatile tile-slot accesses compile.)
inline constexpr int kSmemAlignSlack = kSwizzleAtomBytes;
__device__ __forceinline__ std::uint32_t swizzle_atom_pad(const void* smem_raw) {
  return (kSwizzleAtomBytes - smem_u32(smem_raw) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
}

}  // namespace flashlab::cuda::fa3_ws
