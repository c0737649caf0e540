// How `flashlab ring`'s ranks meet under a cluster launcher (src/cli/rendezvous.hpp), on the CPU: the launcher's
// environment gives the right placement or one sentence; two and three processes (fork) exchange an id through
// 127.0.0.1 and all hold the same bytes; a rank with nobody to meet, or rank 0 with ranks missing, stops after its
// timeout with a sentence; and once met, a rank whose process ends before finishing ends the others.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "core/problem.hpp"
#include "cli/rendezvous.hpp"

using namespace flashlab;
using namespace flashlab::cli;
using namespace std::chrono_literals;

namespace {

// The message of the InputError `f` throws, "" when it throws none.
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A TCP port of 127.0.0.1 that nobody listens on now: the kernel's pick for a socket bound to port 0.
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(s);
  return ntohs(a.sin_port);
}

// Runs `body` in a child process, which exits with what it returns (3 if it throws).
template <class F>
pid_t child(F&& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 3;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

// The child's exit code; -1 if a signal ended it or it ran past 10 s (then it is killed).
int exit_code(pid_t pid) {
  for (int waited_ms = 0; waited_ms < 10000; waited_ms += 10) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(10ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// on_lost's sentence, waited for with a bound.
struct LostSignal {
  std::mutex m;
  std::condition_variable cv;
  std::string sentence;
  bool called = false;
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& s) {
      std::lock_guard lock(m);
      sentence = s;
      called = true;
      cv.notify_all();
    };
  }
  bool wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(m);
    return cv.wait_for(lock, limit, [&] { return called; });
  }
};

// Bytes a line-based exchange would mangle: NUL, newlines, every byte value.
std::string awkward_payload() {
  std::string p = "id\n\0with spaces ";
  for (int b = 0; b < 256; ++b) p.push_back(char(b));
  return p;
}

const std::string kJob = "test job";

}  // namespace

// ---- the launcher's environment -----------------------------------------------------------------------------

TEST_CASE("without a launcher's variables the ring starts its own ranks") {
  CHECK(ring_placement({}, 4).launcher == RingLauncher::None);
  CHECK(ring_placement({{"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}}, 4).launcher == RingLauncher::None);
}

TEST_CASE("torchrun's variables give rank, world, local GPU, and MASTER_PORT + 1 (its agent holds MASTER_PORT)") {
  const Environment env = {{"RANK", "5"},         {"WORLD_SIZE", "8"},          {"LOCAL_RANK", "1"},
                           {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"},     {"TORCHELASTIC_RUN_ID", "r1"},
                           {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  const RingPlacement p = ring_placement(env, 8);
  CHECK(p.launcher == RingLauncher::Torchrun);
  CHECK(p.rank == 5);
  CHECK(p.world_size == 8);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "n0");
  CHECK(p.port == 29501);
  CHECK(contains(p.job, "r1"));

  Environment own_port = env;
  own_port[kRingPortVariable] = "40000";
  CHECK(ring_placement(own_port, 8).port == 40000);
  own_port[kRingPortVariable] = "70000";
  CHECK(contains(refusal([&] { ring_placement(own_port, 8); }), "FLASHLAB_RING_PORT must be a TCP port"));
}

TEST_CASE("srun's variables give rank, world, local GPU and the exported MASTER_PORT") {
  const Environment env = {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},   {"SLURM_LOCALID", "1"},
                           {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"}, {"MASTER_ADDR", "gpu-node-01"},
                           {"MASTER_PORT", "29500"}};
  const RingPlacement p = ring_placement(env, 4);
  CHECK(p.launcher == RingLauncher::Slurm);
  CHECK(p.rank == 3);
  CHECK(p.world_size == 4);
  CHECK(p.local_rank == 1);
  CHECK(p.master_addr == "gpu-node-01");
  CHECK(p.port == 29500);
  CHECK(contains(p.job, "77"));
}

TEST_CASE("torchrun inside an srun step: torchrun's variables say where the rank is") {
  const Environment env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                           {"RANK", "6"},         {"WORLD_SIZE", "8"},   {"LOCAL_RANK", "2"},
                           {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "1234"}};
  const RingPlacement p = ring_placement(env, 8);
  CHECK(p.launcher == RingLauncher::Torchrun);
  CHECK(p.rank == 6);
  CHECK(p.local_rank == 2);
  CHECK(p.port == 1235);
}

TEST_CASE("a single Slurm task is no launcher of ranks: the ring starts its own") {
  const Environment env = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}};
  CHECK(ring_placement(env, 4).launcher == RingLauncher::None);
}

TEST_CASE("a launcher's process count other than --gpus is one sentence naming both") {
  const std::string torch = refusal([] {
    ring_placement({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "n0"},
                    {"MASTER_PORT", "29500"}},
                   2);
  });
  CHECK(contains(torch, "torchrun started 4 processes (WORLD_SIZE=4) but --gpus is 2"));
  const std::string slurm = refusal([] {
    ring_placement({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}, {"MASTER_ADDR", "n0"},
                    {"MASTER_PORT", "29500"}},
                   4);
  });
  CHECK(contains(slurm, "srun started 8 processes (SLURM_NTASKS=8) but --gpus is 4"));
}

TEST_CASE("under srun a missing MASTER_ADDR or MASTER_PORT says how to export them") {
  const Environment no_addr = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                               {"MASTER_PORT", "29500"}};
  const std::string addr = refusal([&] { ring_placement(no_addr, 2); });
  CHECK(contains(addr, "under srun, flashlab ring needs MASTER_ADDR"));
  CHECK(contains(addr, "scontrol show hostnames"));
  const Environment no_port = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                               {"MASTER_ADDR", "n0"}};
  CHECK(contains(refusal([&] { ring_placement(no_port, 2); }), "needs MASTER_PORT"));
}

