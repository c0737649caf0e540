// Lesson 08's test. Part 1 runs your ring bookkeeping (advance, try_wait_parity, the two wait
// parities) in a simulated warp-specialized kernel: one producer issuing bulk copies, a copy engine
// landing them in pieces, and one or two consumer warpgroups, scheduled in many random orders. The
// simulator keeps its own record of what each stage holds, so it catches a producer refilling a
// stage still in use, a consumer reading a stage before its bytes land, blocks out of order, and a
// deadlock, and says which. Part 2 checks swizzled_offset against the 128-byte swizzle written on
// the address bits (as the hardware applies it), the bank groups, and make_descriptor field by field.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/lazy_rescale.hpp"
#include "lesson.hpp"

using namespace flashlab::lesson08;

namespace {

// ---- Part 1: a simulated producer / consumer kernel ---------------------------------------------

// One K_j (or V_j) tile: 128 rows x 64 bf16 columns, 16 KB.
constexpr std::int64_t kTileBytes = 128 * kRowBytes;

// Which cursor arithmetic and wait parities the kernel uses: yours, or a deliberately wrong one.
struct Schedule {
  RingCursor (*advance)(RingCursor, int);
  std::uint32_t (*full_parity)(RingCursor);   // the consumers' wait on full[stage]
  std::uint32_t (*empty_parity)(RingCursor);  // the producer's wait on empty[stage]
};

const Schedule kYours{.advance = advance, .full_parity = consumer_full_parity, .empty_parity = producer_empty_parity};

struct Outcome {
  std::vector<std::vector<int>> consumed;  // per consumer, the blocks in the order it read them
  std::string error;                       // empty when every block went through cleanly
  bool deadlock = false;
};

std::string describe(RingCursor c) {
  std::ostringstream s;
  s << "(stage " << c.stage << ", phase " << c.phase << ")";
  return s.str();
}

// Runs `blocks` tiles through a ring of `stages` stages, from one producer to `consumers` consumer
// warpgroups that each read every block (as FA3's two consumers both read every K_j and V_j). Each
// step performs one action of one actor that can act, chosen at random from `seed`.
Outcome simulate(int stages, int consumers, int blocks, const Schedule& schedule, unsigned seed) {
  struct Copy {
    int stage, block;
    std::int64_t bytes_left;
  };
  struct Consumer {
    RingCursor cursor;
    int holding = -1;  // the stage it is reading (between its wait on full and its arrive on empty)
  };
  std::vector<MBarrier> full(stages), empty(stages);
  for (auto& bar : full) init(bar, 1);           // the producer's arrive.expect_tx; the bytes do the rest
  for (auto& bar : empty) init(bar, consumers);  // one arrival per consumer warpgroup
  // The simulator's own record, independent of the barriers:
  std::vector<int> slot(stages, -1), readers_left(stages, 0);  // block held by each stage; reads owed
  std::vector<bool> landed(stages, false);                     // have that block's bytes arrived?
  std::vector<Copy> copies;                                    // bulk copies in flight
  std::vector<Consumer> consumer(consumers);
  RingCursor producer;
  int next_block = 0;
  Outcome out;
  out.consumed.assign(consumers, {});
  std::mt19937 rng(seed);

  auto valid = [&](RingCursor c, const char* who) {
    if (c.stage >= 0 && c.stage < stages && c.phase <= 1) return true;
    std::ostringstream s;
    s << who << "'s cursor became " << describe(c) << ": in a ring of " << stages << " stages the stage is 0.."
      << stages - 1 << " and the phase 0 or 1 (check advance)";
    out.error = s.str();
    return false;
  };
  auto producer_can_go = [&] {
    return next_block < blocks && try_wait_parity(empty[producer.stage], schedule.empty_parity(producer));
  };
  auto consumer_can_go = [&](const Consumer& c, int k) {
    if (c.holding >= 0) return true;  // done reading: it can always release the stage
    return int(out.consumed[k].size()) < blocks &&
           try_wait_parity(full[c.cursor.stage], schedule.full_parity(c.cursor));
  };

  const int max_steps = blocks * (3 + 2 * consumers) + 16;  // every action moves something forward
  for (int step = 0; step <= max_steps; ++step) {
    // actor: 0 = producer, 1 = copy engine, 2 + k = consumer k
    std::vector<int> ready;
    if (producer_can_go()) ready.push_back(0);
    if (!copies.empty()) ready.push_back(1);
    for (int k = 0; k < consumers; ++k)
      if (consumer_can_go(consumer[k], k)) ready.push_back(2 + k);
    if (ready.empty()) {
      bool finished = next_block == blocks;
      for (int k = 0; k < consumers; ++k) finished = finished && int(out.consumed[k].size()) == blocks;
      if (finished) return out;
      std::ostringstream s;
      s << "deadlock: nobody can move. The producer (next block " << next_block << ", cursor " << describe(producer)
        << ") waits on empty[" << producer.stage << "] for parity " << schedule.empty_parity(producer)
        << ", the barrier is in a phase of parity " << empty[producer.stage].phase << ".";
      for (int k = 0; k < consumers; ++k)
        s << " Consumer " << k << " (read " << out.consumed[k].size() << " blocks, cursor "
          << describe(consumer[k].cursor) << ") waits on full[" << consumer[k].cursor.stage << "] for parity "
          << schedule.full_parity(consumer[k].cursor) << ", the barrier is in a phase of parity "
          << full[consumer[k].cursor.stage].phase << ".";
      out.error = s.str();
      out.deadlock = true;
      return out;
    }

    const int actor = ready[std::uniform_int_distribution<int>(0, int(ready.size()) - 1)(rng)];
    if (actor == 0) {  // the producer passed its wait on empty[s]: refill stage s with the next block
      const int s = producer.stage;
      if (readers_left[s] > 0) {
        std::ostringstream e;
        e << "the producer refilled stage " << s << " with block " << next_block << " while " << readers_left[s]
          << " consumer(s) had not finished block " << slot[s] << " there (its wait on empty[" << s << "] for parity "
          << schedule.empty_parity(producer) << " passed too early)";
        out.error = e.str();
        return out;
      }
      arrive_expect_tx(full[s], kTileBytes);
      copies.push_back({.stage = s, .block = next_block, .bytes_left = kTileBytes});
      slot[s] = next_block++;
      landed[s] = false;
      readers_left[s] = consumers;
      producer = schedule.advance(producer, stages);
      if (!valid(producer, "the producer")) return out;
    } else if (actor == 1) {  // the copy engine lands half a tile of one of the copies in flight
      const int i = std::uniform_int_distribution<int>(0, int(copies.size()) - 1)(rng);
      const Copy c = copies[i];
      const std::int64_t bytes = kTileBytes / 2;
      if (c.bytes_left == bytes) {
        landed[c.stage] = slot[c.stage] == c.block;
        copies.erase(copies.begin() + i);
      } else {
        copies[i].bytes_left -= bytes;
      }
      complete_tx(full[c.stage], bytes);
    } else {
      const int k = actor - 2;
      Consumer& c = consumer[k];
      if (c.holding >= 0) {  // finished with the stage: release it to the producer
        arrive(empty[c.holding]);
        --readers_left[c.holding];
        c.holding = -1;
        c.cursor = schedule.advance(c.cursor, stages);
        if (!valid(c.cursor, "a consumer")) return out;
      } else {  // passed its wait on full[s]: read the stage
        const int s = c.cursor.stage, want = int(out.consumed[k].size());
        if (slot[s] != want || !landed[s]) {
          std::ostringstream e;
          e << "consumer " << k << " passed its wait on full[" << s << "] for parity " << schedule.full_parity(c.cursor)
            << " at cursor " << describe(c.cursor) << " and read stage " << s << " expecting block " << want
            << ", but ";
          if (slot[s] < 0)
            e << "nothing was ever loaded there";
          else if (slot[s] != want)
            e << "the stage holds block " << slot[s];
          else
            e << "block " << want << "'s bytes had not landed yet";
          out.error = e.str();
          return out;
        }
        out.consumed[k].push_back(slot[s]);
        c.holding = s;
      }
    }
  }
  out.error = "the run did not finish in the steps it needs";
  return out;
}

// ---- Part 2: the reference layout and descriptor ------------------------------------------------

// The 128-byte swizzle as the hardware applies it, on address bits: bits 4-6 (the 16-byte chunk in
// a 128-byte row) are XORed with bits 7-9 (the row within an 8-row, 1024-byte block).
std::size_t ref_offset(int row, int col) {
  const std::size_t plain = std::size_t(row) * kRowBytes + std::size_t(col) * 2;
  return plain ^ (((plain >> 7) & 7u) << 4);
}

std::string hex(std::uint64_t x) {
  std::ostringstream s;
  s << "0x" << std::hex << x;
  return s.str();
}

std::uint64_t bits(std::uint64_t x, int lo, int hi) { return (x >> lo) & ((std::uint64_t(1) << (hi - lo + 1)) - 1); }

const char* name(Swizzle s) {
  switch (s) {
    case Swizzle::None:
      return "no swizzle";
    case Swizzle::B128:
      return "128-byte swizzle";
    case Swizzle::B64:
      return "64-byte swizzle";
    case Swizzle::B32:
      return "32-byte swizzle";
  }
  return "?";
}

}  // namespace

