#include "cli/rendezvous.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/problem.hpp"  // InputError

extern char** environ;

namespace flashlab::cli {

const char* to_string(RingLauncher l) {
  switch (l) {
    case RingLauncher::None: return "none";
    case RingLauncher::Torchrun: return "torchrun";
    case RingLauncher::Slurm: return "srun";
  }
  return "?";
}

Environment process_environment() {
  Environment env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::size_t eq = var.find('=');
    if (eq != std::string::npos) env.emplace(var.substr(0, eq), var.substr(eq + 1));
  }
  return env;
}

// ---- the launcher's environment -----------------------------------------------------------------------------

namespace {

const std::string* lookup(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

// A whole non-negative decimal integer, else nullopt.
std::optional<long> parse_count(const std::string& text) {
  long v = -1;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < 0) return std::nullopt;
  return v;
}

struct VariableReader {
  const Environment& env;
  std::string launcher;  // "torchrun", "srun": named in the sentences

  const std::string& text(const std::string& name, const std::string& how) const {
    const std::string* v = lookup(env, name);
    if (v == nullptr || v->empty())
      throw InputError("under " + launcher + ", flashlab ring needs " + name + " in the environment" + how);
    return *v;
  }
  int number(const std::string& name, long max) const {
    const std::string& v = text(name, "");
    const std::optional<long> n = parse_count(v);
    if (!n || *n > max)
      throw InputError(name + " must be a whole number from 0 to " + std::to_string(max) + ", not '" + v + "'");
    return int(*n);
  }
};

int parse_port(const std::string& name, const std::string& value) {
  const std::optional<long> n = parse_count(value);
  if (!n || *n < 1 || *n > 65535)
    throw InputError(name + " must be a TCP port from 1 to 65535, not '" + value + "'");
  return int(*n);
}

}  // namespace

RingPlacement ring_placement(const Environment& env, int gpus) {
  RingPlacement p;
  const bool torchrun = (lookup(env, "RANK") && lookup(env, "WORLD_SIZE")) || lookup(env, "TORCHELASTIC_RUN_ID");
  const bool slurm = lookup(env, "SLURM_PROCID") != nullptr;
  if (!torchrun && !slurm) return p;

  const VariableReader read{env, torchrun ? "torchrun" : "srun"};
  const char* world_variable = torchrun ? "WORLD_SIZE" : "SLURM_NTASKS";
  const int world = read.number(world_variable, 1 << 20);
  if (!torchrun && world == 1) return p;  // one task: no launcher of ranks, the ring starts its own
  if (world != gpus)
    throw InputError(read.launcher + " started " + std::to_string(world) + " processes (" + world_variable + "=" +
                     std::to_string(world) + ") but --gpus is " + std::to_string(gpus) + ": give --gpus " +
                     std::to_string(world) + ", one rank per process" +
                     (torchrun ? " (torchrun's --nnodes x --nproc_per_node)" : " (srun's --ntasks)"));
  p.launcher = torchrun ? RingLauncher::Torchrun : RingLauncher::Slurm;
  p.world_size = world;
  p.rank = read.number(torchrun ? "RANK" : "SLURM_PROCID", world - 1);
  p.local_rank = read.number(torchrun ? "LOCAL_RANK" : "SLURM_LOCALID", 1 << 20);

  const std::string exports =
      torchrun ? std::string(" (torchrun sets it for the processes it starts)")
               : std::string(": export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) "
                             "and MASTER_PORT=<a free port, e.g. 29500> before srun, so every task finds rank 0");
  p.master_addr = read.text("MASTER_ADDR", exports);
  const int master_port = parse_port("MASTER_PORT", read.text("MASTER_PORT", exports));
  if (const std::string* own = lookup(env, kRingPortVariable)) {
    p.port = parse_port(kRingPortVariable, *own);
  } else if (torchrun) {  // torchrun's agent serves its own store on MASTER_PORT
    if (master_port == 65535)
      throw InputError(std::string("under torchrun the ring listens on MASTER_PORT + 1, and MASTER_PORT is 65535: set ") +
                       kRingPortVariable + " to a free port");
    p.port = master_port + 1;
  } else {
    p.port = master_port;
  }

  if (torchrun) {
    const std::string* run_id = lookup(env, "TORCHELASTIC_RUN_ID");
    p.job = "torchrun run '" + (run_id ? *run_id : std::string()) + "' at " + p.master_addr + ":" +
            std::to_string(master_port);
  } else {
    const std::string* job_id = lookup(env, "SLURM_JOB_ID");
    const std::string* step_id = lookup(env, "SLURM_STEP_ID");
    p.job = "slurm job " + (job_id ? *job_id : std::string("?")) + "." + (step_id ? *step_id : std::string("?"));
  }
  return p;
}