TEST_CASE("malformed launcher variables are refused by name") {
  const Environment base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "n0"},
                            {"MASTER_PORT", "29500"}};
  Environment e = base;
  e["RANK"] = "2";  // ranks are 0 .. WORLD_SIZE-1
  CHECK(contains(refusal([&] { ring_placement(e, 2); }), "RANK must be a whole number from 0 to 1, not '2'"));
  e = base;
  e["LOCAL_RANK"] = "x";
  CHECK(contains(refusal([&] { ring_placement(e, 2); }), "LOCAL_RANK must be a whole number"));
  e = base;
  e.erase("LOCAL_RANK");
  CHECK(contains(refusal([&] { ring_placement(e, 2); }), "needs LOCAL_RANK"));
  e = base;
  e["MASTER_PORT"] = "65535";  // + 1 is no port
  CHECK(contains(refusal([&] { ring_placement(e, 2); }), "FLASHLAB_RING_PORT"));
}

// ---- the exchange -------------------------------------------------------------------------------------------

TEST_CASE("ranks in separate processes all get rank 0's bytes through 127.0.0.1") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const int port = free_port();
    const std::string payload = awkward_payload();
    std::vector<pid_t> ranks;
    for (int r = 1; r < world; ++r)
      ranks.push_back(child([&, r] {
        RingRendezvous met = fetch_ring_id("127.0.0.1", port, r, world, kJob, 4s);
        const bool same = met.payload() == payload;  // the bytes this process held before the fork
        met.finish();
        return same ? 0 : 1;
      }));
    RingRendezvous met = serve_ring_id("127.0.0.1", port, world, kJob, payload, 4s);
    LostSignal lost;
    met.watch(lost.callback());
    for (const pid_t pid : ranks) CHECK(exit_code(pid) == 0);
    CHECK(met.payload() == payload);
    met.finish();
    CHECK_FALSE(lost.called);  // ranks that said "done" and left are no failure
  }
}

TEST_CASE("a rank with nobody listening stops after its timeout, naming the address") {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string why = refusal([&] { fetch_ring_id("127.0.0.1", port, 1, 2, kJob, 400ms); });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(contains(why, "rank 1 found no rank 0 listening at 127.0.0.1:" + std::to_string(port) + " within 400 ms"));
  CHECK(contains(why, "Connection refused"));
  CHECK(took >= 400ms);  // it retried until the timeout, rather than failing on the first refusal
  CHECK(took < 3s);
}

TEST_CASE("rank 0 stops after its timeout saying how many ranks arrived, and the one that came stops too") {
  const int port = free_port();
  const pid_t rank1 = child([&] {
    const std::string why = refusal([&] { fetch_ring_id("127.0.0.1", port, 1, 3, kJob, 4s); });
    return contains(why, "closed the connection before sending the ring's id") ? 0 : 1;
  });
  const std::string why = refusal([&] { serve_ring_id("127.0.0.1", port, 3, kJob, "id", 800ms); });
  CHECK(contains(why, "2 of the 3 ranks arrived (missing: rank 2)"));
  CHECK(exit_code(rank1) == 0);
}