TEST_CASE("lesson 08: advance walks the ring and flips the phase each time it wraps") {
  for (int stages : {1, 2, 3, 4}) {
    RingCursor c;
    for (int used = 1; used <= 4 * stages + 1; ++used) {
      c = advance(c, stages);
      const RingCursor want{.stage = used % stages, .phase = std::uint32_t((used / stages) % 2)};
      INFO("ring of stages = " << stages << ", after " << used << " uses (wrapped " << used / stages
                               << " time(s)): want " << describe(want) << ", advance gave " << describe(c));
      CHECK(c == want);
      if (c != want) break;
    }
  }
}

TEST_CASE("lesson 08: try_wait_parity passes once the phase of that parity has completed") {
  MBarrier bar;
  init(bar, 1);
  CHECK_FALSE_MESSAGE(try_wait_parity(bar, 0), "a fresh barrier is in phase 0: a wait for parity 0 must block");
  CHECK_MESSAGE(try_wait_parity(bar, 1),
                "a fresh barrier: parity 1 stands for the phase before phase 0, which counts as completed");
  arrive_expect_tx(bar, 4096);
  CHECK_FALSE_MESSAGE(try_wait_parity(bar, 0),
                      "the one arrival came, but 4096 announced bytes have not landed: phase 0 is not complete");
  complete_tx(bar, 4096);
  CHECK_MESSAGE(try_wait_parity(bar, 0), "the bytes landed: phase 0 completed, so a wait for parity 0 passes");
  CHECK_FALSE_MESSAGE(try_wait_parity(bar, 1), "phase 1 is now in progress: a wait for parity 1 must block");
}

