// cuda-fa3-ws's FP8 forward: the shipped (persistent) kernel built for float8 e4m3 operands. Two tensor-core rates
// separate FP8 from bf16 on Hopper: an 8-bit wgmma is twice as deep (k32) for the same issue slot, so each GEMM
// takes half the instructions, and each tile is half the bytes to move. What had to change for it, each in the part
// that owns it:
//  * both operands of an 8-bit wgmma are K-major, so V is read as V^T (d, keys): fp8_transpose_v.cu writes it once
//    per call, before the forward, and the producer loads V_j^T boxes of 128 keys (producer.cuh). The other way,
//    launch_forward_e4m3_vt_in_smem, loads V_j as it is stored and has the producer's warps transpose it in shared
//    memory (fp8_transpose_v_smem.cuh): no pass over V and no scratch, but shared-memory traffic in every block;
//    tools/fa3_harness/race.sh races the two;
//  * P is rounded to e4m3 straight from S's accumulator registers, with V^T's keys permuted to match, so no value
//    moves between threads (fp8_layout.cuh);
//  * P needs no dynamic scale: the running max never lags (P <= 1), so 448 P fills e4m3's range, and the 448,
//    folded into the exponent, cancels in O = (sum 448 P V) / (sum 448 P) (online_softmax.cuh);
//  * Q, K and V carry one descale per (batch, head): Q's and K's multiply the softmax scale (forward_consumer.cuh),
//    V's the epilogue's 1 / l (forward_epilogue.cuh), and O is written in bf16;
//  * the tiles: Bc = 128 keys, one panel of V^T, O_i with a buffer of its own (forward_config.cuh, E4m3HeadConfig);
//    at d = 128 Bc = 256, two panels: FP8's GEMMs are half as long, so a K/V block's fixed costs weigh twice as much,
//    and a wider block spreads them (tools/fa3_harness/race.sh, fp8_d128_wide). S_ij, O_i and P's fragments do not
//    fit the registers at once there, so P V is waited before S_ij is issued (kPvBeforeS);
//  * at d = 64 a row of Q_i or K_j is only 64 bytes: those two tiles take the 64-byte swizzle (their tensor maps,
//    forward.cu, and their descriptors, hopper.cuh's desc_k_major), while V^T's rows (128 keys) and O_i's (bf16,
//    128 bytes) keep the 128-byte one.
#include <cstdint>

#include "cuda/fa3_ws/forward_kernel.cuh"

namespace flashlab::cuda::fa3_ws {

std::int64_t fp8_vt_bytes(int batch, int heads_kv, int head_dim, int seq_k) {
  return static_cast<std::int64_t>(batch) * heads_kv * head_dim * fp8_vt_keys(seq_k);
}

void launch_forward_e4m3(const Params& p, cudaStream_t stream) {
  check_launch_e4m3(p);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  transpose_v_e4m3(p.v, p.vt, p.batch, p.seq_k, p.heads_kv, p.head_dim, stream);
  dispatch_head_dim<kE4m3HeadDims>(p.head_dim, "cuda-fa3-ws FP8 forward", [&]<int D>() {
    using Sched = Fp8ShippedSchedule<D>;
    static_assert(KernelConfig<__nv_fp8_e4m3, D, static_cast<int>(kShippedStep), Sched>::kBc == e4m3_kernel_block_keys(D),
                  "core/fp8.hpp's e4m3_kernel_block_keys tells the CPU emulation the shipped kernel's K/V blocks");
    launch_config<__nv_fp8_e4m3, D, static_cast<int>(kShippedStep), false, false, Sched>(p, stream);
  });
}

void launch_forward_e4m3_vt_in_smem(const Params& p, cudaStream_t stream) {
  check_launch_e4m3(p, /*needs_vt=*/false);
  if (p.seq_q == 0 || p.batch == 0 || p.heads_q == 0) return;
  dispatch_head_dim<kE4m3HeadDims>(p.head_dim, "cuda-fa3-ws FP8 forward, V transposed in the producer", [&]<int D>() {
    launch_config<__nv_fp8_e4m3, D, static_cast<int>(kShippedStep), false, false, Fp8InKernelTransposeSchedule<D>>(
        p, stream);
  });
}

}  // namespace flashlab::cuda::fa3_ws