// ---- the exchange -------------------------------------------------------------------------------------------
//
// Every message is a frame: 4 bytes of length (big-endian), then that many bytes. A rank > 0 opens with
// "hello <rank> <world size> <job>"; rank 0 answers "id <payload>" once every rank is there, or "refused <why>".
// Then either side may send "done" (it finished) and rank 0 "lost <rank>" (that rank ended before it finished).

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMaxFrame = 1 << 16;  // our frames are small: anything longer is not this protocol

std::string errno_text(const char* call, int err) { return std::string(call) + ": " + std::strerror(err); }

std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string seconds(std::chrono::milliseconds t) {
  const long ms = long(t.count());
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return int(std::clamp<long long>(left, 0, 1 << 30));
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

bool set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

// Sends a whole frame before `deadline`; false (errno set) when the peer is gone or it took too long.
bool send_frame(int fd, const std::string& body, Clock::time_point deadline) {
  const std::uint32_t n = std::uint32_t(body.size());
  std::string bytes = {char(n >> 24), char(n >> 16), char(n >> 8), char(n)};
  bytes += body;
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t k = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (k > 0) {
      sent += std::size_t(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, ms_until(deadline));
      if (r == 0) {
        errno = ETIMEDOUT;
        return false;
      }
      if (r < 0 && errno != EINTR) return false;
      continue;
    }
    return false;
  }
  return true;
}

// The frames arriving on one connection.
struct FrameReader {
  std::string buffer;
  enum class Read { Some, Closed, Failed };
  int error = 0;  // errno of a Failed read

  // Takes what the socket holds now (it is readable).
  Read fill(int fd) {
    char chunk[4096];
    for (;;) {
      const ssize_t k = ::recv(fd, chunk, sizeof chunk, 0);
      if (k > 0) {
        buffer.append(chunk, std::size_t(k));
        if (std::size_t(k) < sizeof chunk) return Read::Some;
        continue;
      }
      if (k == 0) return Read::Closed;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Read::Some;
      error = errno;
      return Read::Failed;
    }
  }
  // The next whole frame, if one has arrived; `garbled` when the length cannot be one of ours.
  std::optional<std::string> next(bool& garbled) {
    garbled = false;
    if (buffer.size() < 4) return std::nullopt;
    const auto b = [&](int i) { return std::uint32_t(static_cast<unsigned char>(buffer[i])); };
    const std::uint32_t n = (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
    if (n > kMaxFrame) {
      garbled = true;
      return std::nullopt;
    }
    if (buffer.size() < 4 + std::size_t(n)) return std::nullopt;
    std::string frame = buffer.substr(4, n);
    buffer.erase(0, 4 + std::size_t(n));
    return frame;
  }
};

enum class Wait { Frame, Closed, Failed, TimedOut, Garbled };

// Waits for one frame on `fd` until `deadline`.
Wait read_frame(int fd, FrameReader& reader, Clock::time_point deadline, std::string& frame) {
  for (;;) {
    bool garbled = false;
    if (std::optional<std::string> f = reader.next(garbled)) {
      frame = std::move(*f);
      return Wait::Frame;
    }
    if (garbled) return Wait::Garbled;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms_until(deadline));
    if (r == 0) return Wait::TimedOut;
    if (r < 0) {
      if (errno == EINTR) continue;
      reader.error = errno;
      return Wait::Failed;
    }
    const FrameReader::Read got = reader.fill(fd);
    if (got == FrameReader::Read::Failed) return Wait::Failed;
    if (got == FrameReader::Read::Closed) {
      bool g = false;
      if (std::optional<std::string> f = reader.next(g)) {  // a frame sent just before closing
        frame = std::move(*f);
        return Wait::Frame;
      }
      return Wait::Closed;
    }
  }
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

// ---- one rank's end -----------------------------------------------------------------------------------------

struct RingRendezvous::State {
  struct Peer {
    int rank = -1;
    Fd fd;
    FrameReader reader;
    bool finished = false;  // it said "done": its leaving is no failure
  };
  int rank = 0;
  std::string rank0;  // "rank 0 at host:port", for the sentences of a rank > 0
  std::string payload;
  std::vector<Peer> peers;
  std::thread watcher;
  Fd stop_read, stop_write;  // a pipe: a byte written stops the watcher
  bool done = false;