TEST_CASE("lesson 08: the consumer waits on its own pass's phase, the producer one phase behind") {
  for (int stage : {0, 1, 2})
    for (std::uint32_t phase : {0u, 1u}) {
      const RingCursor c{.stage = stage, .phase = phase};
      CHECK_MESSAGE(consumer_full_parity(c) == phase,
                    "at cursor " << describe(c) << " a consumer waits on full[" << stage << "] for parity " << phase
                                 << " (the phase that loads this pass's block); you said " << consumer_full_parity(c));
      CHECK_MESSAGE(
          producer_empty_parity(c) == (phase ^ 1u),
          "at cursor " << describe(c) << " the producer waits on empty[" << stage << "] for parity " << (phase ^ 1u)
                       << ", one phase behind the consumer (on its first pass nothing has been released, and a "
                          "fresh barrier lets parity 1 through); you said "
                       << producer_empty_parity(c));
    }
}

TEST_CASE("lesson 08: the pipeline delivers every block once, in order, and never overwrites a stage in use") {
  constexpr int kBlocks = 40, kSeeds = 200;
  for (int stages : {2, 3})
    for (int consumers : {1, 2}) {
      CAPTURE(stages);
      CAPTURE(consumers);
      for (unsigned seed = 0; seed < kSeeds; ++seed) {
        const Outcome out = simulate(stages, consumers, kBlocks, kYours, seed);
        CHECK_MESSAGE(out.error.empty(), "random schedule " << seed << ": " << out.error);
        bool in_order = true;
        for (const auto& got : out.consumed) {
          if (out.error.empty() && int(got.size()) != kBlocks) in_order = false;
          for (int b = 0; b < int(got.size()); ++b) in_order = in_order && got[b] == b;
        }
        CHECK_MESSAGE(in_order, "random schedule " << seed << ": each consumer must read blocks 0.." << kBlocks - 1
                                                   << " exactly once, in order");
        if (!out.error.empty() || !in_order) break;  // one failing schedule says enough
      }
    }
}

