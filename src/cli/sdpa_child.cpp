// PyTorch's SDPA timed by python/flashlab/_sdpa_timer.py in a child process, for `flashlab verify --bench`
// (sdpa_child.hpp). The child is started with posix_spawnp: its stdin is an unlinked temporary file holding the
// request (so a child that exits before reading it can neither block the CLI nor kill it with SIGPIPE), its stdout a
// pipe read to the end, its stderr another temporary file, read after it exits for the last line of what went wrong.
#include "cli/sdpa_child.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <utility>

#include "cli/verify_plugin.hpp"

extern char** environ;

#ifndef FLASHLAB_SDPA_TIMER
#error "src/cli/CMakeLists.txt defines FLASHLAB_SDPA_TIMER, the timer's absolute path"
#endif

namespace flashlab::cli {
namespace {

std::string system_error(const std::string& what, int error) { return what + " (" + std::strerror(error) + ")"; }

// A file descriptor, closed when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { close(); }
  int get() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// An unlinked temporary file, open for reading and writing, closed on exec (the child gets it through dup2, which
// clears that flag on the copy).
Fd temporary_file(const std::string& what) {
  const char* dir = std::getenv("TMPDIR");
  std::string path = std::string(dir && *dir ? dir : "/tmp") + "/flashlab-sdpa-XXXXXX";
  Fd fd(::mkostemp(path.data(), O_CLOEXEC));
  if (fd.get() < 0) throw std::runtime_error(system_error("cannot make a temporary file for " + what + " in " + path, errno));
  if (::unlink(path.c_str()) != 0) throw std::runtime_error(system_error("cannot remove the temporary file " + path, errno));
  return fd;
}

void write_all(int fd, const std::string& text, const std::string& what) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(system_error("cannot write " + what, errno));
    done += std::size_t(n);
  }
}

// Everything left to read from fd; with a deadline, false once it has passed with the end not yet reached.
bool read_all_until(int fd, const std::string& what, std::optional<std::chrono::steady_clock::time_point> deadline,
                    std::string& text) {
  char buffer[4096];
  for (;;) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd ready{.fd = fd, .events = POLLIN, .revents = 0};
      const int rc = ::poll(&ready, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) throw std::runtime_error(system_error("cannot wait for " + what, errno));
      if (rc == 0) continue;  // nothing yet: look at the deadline again
    }
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(system_error("cannot read " + what, errno));
    if (n == 0) return true;
    text.append(buffer, std::size_t(n));
  }
}

std::string read_all(int fd, const std::string& what) {
  std::string text;
  read_all_until(fd, what, std::nullopt, text);
  return text;
}

