#pragma once
// Lesson 05: FlashAttention-2's forward pass as a CUDA kernel, one head, fp32: lesson 04's kernel
// with the loops swapped. You write the kernel's two TODO blocks in exercise.cu; solution.cu is ours;
// test.cu runs it on the GPU against the project's reference (naive_forward<double>).
namespace flashlab::lesson05 {

constexpr int kBr = 32;           // rows of Q per block: one thread per row
constexpr int kBc = 32;           // rows of K and V per tile
constexpr int kMaxHeadDim = 64;   // the kernel's arrays are sized for d <= 64

// Launches the FA2 kernel on device arrays (row-major, one head, no mask):
//   Q (seq_q, d), K and V (seq_k, d)   inputs
//   O (seq_q, d), L (seq_q)            outputs: attention and the log-sum-exp of each row of S
//   o_row_writes                       a counter: +1 every time a row of O is written to HBM
// One thread block per Q block (ceil(seq_q / kBr) blocks: parallel over query blocks), K/V loop inside.
void launch_fa2_forward(const float* Q, const float* K, const float* V, float* O, float* L,
                        unsigned long long* o_row_writes, int seq_q, int seq_k, int d, float scale);

// How many thread blocks launch_fa2_forward starts for seq_q rows (lesson 04's FA1 starts 1 per head): you
// write it (TODO 3).
int fa2_blocks(int seq_q);

}  // namespace flashlab::lesson05