TEST_CASE("lesson 08: the simulator catches a wrong schedule (with your advance and try_wait_parity)") {
  SUBCASE("the producer waits on empty with the consumer's parity: deadlock before the first block") {
    const Schedule wrong{.advance = advance, .full_parity = consumer_full_parity, .empty_parity = consumer_full_parity};
    const Outcome out = simulate(2, 1, 8, wrong, 1);
    INFO(
        "on fresh barriers the producer waits for empty's phase 0, which only a consumer's release can complete, "
        "and the consumer waits for a block never loaded. Expected a deadlock, got: "
        << (out.error.empty() ? "a clean run (does try_wait_parity block on the phase in progress?)" : out.error));
    CHECK(out.deadlock);
  }
  SUBCASE("the consumer waits on full with the wrong parity: it reads a stage before its bytes land") {
    const Schedule wrong{.advance = advance,
                         .full_parity = [](RingCursor c) { return c.phase ^ 1u; },
                         .empty_parity = producer_empty_parity};
    for (unsigned seed = 0; seed < 20; ++seed) {
      const Outcome out = simulate(3, 1, 12, wrong, seed);
      INFO("random schedule " << seed
                              << ": a consumer waiting for parity phase ^ 1 on full passes at once (or waits "
                                 "for a phase that never comes), so the run must fail, but it ran cleanly");
      CHECK_FALSE(out.error.empty());
    }
  }
  SUBCASE("a cursor that never flips its phase: the second pass reads stale data") {
    const Schedule wrong{
        .advance = [](RingCursor c, int s) { return RingCursor{.stage = (c.stage + 1) % s, .phase = c.phase}; },
        .full_parity = consumer_full_parity,
        .empty_parity = producer_empty_parity};
    for (unsigned seed = 0; seed < 20; ++seed) {
      const Outcome out = simulate(2, 2, 12, wrong, seed);
      INFO("random schedule "
           << seed
           << ": on the second pass the consumer waits for parity 0 again while full is in "
              "phase 1, so its wait passes before block 2 is even loaded; the run must fail, but it ran cleanly");
      CHECK_FALSE(out.error.empty());
    }
  }
}

TEST_CASE("lesson 08: swizzled_offset is the 128-byte swizzle of a (rows x 64) bf16 tile") {
  constexpr int kRows = 64;
  int wrong = 0;
  std::string first;
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < kTileCols; ++col) {
      const std::size_t got = swizzled_offset(row, col), want = ref_offset(row, col);
      if (got == want) continue;
      if (wrong++ == 0) {
        std::ostringstream s;
        const int chunk = col * 2 / kChunkBytes;
        s << "row " << row << ", col " << col << ": byte " << col * 2 << " of the row is in chunk " << chunk
          << ", which the swizzle stores in chunk " << chunk << " ^ (" << row << " % 8) = " << (chunk ^ (row % 8))
          << ", at byte offset " << want << " of the tile; you said " << got;
        first = s.str();
      }
    }
  INFO(wrong << " of " << kRows * kTileCols << " elements are misplaced; the first: " << first);
  CHECK(wrong == 0);
}

