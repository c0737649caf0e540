#pragma once
// How the ranks of `flashlab ring` find each other when a cluster launcher starts them, one process per rank,
// possibly on several nodes: what the launcher's environment says (this rank, the world size, the GPU on this node,
// the address of rank 0), and the TCP exchange through which rank 0 hands the ring's NCCL id and seed to the others.
//
// The connection each rank opens to rank 0 stays open for the whole run, as a tripwire: a rank whose process ends
// before it finished (a refusal, a crash, a kill) closes it, the kernel does that even for a crash, and the others
// stop at once with a sentence naming it, rather than waiting in NCCL for a peer that is gone.
//
// Plain POSIX sockets, IPv4 and IPv6 (getaddrinfo). No CUDA here.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace flashlab::cli {

// ---- the launcher's environment -----------------------------------------------------------------------------

enum class RingLauncher {
  None,      // no launcher: `flashlab ring` starts its ranks itself, on this host
  Torchrun,  // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun; TORCHELASTIC_RUN_ID names the run)
  Slurm,     // srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR, MASTER_PORT exported by the user
};
const char* to_string(RingLauncher);

// Overrides the rendezvous's TCP port. Without it: MASTER_PORT + 1 under torchrun, whose agent already serves its
// own store on MASTER_PORT, and MASTER_PORT under srun, where nothing else takes it.
inline constexpr const char* kRingPortVariable = "FLASHLAB_RING_PORT";

// This process's place in the ring, as the launcher's environment gives it.
struct RingPlacement {
  RingLauncher launcher = RingLauncher::None;
  int rank = 0, world_size = 1;
  int local_rank = 0;       // this rank's GPU on its node (LOCAL_RANK, SLURM_LOCALID)
  std::string master_addr;  // rank 0's host
  int port = 0;             // the rendezvous's TCP port on it
  std::string job;          // this launch's name: a rank of another launch that reaches the port is turned away
};

using Environment = std::map<std::string, std::string>;
Environment process_environment();  // this process's, from environ

// Where `flashlab ring --gpus <gpus>` runs. torchrun's variables win over Slurm's (torchrun inside srun starts the
// ranks); Slurm with a single task is no launcher of ranks (a batch script that runs `flashlab ring` once): the
// ring then starts its ranks itself, as without a launcher. Throws InputError, in one sentence, for a world size
// other than --gpus, a missing or malformed variable (MASTER_ADDR under srun: how to export it), a bad port.
RingPlacement ring_placement(const Environment& env, int gpus);

// ---- the exchange -------------------------------------------------------------------------------------------

// One rank's end of the rendezvous, open until finish() (or its destruction, which tells the peers this rank
// failed). Rank 0 holds a connection to every other rank, every other rank one to rank 0.
class RingRendezvous {
 public:
  RingRendezvous(RingRendezvous&&) noexcept;
  RingRendezvous& operator=(RingRendezvous&&) noexcept;
  ~RingRendezvous();

  // What rank 0 served: the same bytes on every rank.
  const std::string& payload() const;

  // From now until finish(), a peer whose connection ends before it finished makes `on_lost` run, once, on a
  // thread of its own, with a sentence naming the rank that was lost. Rank 0 first tells the other ranks, so each
  // names the rank that failed rather than rank 0. The command ends the process there.
  void watch(std::function<void(const std::string&)> on_lost);

  // This rank is done: stops watching, tells the peers so (they will not count its leaving as a failure), closes.
  void finish();

  struct State;

 private:
  friend RingRendezvous serve_ring_id(const std::string&, int, int, const std::string&, const std::string&,
                                      std::chrono::milliseconds);
  friend RingRendezvous fetch_ring_id(const std::string&, int, int, int, const std::string&,
                                      std::chrono::milliseconds);
  explicit RingRendezvous(std::unique_ptr<State>);
  std::unique_ptr<State> state_;
};

// Rank 0: listens on `port` (at `bind_host`'s addresses; "" = every address of this host), waits for ranks
// 1 .. world_size-1 of launch `job` to connect, then sends each `payload`. Throws InputError, in one sentence, when
// it cannot listen (naming the port and what failed) or when `timeout` passes first (how many ranks arrived, which
// are missing). With world_size 1 it listens for nobody.
RingRendezvous serve_ring_id(const std::string& bind_host, int port, int world_size, const std::string& job,
                             const std::string& payload, std::chrono::milliseconds timeout);

// Rank `rank` > 0: connects to rank 0 at host:port, retrying until `timeout` passes while nobody listens there yet,
// then waits (again at most `timeout`: rank 0 answers or gives up within it) for the payload. Throws InputError,
// in one sentence naming the address, when it cannot resolve the host, reach it in time, or is turned away.
RingRendezvous fetch_ring_id(const std::string& host, int port, int rank, int world_size, const std::string& job,
                             std::chrono::milliseconds timeout);

}  // namespace flashlab::cli