TEST_CASE("rank 0 turns away a rank of another launch, and the rank says why") {
  const int port = free_port();
  const pid_t stranger = child([&] {
    const std::string why = refusal([&] { fetch_ring_id("127.0.0.1", port, 1, 2, "other job", 4s); });
    return contains(why, "turned rank 1 away: a rank of another launch (other job)") ? 0 : 1;
  });
  const std::string why = refusal([&] { serve_ring_id("127.0.0.1", port, 2, kJob, "id", 800ms); });
  CHECK(contains(why, "1 of the 2 ranks arrived"));
  CHECK(contains(why, "turned away: a rank of another launch"));
  CHECK(exit_code(stranger) == 0);
}

TEST_CASE("rank 0 refuses a port another program holds, in one sentence naming it") {
  const int port = free_port();
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(std::uint16_t(port));
  REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(s, 1) == 0);
  const std::string why = refusal([&] { serve_ring_id("127.0.0.1", port, 2, kJob, "id", 1s); });
  ::close(s);
  CHECK(contains(why, "rank 0 cannot serve the ring's id on port " + std::to_string(port)));
  CHECK(contains(why, "in use"));
  CHECK(contains(why, "FLASHLAB_RING_PORT"));
}

// ---- once met: a rank that fails ends the others ------------------------------------------------------------

TEST_CASE("rank 0 learns at once that a rank's process ended before it finished") {
  const int port = free_port();
  const pid_t rank1 = child([&] {
    RingRendezvous met = fetch_ring_id("127.0.0.1", port, 1, 2, kJob, 4s);
    ::_exit(2);  // a crash or a refusal after the meeting: no "done"
    return 0;
  });
  RingRendezvous met = serve_ring_id("127.0.0.1", port, 2, kJob, "id", 4s);
  LostSignal lost;
  met.watch(lost.callback());
  REQUIRE(lost.wait(3s));
  CHECK(contains(lost.sentence, "rank 1 of the ring ended before it finished"));
  CHECK(contains(lost.sentence, "so rank 0 stops too"));
  CHECK(exit_code(rank1) == 2);
}

TEST_CASE("a rank learns at once that rank 0 ended before it finished") {
  const int port = free_port();
  const pid_t rank0 = child([&] {
    RingRendezvous met = serve_ring_id("127.0.0.1", port, 2, kJob, "id", 4s);
    throw InputError("rank 0 fails");  // unwinding closes the connection without "done"
    return 0;
  });
  RingRendezvous met = fetch_ring_id("127.0.0.1", port, 1, 2, kJob, 4s);
  LostSignal lost;
  met.watch(lost.callback());
  REQUIRE(lost.wait(3s));
  CHECK(contains(lost.sentence, "rank 0 of the ring (at 127.0.0.1:" + std::to_string(port) + ") ended before"));
  CHECK(contains(lost.sentence, "so rank 1 stops too"));
  CHECK(exit_code(rank0) == 3);
}

TEST_CASE("of three ranks, when rank 2 fails rank 1 hears from rank 0 which rank it was") {
  const int port = free_port();
  const pid_t rank0 = child([&] {
    RingRendezvous met = serve_ring_id("127.0.0.1", port, 3, kJob, "id", 4s);
    std::atomic<bool> lost{false};
    met.watch([&](const std::string&) { lost = true; });
    for (int i = 0; i < 300 && !lost; ++i) std::this_thread::sleep_for(10ms);
    return lost ? 0 : 1;  // the CLI's on_lost ends the process here
  });
  const pid_t rank2 = child([&] {
    RingRendezvous met = fetch_ring_id("127.0.0.1", port, 2, 3, kJob, 4s);
    ::_exit(2);
    return 0;
  });
  RingRendezvous met = fetch_ring_id("127.0.0.1", port, 1, 3, kJob, 4s);
  LostSignal lost;
  met.watch(lost.callback());
  REQUIRE(lost.wait(3s));
  CHECK(contains(lost.sentence, "rank 2 of the ring ended before it finished"));
  CHECK(contains(lost.sentence, "so rank 1 stops too"));
  CHECK(exit_code(rank2) == 2);
  CHECK(exit_code(rank0) == 0);
}