TEST_CASE("lesson 08: the swizzle is a permutation that puts 8 rows of one chunk in 8 bank groups") {
  constexpr int kRows = 64;
  // Every element in the tile's bytes, once: nothing lost, nothing overlapping.
  std::set<std::size_t> used;
  bool inside = true;
  for (int row = 0; row < kRows; ++row)
    for (int col = 0; col < kTileCols; ++col) {
      const std::size_t off = swizzled_offset(row, col);
      inside = inside && off % 2 == 0 && off < std::size_t(kRows) * kRowBytes;
      used.insert(off);
    }
  CHECK_MESSAGE((inside && int(used.size()) == kRows * kTileCols),
                "the " << kRows << " x 64 tile's elements must land on " << kRows * kTileCols
                       << " distinct even offsets below " << kRows * kRowBytes << "; yours use " << used.size()
                       << " distinct offsets" << std::string(inside ? "" : ", some outside the tile or odd"));

  // A bank group is 4 banks = 16 bytes; a 128-byte row covers all 8 groups once.
  auto group = [](std::size_t off) { return int(off / kChunkBytes % 8); };
  for (int first_row = 0; first_row < kRows; first_row += 8)
    for (int chunk = 0; chunk < 8; ++chunk) {
      std::set<int> groups;
      std::ostringstream list;
      for (int r = first_row; r < first_row + 8; ++r) {
        groups.insert(group(swizzled_offset(r, chunk * 8)));
        list << ' ' << group(swizzled_offset(r, chunk * 8));
      }
      INFO("chunk " << chunk << " (columns " << chunk * 8 << ".." << chunk * 8 + 7 << ") of rows " << first_row << ".."
                    << first_row + 7
                    << " is one 8 x 16-byte core matrix that wgmma reads at once; its rows land in "
                       "bank groups"
                    << list.str() << ": " << 9 - int(groups.size())
                    << "-way conflict at worst, want 8 different groups");
      CHECK(groups.size() == 8);
      if (groups.size() != 8) return;
    }
  for (int row = 0; row < kRows; ++row) {
    std::set<int> groups;
    for (int chunk = 0; chunk < 8; ++chunk) groups.insert(group(swizzled_offset(row, chunk * 8)));
    INFO("row " << row
                << " is one 128-byte line that TMA writes at once: its 8 chunks must land in 8 different bank "
                   "groups, yours use "
                << groups.size());
    CHECK(groups.size() == 8);
    if (groups.size() != 8) return;
  }
}