// posix_spawn's file actions, destroyed when they go out of scope.
class FileActions {
 public:
  FileActions() {
    if (const int rc = posix_spawn_file_actions_init(&actions_); rc != 0)
      throw std::runtime_error(system_error("posix_spawn_file_actions_init failed", rc));
  }
  ~FileActions() { posix_spawn_file_actions_destroy(&actions_); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
  void dup2(int from, int to) {
    if (const int rc = posix_spawn_file_actions_adddup2(&actions_, from, to); rc != 0)
      throw std::runtime_error(system_error("posix_spawn_file_actions_adddup2 failed", rc));
  }
  const posix_spawn_file_actions_t* get() const { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// The last line of `text` that is not blank, without surrounding spaces, at most `limit` characters.
std::string last_line(const std::string& text, std::size_t limit = 200) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const std::size_t start = text.find_last_of('\n', end);
  std::string line = text.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
  line.erase(0, line.find_first_not_of(" \t"));
  return line.size() > limit ? line.substr(0, limit) + "..." : line;
}

// A time from the reply: null is "not timed" (-1); anything else must be a finite number of milliseconds, at least 0.
double read_ms(const nlohmann::json& result, const char* key) {
  if (!result.contains(key) || result[key].is_null()) return -1;
  if (!result[key].is_number() || !std::isfinite(result[key].get<double>()) || result[key].get<double>() < 0)
    throw std::runtime_error(std::string(key) + " is " + result[key].dump() + ", not a time in milliseconds or null");
  return result[key].get<double>();
}

// Text from the reply, on one line (it goes into a table cell or the line under the table).
std::string read_text(const nlohmann::json& result, const char* key) {
  if (!result.contains(key) || result[key].is_null()) return "";
  if (!result[key].is_string()) throw std::runtime_error(std::string(key) + " is " + result[key].dump() + ", not text");
  std::string text = result[key].get<std::string>();
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace

std::string sdpa_request(const std::vector<SdpaProblem>& problems, Device device) {
  nlohmann::ordered_json request;
  request["device"] = device == Device::Cuda ? "cuda" : "cpu";
  request["warmup"] = 1;
  request["runs"] = kBenchTimedRuns;
  request["slow_run_ms"] = kBenchSlowRunMs;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const SdpaProblem& p : problems) {
    const Shape& s = p.problem.shape;
    nlohmann::ordered_json j;
    j["dtype"] = to_string(p.dtype);
    j["batch"] = s.batch, j["heads_q"] = s.heads_q, j["heads_kv"] = s.heads_kv;
    j["seq_q"] = s.seq_q, j["seq_k"] = s.seq_k, j["head_dim"] = s.head_dim;
    j["causal"] = to_string(p.problem.options.causal);
    j["scale"] = p.problem.softmax_scale();
    j["backward"] = p.backward;
    list.push_back(std::move(j));
  }
  request["problems"] = std::move(list);
  return request.dump();
}

SdpaTimes read_sdpa_reply(const std::string& reply, std::size_t problems, const std::string& python) {
  SdpaTimes times;
  const std::string who = "`" + python + "`";
  // The reply is the timer's last line; anything a library printed to stdout before it is not part of it.
  const std::string line = last_line(reply, std::string::npos);
  if (line.empty()) {
    times.why_not = who + " ran the SDPA timer and it printed no reply";
    return times;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    times.why_not = who + " ran the SDPA timer and its reply is not JSON: " + last_line(line, 80);
    return times;
  }
  try {
    if (!j.is_object() || !j.contains("ok") || !j["ok"].is_boolean())
      throw std::runtime_error("it is not an object with \"ok\" true or false");
    if (!j["ok"].get<bool>()) {
      const std::string error = read_text(j, "error");
      times.why_not = who + " " + (error.empty() ? "failed in the SDPA timer without saying why" : error);
      return times;
    }
    if (!j.contains("results") || !j["results"].is_array()) throw std::runtime_error("it has no list of results");
    if (j["results"].size() != problems)
      throw std::runtime_error("it has " + std::to_string(j["results"].size()) + " results for " +
                               std::to_string(problems) + " problems");
    for (const nlohmann::json& r : j["results"]) {
      if (!r.is_object()) throw std::runtime_error("a result is not an object");
      SdpaTime t;
      t.forward_ms = read_ms(r, "forward_ms");
      t.forward_backward_ms = read_ms(r, "forward_backward_ms");
      t.forward_backend = read_text(r, "forward_backend");
      t.forward_backward_backend = read_text(r, "forward_backward_backend");
      t.note = read_text(r, "note");
      if (t.forward_ms < 0 && t.note.empty()) t.note = "not timed, without saying why";
      times.times.push_back(std::move(t));
    }
    const std::string torch = read_text(j, "torch"), device = read_text(j, "device"), clock = read_text(j, "clock");
    times.about = "PyTorch " + (torch.empty() ? std::string("(version not given)") : torch) +
                  "'s scaled_dot_product_attention on " + (device.empty() ? "its device" : device);
    if (!clock.empty()) times.about += " (" + clock + ")";
    if (j.contains("threads") && j["threads"].is_number_integer())  // on the CPU
      times.about += " with " + std::to_string(j["threads"].get<int>()) + " threads";
  } catch (const std::exception& e) {
    times = SdpaTimes{};
    times.why_not = who + " ran the SDPA timer and its reply is not the one expected: " + e.what();
  }
  return times;
}

ChildRun run_child(const std::vector<std::string>& argv, const std::string& input, int timeout_s) {
  if (argv.empty() || argv.front().empty()) throw std::runtime_error("no program to run");
  Fd in = temporary_file("the child's input"), err = temporary_file("the child's error output");
  write_all(in.get(), input, "the child's input");
  if (::lseek(in.get(), 0, SEEK_SET) != 0) throw std::runtime_error(system_error("cannot rewind the child's input", errno));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error(system_error("cannot make a pipe", errno));
  Fd out_read(pipe_fds[0]), out_write(pipe_fds[1]);

  FileActions actions;
  actions.dup2(in.get(), STDIN_FILENO);
  actions.dup2(out_write.get(), STDOUT_FILENO);
  actions.dup2(err.get(), STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  if (const int rc = posix_spawnp(&pid, args[0], actions.get(), nullptr, args.data(), environ); rc != 0)
    throw std::runtime_error(system_error("cannot start `" + argv.front() + "`", rc));
  out_write.close();  // the child holds its own copy: the pipe ends when the child closes it

  ChildRun run;
  std::string read_error;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (timeout_s > 0) deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  try {
    if (!read_all_until(out_read.get(), "the child's output", deadline, run.out)) {
      ::kill(pid, SIGKILL);  // it has had its time: stopped, then reaped below
      read_error = "`" + argv.front() + "` gave no answer within " + std::to_string(timeout_s) + " s and was stopped";
    }
  } catch (const std::exception& e) {
    read_error = e.what();  // still wait for the child, so that it does not linger
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(system_error("cannot wait for `" + argv.front() + "`", errno));
  if (!read_error.empty()) throw std::runtime_error(read_error);
  if (WIFEXITED(status)) run.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  if (::lseek(err.get(), 0, SEEK_SET) != 0) throw std::runtime_error(system_error("cannot rewind the child's errors", errno));
  run.err = read_all(err.get(), "the child's error output");
  return run;
}

std::string sdpa_timer_path() { return FLASHLAB_SDPA_TIMER; }

SdpaTimes time_sdpa(const std::string& python, const std::vector<SdpaProblem>& problems, Device device,
                    const std::string& timer) {
  SdpaTimes times;
  struct stat info {};
  if (::stat(timer.c_str(), &info) != 0) {
    times.why_not = "the SDPA timer " + timer + " is missing (this flashlab was built from a source tree that has "
                    "moved since)";
    return times;
  }
  ChildRun run;
  try {
    run = run_child({python, timer}, sdpa_request(problems, device), kSdpaTimeoutSeconds);
  } catch (const std::exception& e) {
    times.why_not = std::string(e.what()) + "; --python names the interpreter that has PyTorch";
    return times;
  }
  const std::string said = last_line(run.err);
  const std::string who = "`" + python + "`";
  if (run.signal != 0) {
    times.why_not = who + " was ended by signal " + std::to_string(run.signal) + " (" + strsignal(run.signal) +
                    ") in the SDPA timer" + (said.empty() ? "" : ": " + said);
    return times;
  }
  if (run.exit_status != 0) {
    times.why_not = who + " exited with status " + std::to_string(run.exit_status) + " running the SDPA timer" +
                    (said.empty() ? ", saying nothing on stderr" : ": " + said);
    return times;
  }
  return read_sdpa_reply(run.out, problems.size(), python);
}

}  // namespace flashlab::cli
