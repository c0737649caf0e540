// The pseudocode listings, in the papers' notation. Each listing's lines are numbered by the enum of
// the same name in pseudocode.hpp; the static_asserts keep the two the same length.
#include "model/pseudocode.hpp"

#include <iterator>

namespace flashlab {

namespace {

template <std::size_t N>
std::vector<std::string> to_vector(const char* const (&text)[N]) {
  return std::vector<std::string>(std::begin(text), std::end(text));
}

namespace standard_fwd {  // FlashAttention paper, Algorithm 0
using namespace lines::standard_fwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM.",
    "Load Q, K by blocks from HBM, compute S = tau Q K^T, write S to HBM.",
    "Read S from HBM, compute P = softmax(S), write P to HBM.",
    "Load P and V by blocks from HBM, compute O = P V, write O to HBM.",
    "Return O.",
};
static_assert(std::size(kText) == kReturn, "the standard_fwd listing and its Line enum differ in length");
}  // namespace standard_fwd

namespace standard_bwd {  // FlashAttention paper, Algorithm 3
using namespace lines::standard_bwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V, dO in R^{N x d}, P in R^{N x N} in HBM.",
    "Load P, dO by blocks from HBM, compute dV = P^T dO, write dV to HBM.",
    "Load dO, V by blocks from HBM, compute dP = dO V^T, write dP to HBM.",
    "Read P, dP from HBM, compute dS where dS_ij = P_ij (dP_ij - sum_l P_il dP_il), write dS to HBM.",
    "Load dS and K by blocks from HBM, compute dQ = tau dS K, write dQ to HBM.",
    "Load dS and Q by blocks from HBM, compute dK = tau dS^T Q, write dK to HBM.",
    "Return dQ, dK, dV.",
};
static_assert(std::size(kText) == kReturn, "the standard_bwd listing and its Line enum differ in length");
}  // namespace standard_bwd

namespace fa1_fwd {  // FlashAttention paper, Algorithm 1 (dropout as in Algorithm 2)
using namespace lines::fa1_fwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM, on-chip SRAM of size M.",
    "Set block sizes Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).",
    "Initialize O = (0)_{N x d}, l = (0)_N, m = (-inf)_N in HBM.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_1..Q_Tr of size Br x d, and K, V into Tc = ceil(N / Bc) "
    "blocks K_1..K_Tc, V_1..V_Tc of size Bc x d.",
    "Divide O into Tr blocks O_i of size Br x d, l into Tr blocks l_i and m into Tr blocks m_i of size Br.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij).",
    "    On chip, compute m_i^new = max(m_i, m~_ij), l_i^new = e^{m_i - m_i^new} l_i + e^{m~_ij - m_i^new} l~_ij.",
    "    On chip, apply dropout: P~_ij <- P~_ij o Z_ij / (1 - p).",
    "    Write O_i <- diag(l_i^new)^-1 (diag(l_i) e^{m_i - m_i^new} O_i + e^{m~_ij - m_i^new} P~_ij V_j) to HBM.",
    "    Write l_i <- l_i^new, m_i <- m_i^new to HBM.",
    "  end for",
    "end for",
    "Return O, l, m.",
};
static_assert(std::size(kText) == kReturn, "the fa1_fwd listing and its Line enum differ in length");
}  // namespace fa1_fwd

namespace fa1_bwd {  // FlashAttention paper, Algorithm 4
using namespace lines::fa1_bwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V, O, dO in R^{N x d} and vectors l, m in R^N in HBM, on-chip SRAM of size M.",
    "Set block sizes Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).",
    "Divide Q, O, dO into Tr blocks of size Br x d, K, V into Tc blocks of size Bc x d, l, m into Tr blocks.",
    "Initialize dQ = (0)_{N x d}, dK = (0)_{N x d}, dV = (0)_{N x d} in HBM.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  Initialize dK~_j = (0)_{Bc x d}, dV~_j = (0)_{Bc x d} on SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, O_i, dO_i, dQ_i, l_i, m_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute P_ij = diag(l_i)^-1 exp(S_ij - m_i) in R^{Br x Bc}.",
    "    On chip, compute the dropout mask Z_ij and P_ij^dropped = P_ij o Z_ij / (1 - p).",
    "    On chip, compute dV~_j <- dV~_j + (P_ij^dropped)^T dO_i in R^{Bc x d}.",
    "    On chip, compute dP_ij = (dO_i V_j^T) o Z_ij / (1 - p) in R^{Br x Bc}.",
    "    On chip, compute D_i = rowsum(dO_i o O_i) in R^{Br}.",
    "    On chip, compute dS_ij = P_ij o (dP_ij - D_i) in R^{Br x Bc}.",
    "    Write dQ_i <- dQ_i + tau dS_ij K_j in R^{Br x d} to HBM.",
    "    On chip, compute dK~_j <- dK~_j + tau dS_ij^T Q_i in R^{Bc x d}.",
    "  end for",
    "  Write dK_j <- dK~_j, dV_j <- dV~_j to HBM.",
    "end for",
    "Return dQ, dK, dV.",
};
static_assert(std::size(kText) == kReturn, "the fa1_bwd listing and its Line enum differ in length");
}  // namespace fa1_bwd

