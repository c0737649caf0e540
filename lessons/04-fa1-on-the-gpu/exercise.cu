// Lesson 04, your exercise: FlashAttention-1 forward (paper Algorithm 1) for one head on the GPU.
// Fill in the two TODO blocks (read README.md first), then build with -DFLASHLAB_LESSON_SOLUTIONS=OFF
// and run: ctest --test-dir build -R lesson04 --output-on-failure
#include <cmath>

// Until the TODOs are written, some variables are computed and not yet used: let the unfinished
// exercise compile under the project's warnings-as-errors. (Harmless; keep or delete.)
#pragma nv_diag_suppress 177  // declared but never referenced
#pragma nv_diag_suppress 550  // set but never used

#include "lesson.hpp"
#include "cuda/common.cuh"

namespace flashlab::lesson04 {
namespace {

__global__ void fa1_forward_kernel(const float* Q, const float* K, const float* V, float* O, float* m, float* l,
                                   int seq_q, int seq_k, int d, float scale) {
  __shared__ float Kj[kBc][kMaxHeadDim];  // the K/V tile lives in SRAM for a whole inner loop
  __shared__ float Vj[kBc][kMaxHeadDim];
  const int r = threadIdx.x;  // this thread's row within each Q block
  const int Tr = (seq_q + kBr - 1) / kBr, Tc = (seq_k + kBc - 1) / kBc;

  // Line 2: O = 0, l = 0, m = -inf in HBM.
  for (int row = r; row < seq_q; row += kBr) {
    for (int k = 0; k < d; ++k) O[row * d + k] = 0.0f;
    l[row] = 0.0f;
    m[row] = -INFINITY;
  }

  for (int j = 0; j < Tc; ++j) {  // line 5: K/V blocks, outer
    __syncthreads();              // everyone is done with the previous K_j, V_j
    // Line 6: load K_j, V_j from HBM to SRAM. Keys past seq_k are zero (and never used).
    // ---- TODO 1 (about 5 lines): the threads together copy the (kBc, d) tiles K_j and V_j.
    // Thread r copies elements r, r + kBr, r + 2 kBr, ... of the kBc * d tile: element idx is
    // key c = idx / d (global key j * kBc + c), dimension k = idx % d.

    // ---- end TODO 1
    __syncthreads();
    const int cols = min(kBc, seq_k - j * kBc);

    for (int i = 0; i < Tr; ++i) {  // line 7: Q blocks, inner
      const int row = i * kBr + r;
      if (row >= seq_q) continue;
      // Line 8: load Q_i, O_i, l_i, m_i from HBM. O_i is read again for every j: that is FA1's cost.
      float q[kMaxHeadDim], o[kMaxHeadDim], pv[kMaxHeadDim];
      for (int k = 0; k < d; ++k) {
        q[k] = Q[row * d + k];
        o[k] = O[row * d + k];
        pv[k] = 0.0f;
      }
      const float m_old = m[row], l_old = l[row];
      // Lines 9-11: s = scale q K_j^T, m~ = max s, p~ = exp(s - m~), l~ = sum p~, and p~ V_j.
      float s[kBc], m_tilde = -INFINITY;
      for (int c = 0; c < cols; ++c) {
        float dot = 0.0f;
        for (int k = 0; k < d; ++k) dot += q[k] * Kj[c][k];
        s[c] = scale * dot;
        m_tilde = fmaxf(m_tilde, s[c]);
      }
      float l_tilde = 0.0f;
      for (int c = 0; c < cols; ++c) {
        const float p = expf(s[c] - m_tilde);
        l_tilde += p;
        for (int k = 0; k < d; ++k) pv[k] += p * Vj[c][k];
      }
      // Lines 12-15: the online-softmax update, then write O_i, l_i, m_i back to HBM.
      // ---- TODO 2 (about 6 lines):
      //   m_new = max(m_old, m~);   l_new = e^(m_old - m_new) l_old + e^(m~ - m_new) l~
      //   O_i   = (l_old e^(m_old - m_new) O_i + e^(m~ - m_new) p~V_j) / l_new
      // Then store m_new and l_new into m[row] and l[row]; o[] is written to HBM just below.

      // ---- end TODO 2
      for (int k = 0; k < d; ++k) O[row * d + k] = o[k];
    }
  }
}

}  // namespace

void launch_fa1_forward(const float* Q, const float* K, const float* V, float* O, float* m, float* l, int seq_q,
                        int seq_k, int d, float scale) {
  fa1_forward_kernel<<<1, kBr>>>(Q, K, V, O, m, l, seq_q, seq_k, d, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace flashlab::lesson04
