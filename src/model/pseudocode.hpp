#pragma once
// The pseudocode of each algorithm and pass, in the papers' notation: what the app's loop-nest panel
// shows, and what TileEvent::line points into. The line-number enums below are how a loop nest names
// the line it is on; pseudocode.cpp holds the text and checks at compile time that each listing has
// as many lines as its enum.
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "model/traffic.hpp"

namespace flashlab {

// The algorithm's pseudocode, one string per line; TileEvent::line indexes it (1-based).
const std::vector<std::string>& pseudocode(Algorithm, Pass);

// 1-based line numbers of each listing; kReturn is the last line of every one.
namespace lines {

namespace standard_fwd {  // FlashAttention paper, Algorithm 0
enum Line : int { kRequire = 1, kScores, kSoftmax, kOutput, kReturn };
}

namespace standard_bwd {  // FlashAttention paper, Algorithm 3
enum Line : int { kRequire = 1, kDV, kDP, kDS, kDQ, kDK, kReturn };
}

namespace fa1_fwd {  // FlashAttention paper, Algorithm 1 (dropout as in Algorithm 2)
enum Line : int {
  kRequire = 1, kBlockSizes, kInitHbm, kDivideQKV, kDivideOStats, kForJ, kLoadKV, kForI, kLoadQOStats,
  kScores, kLocalSoftmax, kNewStats, kDropout, kWriteO, kWriteStats, kEndI, kEndJ, kReturn
};
}

namespace fa1_bwd {  // FlashAttention paper, Algorithm 4
enum Line : int {
  kRequire = 1, kBlockSizes, kDivide, kInitHbm, kForJ, kLoadKV, kInitDKV, kForI, kLoadRow, kScores,
  kProbabilities, kDropout, kDV, kDP, kD, kDS, kDQ, kDK, kEndI, kWriteDKV, kEndJ, kReturn
};
}

namespace fa2_fwd {  // FlashAttention-2 paper, Algorithm 1
enum Line : int {
  kRequire = 1, kDivideQKV, kDivideOL, kForI, kLoadQ, kInitOnChip, kForJ, kLoadKV, kScores, kOnlineSoftmax,
  kAccumulate, kEndJ, kNormalize, kLse, kWriteO, kWriteL, kEndI, kReturn
};
}

namespace fa2_bwd {  // FlashAttention-2 paper, Algorithm 2
enum Line : int {
  kRequire = 1, kDivideQKV, kDivideOL, kInitDQ, kComputeD, kForJ, kLoadKV, kInitDKV, kForI, kLoadRow,
  kScores, kProbabilities, kDV, kDP, kDS, kDQ, kDK, kEndI, kWriteDKV, kEndJ, kReturn
};
}

}  // namespace lines
}  // namespace flashlab
