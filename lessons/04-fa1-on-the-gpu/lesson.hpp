#pragma once
// Lesson 04: FlashAttention-1's forward pass (paper Algorithm 1) as a CUDA kernel, one head, fp32.
// You write the kernel in exercise.cu; solution.cu is ours; test.cu runs it on the GPU and checks it
// against the project's reference (src/cpu_reference: naive_forward<double>).
namespace flashlab::lesson04 {

constexpr int kBr = 32;           // rows of Q per tile: one thread per row
constexpr int kBc = 32;           // rows of K and V per tile
constexpr int kMaxHeadDim = 64;   // the kernel's arrays are sized for d <= 64

// Launches the FA1 kernel on device arrays (row-major, one head, no mask):
//   Q (seq_q, d), K and V (seq_k, d)              inputs
//   O (seq_q, d), m and l (seq_q)                 outputs, and FA1's running max and sum, in HBM
// One thread block of kBr threads does the whole head, K/V block loop outer, Q block loop inner.
void launch_fa1_forward(const float* Q, const float* K, const float* V, float* O, float* m, float* l, int seq_q,
                        int seq_k, int d, float scale);

}  // namespace flashlab::lesson04
