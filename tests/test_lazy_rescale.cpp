// core/lazy_rescale.hpp: the count of rescales an online softmax makes, lazy (a lag before m moves) and exact, on
// scores whose answer is known by construction.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/lazy_rescale.hpp"

using flashlab::count_rescales;

namespace {
// One row whose scores rise by `per_block` from one block of `bc` keys to the next (constant inside a block).
std::vector<float> rising_row(int blocks, int bc, float per_block) {
  std::vector<float> s;
  for (int j = 0; j < blocks; ++j)
    for (int k = 0; k < bc; ++k) s.push_back(per_block * float(j));
  return s;
}
}  // namespace

TEST_CASE("a max that rises every block: exact rescales every block, lazy only once the rise passes the lag") {
  const std::vector<float> s = rising_row(/*blocks=*/13, /*bc=*/4, /*per_block=*/3.0f);
  const auto exact = count_rescales(s, 1, 52, 4, 0.0f, 16);
  CHECK(exact.row_blocks == 12);
  CHECK(exact.row_rescales == 12);
  // Lag 8 with a rise of 3 a block: m moves at blocks 3 (9 > 0 + 8), 6, 9, 12.
  const auto lazy = count_rescales(s, 1, 52, 4, 8.0f, 16);
  CHECK(lazy.row_rescales == 4);
  CHECK(lazy.warp_rescales == 4);
  CHECK(lazy.row_fraction() == doctest::Approx(4.0 / 12.0));
}

TEST_CASE("a falling max never rescales; the first block never counts; a masked first block does not either") {
  const std::vector<float> s = rising_row(6, 8, -1.0f);
  CHECK(count_rescales(s, 1, 48, 8, 0.0f, 16).row_rescales == 0);
  // Block 0 all masked (-inf), then finite: m moves from -inf at block 1, which is no rescale (O is still 0).
  std::vector<float> masked(8, -INFINITY);
  for (int k = 0; k < 8; ++k) masked.push_back(0.5f);
  const auto c = count_rescales(masked, 1, 16, 8, 0.0f, 16);
  CHECK(c.row_blocks == 1);
  CHECK(c.row_rescales == 0);
}

TEST_CASE("a warp rescales when any of its rows does: rows in warps of 2, one row rising") {
  std::vector<float> s;
  const std::vector<float> up = rising_row(5, 2, 1.0f), flat(10, 0.0f);
  for (const auto* r : {&up, &flat, &flat, &flat}) s.insert(s.end(), r->begin(), r->end());
  const auto c = count_rescales(s, 4, 10, 2, 0.0f, 2);
  CHECK(c.row_blocks == 16);
  CHECK(c.row_rescales == 4);   // row 0 at blocks 1-4
  CHECK(c.warp_blocks == 8);    // 2 warps x 4 blocks
  CHECK(c.warp_rescales == 4);  // warp 0 each time, warp 1 never
  CHECK(c.warp_fraction() == doctest::Approx(0.5));
  // A short last block (keys not a multiple of Bc) is a block like the others.
  CHECK(count_rescales(std::vector<float>{0, 1, 2, 3, 4}, 1, 5, 2, 0.0f, 1).row_rescales == 2);
}

TEST_CASE("under a causal mask, blocks a row or a warp sees no key of do not count") {
  // Two rows, blocks of 2 keys, 6 keys: row 0 sees keys 0-1 (block 0 only), row 1 keys 0-3 (blocks 0 and 1).
  const float n = -INFINITY;
  const std::vector<float> s = {0, 0, n, n, n, n,  //
                                0, 0, 1, 1, n, n};
  const auto per_row = count_rescales(s, 2, 6, 2, 0.0f, 1);
  CHECK(per_row.row_blocks == 1);  // row 1's block 1; block 2 is past both diagonals
  CHECK(per_row.row_rescales == 1);
  CHECK(per_row.warp_blocks == 1);
  const auto one_warp = count_rescales(s, 2, 6, 2, 0.0f, 2);
  CHECK(one_warp.warp_blocks == 1);  // block 1, seen by row 1; block 2 by neither
  CHECK(one_warp.warp_rescales == 1);
}

TEST_CASE("sizes that do not fit are refused") {
  CHECK_THROWS_AS(count_rescales(std::vector<float>(5), 2, 3, 1, 0.0f, 1), std::invalid_argument);
  CHECK_THROWS_AS(count_rescales(std::vector<float>(6), 2, 3, 0, 0.0f, 1), std::invalid_argument);
  CHECK_THROWS_AS(count_rescales(std::vector<float>(6), 2, 3, 1, -1.0f, 1), std::invalid_argument);
}
