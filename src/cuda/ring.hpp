#pragma once
// Ring attention on one GPU: the P ranks of model/ring.hpp's schedule emulated by P CUDA streams, so that
// the ring is testable and measurable on one card (the CPU reference, cpu_reference/ring.hpp, is its
// ground truth). Each rank keeps its queries; its K/V share moves to the next rank by a device-to-device
// copy on a stream of its own, which overlaps the rank's compute on the share in hand; each block is one
// launch of a block kernel (cuda-fa3-ws or cuda-fa2), and each rank folds the block's O and L into its running fp32 (O, L) through the
// logsumexp, as the CPU reference does. The backward sends each share's dK/dV partial sums (fp32) along with
// it, adds every rank's blocks into them (the block kernel's backward in its accumulate mode) and brings them home with
// one more hop; dQ stays where its queries are. Each of dQ, dK, dV is rounded to the input dtype once, at the end.
#include "core/bench.hpp"
#include "core/device_io.hpp"
#include "core/problem.hpp"
#include "core/tensor.hpp"
#include "model/ring.hpp"

namespace flashlab {

// The kernel every block of the ring runs on: cuda-fa3-ws (Hopper only; the default) or cuda-fa2 (any GPU the
// project's CUDA build runs on). Either way the ring computes the same function.
enum class RingBlockKernel { Fa3Ws, Fa2 };
const char* to_string(RingBlockKernel);  // "cuda-fa3-ws", "cuda-fa2"

// Throws InputError, in one sentence, for a problem the GPU ring refuses before any work (a schedule of other
// lengths or alignment; dropout; a dtype or head dim cuda-fa3-ws lacks, for the backward when `backward`; a GPU
// that is not compute capability 9.0). Diagonal blocks that would need their rows split are refused by the
// launch plans, also before any work.
void check_gpu_ring_problem(const RingSchedule& ring, const Problem& p, DType dtype, bool backward,
                            RingBlockKernel kernel = RingBlockKernel::Fa3Ws);

// O and L of attention on the device tensors of `io` (global (B, S, H, D) layout), computed by the ring of
// `ring` (made for p's lengths and causal alignment). f16 or bf16, a head dim cuda-fa3-ws has, compute
// capability 9.0, no dropout. Throws InputError, in one sentence, for what it refuses (block_launch's
// diagonal blocks that would need their rows split; a schedule of other lengths; dropout; a head dim, dtype or
// GPU the block kernel lacks). Returns when the device has finished.
void cuda_ring_forward_on_device(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceForwardIo& io,
                                 RingBlockKernel kernel = RingBlockKernel::Fa3Ws);

// dQ, dK, dV on the device tensors of `io` from the forward's O and L (the global ones, as any forward wrote
// them) and dO, computed by the ring. Refuses what the forward refuses, and head dims cuda-fa3-ws's backward lacks.
void cuda_ring_backward_on_device(const RingSchedule& ring, const Problem& p, DType dtype, const DeviceBackwardIo& io,
                                  RingBlockKernel kernel = RingBlockKernel::Fa3Ws);

// Times the ring's forward (and backward, with settings.backward) on random inputs of the problem, as the kernels'
// benches do (core/bench.hpp): its buffers made once, then warm-up and timed runs of whole ring passes.
BenchResult cuda_ring_bench(const RingSchedule& ring, const Problem& p, DType dtype, const BenchSettings& settings,
                            RingBlockKernel kernel = RingBlockKernel::Fa3Ws);

// The same from host tensors: upload, the device entry, download.
ForwardOut cuda_ring_forward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in,
                             RingBlockKernel kernel = RingBlockKernel::Fa3Ws);
Grads cuda_ring_backward(const RingSchedule& ring, const Problem& p, DType dtype, const Qkv& in, const ForwardOut& fwd,
                         const HostTensor& dO, RingBlockKernel kernel = RingBlockKernel::Fa3Ws);

}  // namespace flashlab