TEST_CASE("lesson 08: make_descriptor puts each field in its bits") {
  struct Case {
    std::uint32_t address, lbo, sbo;
    Swizzle swizzle;
  };
  std::vector<Case> cases = {
      // A K tile at 0x1000 under the 128-byte swizzle: LBO unused (16 by convention), SBO = 8 rows x 128 B.
      {.address = 0x1000, .lbo = 16, .sbo = 1024, .swizzle = Swizzle::B128},
      {.address = 0x3fff0, .lbo = 0x3fff0, .sbo = 0x3fff0, .swizzle = Swizzle::B32},
      {.address = 0x400, .lbo = 128, .sbo = 256, .swizzle = Swizzle::None},
  };
  std::mt19937 rng(6);
  std::uniform_int_distribution<std::uint32_t> sixteens(0, (1u << 14) - 1);
  for (int i = 0; i < 100; ++i)
    cases.push_back({.address = 16 * sixteens(rng),
                     .lbo = 16 * sixteens(rng),
                     .sbo = 16 * sixteens(rng),
                     .swizzle = Swizzle(sixteens(rng) % 4)});

  CHECK_MESSAGE(make_descriptor(0x1000, 16, 1024, Swizzle::B128) == 0x4000004000010100ull,
                "the K tile's descriptor (address 0x1000, lbo 16, sbo 1024, 128-byte swizzle) is 0x4000004000010100");
  for (const Case& c : cases) {
    const std::uint64_t d = make_descriptor(c.address, c.lbo, c.sbo, c.swizzle);
    std::ostringstream what;
    what << "make_descriptor(address " << hex(c.address) << ", lbo " << hex(c.lbo) << ", sbo " << hex(c.sbo) << ", "
         << name(c.swizzle) << ") = " << hex(d) << ": ";
    const std::uint64_t field_mask =
        bits(~0ull, 0, 13) | (bits(~0ull, 0, 13) << 16) | (bits(~0ull, 0, 13) << 32) | (std::uint64_t(3) << 62);
    const std::uint64_t stray = d & ~field_mask;
    const bool start_ok = bits(d, 0, 13) == c.address / 16, lbo_ok = bits(d, 16, 29) == c.lbo / 16,
               sbo_ok = bits(d, 32, 45) == c.sbo / 16, mode_ok = bits(d, 62, 63) == std::uint64_t(c.swizzle);
    CHECK_MESSAGE(start_ok, what.str() << "bits 0-13 (start address >> 4) hold " << bits(d, 0, 13) << ", want "
                                       << c.address / 16);
    CHECK_MESSAGE(lbo_ok, what.str() << "bits 16-29 (leading byte offset >> 4) hold " << bits(d, 16, 29) << ", want "
                                     << c.lbo / 16);
    CHECK_MESSAGE(sbo_ok, what.str() << "bits 32-45 (stride byte offset >> 4) hold " << bits(d, 32, 45) << ", want "
                                     << c.sbo / 16);
    CHECK_MESSAGE(mode_ok, what.str() << "bits 62-63 (swizzle mode) hold " << bits(d, 62, 63) << ", want "
                                      << unsigned(c.swizzle));
    CHECK_MESSAGE(stray == 0, what.str() << "bits outside the four fields must be 0 (base offset 0, reserved bits), "
                                            "yours set "
                                         << hex(stray));
    if (!(start_ok && lbo_ok && sbo_ok && mode_ok && stray == 0)) break;  // the first wrong case says enough
  }
}

TEST_CASE("lesson 08: stepping k inside a swizzled tile moves the descriptor by 32 bytes") {
  // A 64-column bf16 tile holds four k16 slices of 32 bytes per row. wgmma applies the swizzle to the
  // address bits itself, so slice kk is the same descriptor with the start address 32 * kk further.
  const std::uint64_t first = make_descriptor(0x2000, 16, 1024, Swizzle::B128);
  for (std::uint32_t kk = 1; kk < 4; ++kk) {
    const std::uint64_t d = make_descriptor(0x2000 + 32 * kk, 16, 1024, Swizzle::B128);
    INFO("k slice " << kk << ": descriptor " << hex(d) << ", want the first one (" << hex(first) << ") + " << 2 * kk
                    << " (32 bytes in 16-byte units)");
    CHECK(d == first + 2 * kk);
  }
}

// ---- Part 3: FlashAttention-4's two softmax ideas ---------------------------------------------------

namespace {
// x rounded to bf16 (nearest, ties to even) and back: what a kernel stores P as.
float to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, sizeof r);
  return r;
}
}  // namespace

TEST_CASE("Part 3: exp2_by_polynomial within its bound of 2^x over every input the softmax sees") {
  // The softmax exponentiates scale * s - m <= 0 (and up to 2^8 above it under the lazy rescale): [-125, 9] covers it.
  int checked = 0;
  for (double xd = -125.0; xd <= 9.0; xd += 1.0 / 1024) {
    const float x = static_cast<float>(xd);
    const double exact = std::exp2(double(x)), got = exp2_by_polynomial(x);
    const double rel = std::fabs(got / exact - 1.0);
    if (!(rel <= kPolyMaxRelError)) {
      FAIL_CHECK("exp2_by_polynomial(" << x << ") = " << got << " but 2^x = " << exact << ": relative error " << rel
                                       << " is above " << kPolyMaxRelError
                                       << ". Check the range reduction (j the nearest integer, f = x - j in [-1/2, "
                                          "1/2]), the Horner order (c3 innermost) and the scaling by 2^j");
      return;
    }
    ++checked;
  }
  CHECK(checked > 130000);
  // Integers are exact: f = 0, p(0) = 1, and 2^j is a power of two.
  for (int j = -125; j <= 9; ++j) CHECK_MESSAGE(exp2_by_polynomial(float(j)) == std::ldexp(1.0f, j), "at x = " << j);
}