  void stop_watching() {
    if (!watcher.joinable()) return;
    const char byte = 1;
    while (::write(stop_write.fd, &byte, 1) < 0 && errno == EINTR) {
    }
    watcher.join();
  }
  ~State() { stop_watching(); }  // the peers' connections close without "done": they learn this rank failed

  void watch(const std::function<void(const std::string&)>& on_lost);
  std::string lost_sentence(int lost) const {
    return "rank " + std::to_string(lost) + " of the ring ended before it finished (its own message says why), so rank " +
           std::to_string(rank) + " stops too";
  }
};

void RingRendezvous::State::watch(const std::function<void(const std::string&)>& on_lost) {
  for (;;) {
    std::vector<pollfd> polled = {{stop_read.fd, POLLIN, 0}};
    std::vector<Peer*> watched;
    for (Peer& p : peers)
      if (!p.finished && p.fd.fd >= 0) {
        polled.push_back({p.fd.fd, POLLIN, 0});
        watched.push_back(&p);
      }
    if (watched.empty()) return;
    const int r = ::poll(polled.data(), polled.size(), -1);
    if (r < 0) {
      if (errno == EINTR) continue;
      on_lost("rank " + std::to_string(rank) + " can no longer watch the ring's other ranks (" +
              errno_text("poll", errno) + "), so it stops");
      return;
    }
    if (polled[0].revents != 0) return;  // finish()
    for (std::size_t i = 0; i < watched.size(); ++i) {
      if (polled[i + 1].revents == 0) continue;
      Peer& peer = *watched[i];
      const FrameReader::Read got = peer.reader.fill(peer.fd.fd);
      int lost = -1;
      bool garbled = false;
      while (std::optional<std::string> frame = peer.reader.next(garbled)) {
        if (*frame == "done") peer.finished = true;
        if (rank != 0 && starts_with(*frame, "lost ")) lost = parse_count(frame->substr(5)).value_or(0);
      }
      if (peer.finished) continue;
      if (lost < 0 && (got != FrameReader::Read::Some || garbled)) lost = peer.rank;
      if (lost < 0) continue;
      if (rank == 0)  // so each rank names the one that failed, not rank 0
        for (Peer& other : peers)
          if (&other != &peer && !other.finished)
            (void)send_frame(other.fd.fd, "lost " + std::to_string(lost), Clock::now() + std::chrono::seconds(1));
      on_lost(lost == 0 ? "rank 0 of the ring (" + rank0.substr(std::string("rank 0 ").size()) +
                              ") ended before it finished (its own message says why), so rank " +
                              std::to_string(rank) + " stops too"
                        : lost_sentence(lost));
      return;
    }
  }
}

RingRendezvous::RingRendezvous(std::unique_ptr<State> s) : state_(std::move(s)) {}
RingRendezvous::RingRendezvous(RingRendezvous&&) noexcept = default;
RingRendezvous& RingRendezvous::operator=(RingRendezvous&&) noexcept = default;
RingRendezvous::~RingRendezvous() = default;

const std::string& RingRendezvous::payload() const { return state_->payload; }

void RingRendezvous::watch(std::function<void(const std::string&)> on_lost) {
  State& s = *state_;
  if (s.watcher.joinable() || s.done || s.peers.empty()) return;
  int fds[2];
  if (::pipe(fds) != 0) throw InputError("rank " + std::to_string(s.rank) + " cannot watch the ring's other ranks (" +
                                         errno_text("pipe", errno) + ")");
  s.stop_read = Fd(fds[0]);
  s.stop_write = Fd(fds[1]);
  s.watcher = std::thread([&s, on_lost = std::move(on_lost)] { s.watch(on_lost); });
}

void RingRendezvous::finish() {
  State& s = *state_;
  if (s.done) return;
  s.stop_watching();
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(2);
  for (State::Peer& p : s.peers) {
    (void)send_frame(p.fd.fd, "done", deadline);  // a peer already gone needs no word
    p.fd.reset();
  }
  s.done = true;
}

// ---- rank 0 -------------------------------------------------------------------------------------------------

RingRendezvous serve_ring_id(const std::string& bind_host, int port, int world_size, const std::string& job,
                             const std::string& payload, std::chrono::milliseconds timeout) {
  auto state = std::make_unique<RingRendezvous::State>();
  state->payload = payload;
  if (world_size <= 1) return RingRendezvous(std::move(state));
  const Clock::time_point deadline = Clock::now() + timeout;
  const std::string where = "port " + std::to_string(port) + (bind_host.empty() ? "" : " of " + bind_host);
  const auto fail = [&](const std::string& what) {
    throw InputError("rank 0 cannot serve the ring's id on " + where + " (" + what + ")" +
                     (what.find("in use") != std::string::npos
                          ? std::string(": another program holds it; choose a free one with ") + kRingPortVariable
                          : std::string()));
  };

  // Listen on every address: on a node whose own name resolves to a loopback address there, as some do, binding
  // MASTER_ADDR would leave the other nodes outside.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), service.c_str(), &hints, &found))
    fail(std::string("getaddrinfo: ") + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);
  std::vector<Fd> listeners;
  std::string skipped;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd < 0) {
      skipped = errno_text("socket", errno);
      continue;  // e.g. no IPv6 on this host
    }
    const int on = 1;
    if (::setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0) fail(errno_text("setsockopt", errno));
    if (a->ai_family == AF_INET6 && ::setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof on) != 0)
      fail(errno_text("setsockopt IPV6_V6ONLY", errno));  // the IPv4 socket takes IPv4
    if (::bind(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
      if (errno == EADDRINUSE) fail(errno_text("bind", errno));
      skipped = errno_text("bind", errno);
      continue;
    }
    if (::listen(s.fd, std::min(world_size, SOMAXCONN)) != 0) fail(errno_text("listen", errno));
    if (!set_nonblocking(s.fd)) fail(errno_text("fcntl", errno));
    listeners.push_back(std::move(s));
  }
  if (listeners.empty()) fail(skipped.empty() ? "no address to listen on" : skipped);

  // Connections that have not yet said who they are, and the ranks that have.
  std::vector<RingRendezvous::State::Peer> pending, ranks;
  std::vector<bool> arrived(std::size_t(world_size), false);
  arrived[0] = true;
  std::string turned_away;  // the last one, for the sentence if ranks are missing
  const auto refuse = [&](RingRendezvous::State::Peer& p, const std::string& why) {
    (void)send_frame(p.fd.fd, "refused " + why, Clock::now() + std::chrono::seconds(1));
    turned_away = why;
    p.fd.reset();
  };
  int count = 1;
  while (count < world_size) {
    std::vector<pollfd> polled;
    for (const Fd& l : listeners) polled.push_back({l.fd, POLLIN, 0});
    for (const auto& p : pending) polled.push_back({p.fd.fd, POLLIN, 0});
    const int left = ms_until(deadline);
    const int r = left == 0 ? 0 : ::poll(polled.data(), polled.size(), left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(errno_text("poll", errno));
    if (r == 0) {
      std::string missing;
      for (int k = 1; k < world_size; ++k)
        if (!arrived[std::size_t(k)]) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      throw InputError("rank 0 waited " + seconds(timeout) + " on " + where + " and " + std::to_string(count) +
                       " of the " + std::to_string(world_size) + " ranks arrived (missing: rank" +
                       (world_size - count > 1 ? "s " : " ") + missing + "); were they all started, and can they reach "
                       "this node's port " + std::to_string(port) + "?" +
                       (turned_away.empty() ? "" : " (turned away: " + turned_away + ")"));
    }
    for (std::size_t i = 0; i < listeners.size(); ++i) {
      if (polled[i].revents == 0) continue;
      for (;;) {
        Fd c(::accept4(listeners[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (c.fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          fail(errno_text("accept", errno));
        }
        pending.push_back({.rank = -1, .fd = std::move(c), .reader = {}, .finished = false});
      }
    }
    for (std::size_t i = 0; i < polled.size() - listeners.size(); ++i) {
      if (polled[listeners.size() + i].revents == 0) continue;
      auto& p = pending[i];
      if (p.reader.fill(p.fd.fd) != FrameReader::Read::Some) {
        p.fd.reset();  // gone before saying who it was
        continue;
      }
      bool garbled = false;
      const std::optional<std::string> hello = p.reader.next(garbled);
      if (garbled) {
        refuse(p, "something that is not a rank of flashlab ring connected");
        continue;
      }
      if (!hello) continue;
      // "hello <rank> <world size> <job>"
      std::optional<long> their_rank, their_world;
      std::string their_job;
      if (starts_with(*hello, "hello ")) {
        const std::size_t a = hello->find(' ', 6), b = a == std::string::npos ? a : hello->find(' ', a + 1);
        if (b != std::string::npos) {
          their_rank = parse_count(hello->substr(6, a - 6));
          their_world = parse_count(hello->substr(a + 1, b - a - 1));
          their_job = hello->substr(b + 1);
        }
      }
      if (!their_rank || !their_world) {
        refuse(p, "something that is not a rank of flashlab ring connected");
      } else if (their_job != job) {
        refuse(p, "a rank of another launch (" + their_job + ") connected, and this one is " + job);
      } else if (*their_world != world_size) {
        refuse(p, "a rank started for a ring of " + std::to_string(*their_world) + " connected, and this ring has " +
                      std::to_string(world_size));
      } else if (*their_rank < 1 || *their_rank >= world_size || arrived[std::size_t(*their_rank)]) {
        refuse(p, "rank " + std::to_string(*their_rank) + " connected, which is not a missing rank of 1 to " +
                      std::to_string(world_size - 1));
      } else {
        arrived[std::size_t(*their_rank)] = true;
        ++count;
        p.rank = int(*their_rank);
        ranks.push_back(std::move(p));
      }
    }
    std::erase_if(pending, [](const auto& p) { return p.fd.fd < 0 || p.rank >= 0; });
  }
  listeners.clear();
  const Clock::time_point send_by = Clock::now() + std::chrono::seconds(5);
  for (auto& p : ranks)
    if (!send_frame(p.fd.fd, "id " + payload, send_by))
      throw InputError("rank 0 could not send the ring's id to rank " + std::to_string(p.rank) + " (" +
                       errno_text("send", errno) + ")");
  state->peers = std::move(ranks);
  return RingRendezvous(std::move(state));
}

// ---- a rank > 0 ---------------------------------------------------------------------------------------------

namespace {

// One try at every address of host:port, each bounded by `deadline`; the connected socket, or the last error.
Fd connect_once(const addrinfo* addresses, Clock::time_point deadline, std::string& error) {
  for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (s.fd < 0) {
      error = errno_text("socket", errno);
      continue;
    }
    if (::connect(s.fd, a->ai_addr, a->ai_addrlen) == 0) return s;
    if (errno != EINPROGRESS) {
      error = errno_text("connect", errno);
      continue;
    }
    pollfd p{s.fd, POLLOUT, 0};
    int r;
    while ((r = ::poll(&p, 1, ms_until(deadline))) < 0 && errno == EINTR) {
    }
    if (r == 0) {
      error = "connect: no answer";
      continue;
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (r < 0) so_error = errno;
    else if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error == 0) return s;
    error = errno_text("connect", so_error);
  }
  return Fd();
}

}  // namespace

RingRendezvous fetch_ring_id(const std::string& host, int port, int rank, int world_size, const std::string& job,
                             std::chrono::milliseconds timeout) {
  const std::string where = endpoint(host, port);
  const std::string me = "rank " + std::to_string(rank);
  const Clock::time_point deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);

  // Rank 0 may not be listening yet: retry until the deadline.
  Fd s;
  std::string error = "nobody answered";
  for (;;) {
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc == 0) {
      std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);
      s = connect_once(found, deadline, error);
      if (s.fd >= 0) break;
    } else if (rc == EAI_AGAIN) {
      error = std::string("getaddrinfo: ") + gai_strerror(rc);
    } else {
      throw InputError(me + " cannot find rank 0's host '" + host + "' (getaddrinfo: " + gai_strerror(rc) +
                       "): MASTER_ADDR must name the node of rank 0");
    }
    if (Clock::now() >= deadline)
      throw InputError(me + " found no rank 0 listening at " + where + " within " + seconds(timeout) + " (last try: " +
                       error + "); is rank 0 running on that node, and is the port the same for every rank?");
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - Clock::now()));
  }

  const std::string rank0 = "rank 0 at " + where;
  if (!send_frame(s.fd, "hello " + std::to_string(rank) + " " + std::to_string(world_size) + " " + job,
                  Clock::now() + timeout))
    throw InputError(me + " could not introduce itself to " + rank0 + " (" + errno_text("send", errno) + ")");
  // Rank 0 answers once every rank is there, or gives up within its own timeout, closing the connection.
  FrameReader reader;
  std::string frame;
  switch (read_frame(s.fd, reader, Clock::now() + timeout, frame)) {
    case Wait::Frame: break;
    case Wait::Closed:
      throw InputError(rank0 + " closed the connection before sending the ring's id, so " + me +
                       " stops (rank 0's own message says why)");
    case Wait::Failed:
      throw InputError(me + " lost its connection to " + rank0 + " (" + errno_text("recv", reader.error) + ")");
    case Wait::TimedOut:
      throw InputError(rank0 + " accepted " + me + " but sent no id within " + seconds(timeout));
    case Wait::Garbled:
      throw InputError("something that is not flashlab ring's rendezvous answers at " + where + "; choose a free port "
                       "with " + kRingPortVariable);
  }
  if (starts_with(frame, "refused "))
    throw InputError(rank0 + " turned " + me + " away: " + frame.substr(8));
  if (!starts_with(frame, "id "))
    throw InputError("something that is not flashlab ring's rendezvous answers at " + where +
                     "; choose a free port with " + kRingPortVariable);

  auto state = std::make_unique<RingRendezvous::State>();
  state->rank = rank;
  state->rank0 = rank0;
  state->payload = frame.substr(3);
  state->peers.push_back({.rank = 0, .fd = std::move(s), .reader = std::move(reader), .finished = false});
  return RingRendezvous(std::move(state));
}

}  // namespace flashlab::cli