namespace fa2_fwd {  // FlashAttention-2 paper, Algorithm 1
using namespace lines::fa2_fwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V in R^{N x d} in HBM, block sizes Bc, Br.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_1..Q_Tr of size Br x d, and K, V into Tc = ceil(N / Bc) "
    "blocks K_1..K_Tc, V_1..V_Tc of size Bc x d.",
    "Divide the output O into Tr blocks O_i of size Br x d, and the logsumexp L into Tr blocks L_i of size Br.",
    "for 1 <= i <= Tr do",
    "  Load Q_i from HBM to on-chip SRAM.",
    "  On chip, initialize O_i^(0) = (0)_{Br x d}, l_i^(0) = (0)_Br, m_i^(0) = (-inf)_Br.",
    "  for 1 <= j <= Tc do (causal: skip tiles that are fully masked)",
    "    Load K_j, V_j from HBM to on-chip SRAM.",
    "    On chip, compute S_ij^(j) = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute m_i^(j) = max(m_i^(j-1), rowmax(S_ij)), P~_ij = exp(S_ij - m_i^(j)), "
    "l_i^(j) = e^{m_i^(j-1) - m_i^(j)} l_i^(j-1) + rowsum(P~_ij).",
    "    On chip, compute O_i^(j) = diag(e^{m_i^(j-1) - m_i^(j)}) O_i^(j-1) + (P~_ij o Z_ij / (1 - p)) V_j.",
    "  end for",
    "  On chip, compute O_i = diag(l_i^(Tc))^-1 O_i^(Tc).",
    "  On chip, compute L_i = m_i^(Tc) + log(l_i^(Tc)).",
    "  Write O_i to HBM as the i-th block of O.",
    "  Write L_i to HBM as the i-th block of L.",
    "end for",
    "Return the output O and the logsumexp L.",
};
static_assert(std::size(kText) == kReturn, "the fa2_fwd listing and its Line enum differ in length");
}  // namespace fa2_fwd

// FlashAttention-2 paper, Algorithm 2. Its inner-loop load line also lists O_i (never used once D_i
// is known) and dQ_i (loaded again by the dQ line); here each is loaded only where it is used.
namespace fa2_bwd {
using namespace lines::fa2_bwd;
constexpr const char* kText[] = {
    "Require: Matrices Q, K, V, O, dO in R^{N x d} in HBM, vector L in R^N in HBM, block sizes Bc, Br.",
    "Divide Q into Tr = ceil(N / Br) blocks Q_i of size Br x d, and K, V into Tc = ceil(N / Bc) blocks "
    "K_j, V_j of size Bc x d.",
    "Divide O, dO into Tr blocks O_i, dO_i of size Br x d, and L into Tr blocks L_i of size Br.",
    "Initialize dQ = (0)_{N x d} in HBM and divide it into Tr blocks dQ_i; divide dK, dV into Tc blocks.",
    "Compute D = rowsum(dO o O) in R^N (load O_i, dO_i; write D_i to HBM), divide it into Tr blocks D_i.",
    "for 1 <= j <= Tc do",
    "  Load K_j, V_j from HBM to on-chip SRAM.",
    "  Initialize dK_j = (0)_{Bc x d}, dV_j = (0)_{Bc x d} on SRAM.",
    "  for 1 <= i <= Tr do (causal: skip tiles that are fully masked)",
    "    Load Q_i, dO_i, L_i, D_i from HBM to on-chip SRAM.",
    "    On chip, compute S_ij = tau Q_i K_j^T in R^{Br x Bc} (causal: mask the partial tiles).",
    "    On chip, compute P_ij = exp(S_ij - L_i) in R^{Br x Bc}.",
    "    On chip, compute dV_j <- dV_j + (P_ij o Z_ij / (1 - p))^T dO_i in R^{Bc x d}.",
    "    On chip, compute dP_ij = (dO_i V_j^T) o Z_ij / (1 - p) in R^{Br x Bc}.",
    "    On chip, compute dS_ij = P_ij o (dP_ij - D_i) in R^{Br x Bc}.",
    "    Load dQ_i from HBM to SRAM, then on chip update dQ_i <- dQ_i + tau dS_ij K_j, and write it back to HBM.",
    "    On chip, compute dK_j <- dK_j + tau dS_ij^T Q_i in R^{Bc x d}.",
    "  end for",
    "  Write dK_j, dV_j to HBM.",
    "end for",
    "Return dQ, dK, dV.",
};
static_assert(std::size(kText) == kReturn, "the fa2_bwd listing and its Line enum differ in length");
}  // namespace fa2_bwd

}  // namespace

const std::vector<std::string>& pseudocode(Algorithm algorithm, Pass pass) {
  static const std::vector<std::string> standard[] = {to_vector(standard_fwd::kText), to_vector(standard_bwd::kText)};
  static const std::vector<std::string> fa1[] = {to_vector(fa1_fwd::kText), to_vector(fa1_bwd::kText)};
  static const std::vector<std::string> fa2[] = {to_vector(fa2_fwd::kText), to_vector(fa2_bwd::kText)};
  const int k = pass == Pass::Forward ? 0 : 1;
  switch (algorithm) {
    case Algorithm::Standard: return standard[k];
    case Algorithm::FA1: return fa1[k];
    case Algorithm::FA2: break;
  }
  return fa2[k];
}

}  // namespace flashlab