TEST_CASE("Part 3: exp2_by_polynomial is 0 for a masked score and below its range") {
  CHECK_MESSAGE(exp2_by_polynomial(-INFINITY) == 0.0f, "a masked score (-inf) must give P = 0");
  CHECK_MESSAGE(exp2_by_polynomial(-126.0f) == 0.0f, "below kPolyMinInput the result is 0");
  CHECK_MESSAGE(exp2_by_polynomial(-1000.0f) == 0.0f, "below kPolyMinInput the result is 0");
  CHECK(exp2_by_polynomial(kPolyMinInput) > 0.0f);
}

TEST_CASE("Part 3: rounding P to bf16 hides the polynomial's error") {
  // bf16 keeps 8 significant bits: a relative error of 1.1e-4 is 1/36 of its unit roundoff 2^-8. The rounded P can
  // differ from the rounded 2^x only where 2^x sits within that error of a rounding boundary, and then by one step.
  int differing = 0, total = 0;
  for (double xd = -20.0; xd <= 9.0; xd += 1.0 / 4096) {
    const float x = static_cast<float>(xd);
    const float a = to_bf16(exp2_by_polynomial(x)), b = to_bf16(static_cast<float>(std::exp2(double(x))));
    ++total;
    if (a != b) {
      ++differing;
      const float step = std::ldexp(1.0f, std::ilogb(b) - 7);  // one bf16 step at b
      REQUIRE_MESSAGE(std::fabs(a - b) <= step, "at x = " << x << " the rounded P is " << a << ", the rounded 2^x "
                                                          << b << ": more than one bf16 step apart");
    }
  }
  // Expected share: about twice the error over the step, 2 x 1.1e-4 / 2^-8 = 5.6%; at most that.
  CHECK_MESSAGE(differing <= total * 2 * kPolyMaxRelError * 256, differing << " of " << total << " rounded values differ");
}

TEST_CASE("Part 3: count_rescales, lazy and exact") {
  // Block maxima rising by 3 (log2 units) a block, 13 blocks.
  std::vector<float> rising;
  for (int j = 0; j < 13; ++j) rising.push_back(3.0f * float(j));
  CHECK_MESSAGE(count_rescales(rising.data(), 13, 0.0f) == 12,
                "the exact online softmax (lag 0) rescales at every block whose max rises: 12 of the 13 (not the first)");
  CHECK_MESSAGE(count_rescales(rising.data(), 13, 8.0f) == 4,
                "with lag 8 the max moves only past m + 8: at blocks 3, 6, 9 and 12 (9 > 0 + 8, 18 > 9 + 8, ...)");
  std::vector<float> falling = {5, 4, 3, 2, 1};
  CHECK_MESSAGE(count_rescales(falling.data(), 5, 0.0f) == 0, "a falling max never rescales");
  std::vector<float> masked_first = {-INFINITY, 1.0f, 2.0f};
  CHECK_MESSAGE(count_rescales(masked_first.data(), 3, 0.0f) == 1,
                "a first block with no visible key leaves m at -inf; the move from -inf (block 1) is no rescale, "
                "block 2's is");
  // Random rows against the project's count (core/lazy_rescale.hpp, which the lazy-rescale study runs): one key a
  // block, so the block maxima are the scores themselves; some blocks masked.
  std::mt19937 rng(8);
  std::normal_distribution<float> score(0.0f, 4.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> row(1 + trial % 40);
    for (std::size_t j = 0; j < row.size(); ++j) row[j] = j % 7 == 3 ? -INFINITY : score(rng) + 0.5f * float(j);
    for (const float lag : {0.0f, 2.0f, 8.0f}) {
      const int want = int(flashlab::count_rescales(row, 1, int(row.size()), 1, lag, 1).row_rescales);
      REQUIRE_MESSAGE(count_rescales(row.data(), int(row.size()), lag) == want,
                      "on a random row of " << row.size() << " blocks with lag " << lag << " the project counts " << want
                                            << " rescales");
    }
  }
}
