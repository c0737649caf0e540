// The child process `flashlab verify --bench` times PyTorch's SDPA in (src/cli/sdpa_child.hpp), without PyTorch or a
// GPU: the request carries each problem as the timer reads it; a reply is read back value by value, and every way it
// can be wrong is one sentence; run_child hands a child its stdin and returns its stdout, stderr and exit status; and
// time_sdpa, run against fake interpreters (shell scripts) and against the real timer with a planted `torch` that
// fails to import, turns each failure into the sentence under the table instead of an exception.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/sdpa_child.hpp"
#include "cli/verify_plugin.hpp"

using namespace flashlab;
using namespace flashlab::cli;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A fresh folder, removed with what it holds when the test ends.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "flashlab-sdpa-test-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  // An executable shell script named `name` holding `body`.
  std::string script(const std::string& name, const std::string& body) const {
    const std::filesystem::path file = path / name;
    std::ofstream(file) << "#!/bin/sh\n" << body;
    std::filesystem::permissions(file, std::filesystem::perms::owner_all);
    return file.string();
  }
};

SdpaProblem problem(int seq, CausalAlign causal, DType dtype, bool backward) {
  SdpaProblem p;
  p.problem.shape = Shape{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = seq, .seq_k = seq + 8, .head_dim = 64};
  p.problem.options.causal = causal;
  p.dtype = dtype;
  p.backward = backward;
  return p;
}

// A reply of the timer's form with one result per entry of `results` (JSON objects).
std::string ok_reply(const std::string& results) {
  return R"({"ok": true, "torch": "2.9.0-test", "device": "Test GPU", "clock": "CUDA events", "results": [)" +
         results + "]}\n";
}
const std::string kTimed =
    R"({"forward_ms": 0.5, "forward_backend": "flash", "forward_backward_ms": 2.25, "forward_backward_backend": "cudnn", "note": null})";

}  // namespace

TEST_CASE("sdpa_request carries each problem, the device and --bench's protocol as the timer reads them") {
  const std::vector<SdpaProblem> problems{problem(128, CausalAlign::None, DType::BF16, true),
                                          problem(256, CausalAlign::BottomRight, DType::F16, false)};
  const nlohmann::json j = nlohmann::json::parse(sdpa_request(problems, Device::Cuda));
  CHECK(j["device"] == "cuda");
  CHECK(j["warmup"] == 1);
  CHECK(j["runs"] == kBenchTimedRuns);
  CHECK(j["slow_run_ms"].get<double>() == kBenchSlowRunMs);
  REQUIRE(j["problems"].size() == 2);
  const nlohmann::json& first = j["problems"][0];
  CHECK(first["dtype"] == "bf16");
  CHECK(first["batch"] == 2);
  CHECK(first["heads_q"] == 4);
  CHECK(first["heads_kv"] == 2);
  CHECK(first["seq_q"] == 128);
  CHECK(first["seq_k"] == 136);
  CHECK(first["head_dim"] == 64);
  CHECK(first["causal"] == "none");
  CHECK(first["scale"].get<double>() == doctest::Approx(0.125));
  CHECK(first["backward"] == true);
  CHECK(j["problems"][1]["dtype"] == "f16");
  CHECK(j["problems"][1]["causal"] == "bottom-right");
  CHECK(j["problems"][1]["backward"] == false);
  CHECK(nlohmann::json::parse(sdpa_request(problems, Device::Cpu))["device"] == "cpu");
}

TEST_CASE("read_sdpa_reply reads each problem's times, backends and notes, in order") {
  const std::string untimed = R"({"forward_ms": null, "note": "OutOfMemoryError: CUDA out of memory"})";
  const std::string forward_only = R"({"forward_ms": 1.5, "forward_backend": null, "forward_backward_ms": null})";
  // A line some library printed on stdout before the reply is not part of it.
  const SdpaTimes t =
      read_sdpa_reply("a stray line\n" + ok_reply(kTimed + "," + untimed + "," + forward_only), 3, "py");
  REQUIRE(t.why_not.empty());
  REQUIRE(t.times.size() == 3);
  CHECK(t.times[0].forward_ms == 0.5);
  CHECK(t.times[0].forward_backward_ms == 2.25);
  CHECK(t.times[0].forward_backend == "flash");
  CHECK(t.times[0].forward_backward_backend == "cudnn");
  CHECK(t.times[0].note.empty());
  CHECK(t.times[1].forward_ms == -1);
  CHECK(t.times[1].note == "OutOfMemoryError: CUDA out of memory");
  CHECK(t.times[2].forward_ms == 1.5);
  CHECK(t.times[2].forward_backward_ms == -1);
  CHECK(t.times[2].forward_backend.empty());
  CHECK(contains(t.about, "PyTorch 2.9.0-test"));
  CHECK(contains(t.about, "Test GPU"));
  CHECK(contains(t.about, "CUDA events"));
  CHECK(!contains(t.about, "threads"));
  const SdpaTimes cpu = read_sdpa_reply(
      R"({"ok": true, "torch": "2.9.0-test", "device": "the host CPU", "clock": "a host clock", "threads": 4, "results": [)" +
          kTimed + "]}",
      1, "py");
  CHECK(cpu.about == "PyTorch 2.9.0-test's scaled_dot_product_attention on the host CPU (a host clock) with 4 threads");
}

TEST_CASE("read_sdpa_reply: a reply that is not the expected one is one sentence naming the interpreter, no times") {
  struct Bad {
    std::string reply, says;
  };
  const std::vector<Bad> bad{
      {"", "printed no reply"},
      {"Traceback (most recent call last):\n", "is not JSON"},
      {"{\"ok\": true, \"results\": [", "is not JSON"},
      {R"j({"ok": false, "error": "cannot import torch (ModuleNotFoundError: No module named 'torch')"})j",
       "`py` cannot import torch (ModuleNotFoundError: No module named 'torch')"},
      {R"({"ok": false})", "failed in the SDPA timer without saying why"},
      {R"({"ok": false, "error": "says\nno more"})", "`py` says no more"},
      {R"([1, 2])", "not an object with \"ok\""},
      {R"({"ok": true})", "has no list of results"},
      {ok_reply(kTimed), "has 1 results for 2 problems"},
      {ok_reply(kTimed + R"(, {"forward_ms": -3})"), "forward_ms is -3"},
      {ok_reply(kTimed + R"(, {"forward_ms": "fast"})"), "not a time in milliseconds"},
      {ok_reply(kTimed + R"(, {"forward_ms": 1, "note": 7})"), "note is 7, not text"},
      {ok_reply(kTimed + R"(, 3)"), "a result is not an object"},
  };
  for (const Bad& b : bad) {
    INFO("reply: " << b.reply);
    const SdpaTimes t = read_sdpa_reply(b.reply, 2, "py");
    CHECK(t.times.empty());
    CHECK(contains(t.why_not, "`py`"));
    CHECK(contains(t.why_not, b.says));
    CHECK(t.why_not.find('\n') == std::string::npos);
  }
}

TEST_CASE("run_child gives the child its stdin and returns its stdout, stderr and exit status") {
  const ChildRun run = run_child({"/bin/sh", "-c", "read line; echo \"got $line\"; echo warned >&2; exit 3"}, "hello\n");
  CHECK(run.out == "got hello\n");
  CHECK(run.err == "warned\n");
  CHECK(run.exit_status == 3);
  CHECK(run.signal == 0);
  // Found on PATH, and a child that never reads its input is no harm to the parent.
  const ChildRun quiet = run_child({"sh", "-c", "exit 0"}, std::string(1 << 20, 'x'));
  CHECK(quiet.exit_status == 0);
  CHECK(quiet.out.empty());
  const ChildRun killed = run_child({"/bin/sh", "-c", "kill -9 $$"}, "");
  CHECK(killed.signal == 9);
  CHECK(killed.exit_status == -1);
  CHECK_THROWS_WITH_AS(run_child({"/no/such/interpreter"}, ""), doctest::Contains("cannot start `/no/such/interpreter`"),
                       std::runtime_error);
}

TEST_CASE("run_child stops a child that does not answer within its time, and lets one that does finish") {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(run_child({"/bin/sh", "-c", "echo partial; exec sleep 30"}, "", 1),
                       doctest::Contains("`/bin/sh` gave no answer within 1 s and was stopped"), std::runtime_error);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited < 20);  // killed near its deadline, not reaped only when the child ends after 30 s
  const ChildRun quick = run_child({"/bin/sh", "-c", "sleep 0.2; echo done"}, "", 5);
  CHECK(quick.out == "done\n");
  CHECK(quick.exit_status == 0);
}

TEST_CASE("time_sdpa against fake interpreters: the timer's path and request go in, its times or one sentence come out") {
  TempDir dir;
  const std::string timer = dir.script("timer.py", "");  // the fake interpreters never read it
  const std::string request_file = (dir.path / "request.json").string();
  const std::vector<SdpaProblem> problems{problem(128, CausalAlign::None, DType::F32, true),
                                          problem(128, CausalAlign::TopLeft, DType::F32, true)};

  SUBCASE("a reply with times") {
    const std::string python = dir.script(
        "python-ok", "[ \"$1\" = '" + timer + "' ] || { echo \"timer not given: $1\" >&2; exit 9; }\ncat > '" +
                         request_file + "'\necho '" + ok_reply(kTimed + "," + kTimed) + "'\n");
    const SdpaTimes t = time_sdpa(python, problems, Device::Cpu, timer);
    INFO("why not: " << t.why_not);
    REQUIRE(t.why_not.empty());
    REQUIRE(t.times.size() == 2);
    CHECK(t.times[1].forward_ms == 0.5);
    std::ifstream in(request_file);
    const nlohmann::json request = nlohmann::json::parse(in);
    CHECK(request["device"] == "cpu");
    CHECK(request["problems"].size() == 2);
    CHECK(request["problems"][1]["causal"] == "top-left");
  }
  SUBCASE("an interpreter that fails: its status and the last line it wrote on stderr") {
    const std::string python = dir.script(
        "python-fails", "echo 'Traceback (most recent call last):' >&2\necho 'RuntimeError: planted failure' >&2\nexit 1\n");
    const SdpaTimes t = time_sdpa(python, problems, Device::Cuda, timer);
    CHECK(t.times.empty());
    CHECK(t.why_not == "`" + python + "` exited with status 1 running the SDPA timer: RuntimeError: planted failure");
  }
  SUBCASE("an interpreter that prints garbage") {
    const std::string python = dir.script("python-garbage", "echo 'this is not json'\n");
    const SdpaTimes t = time_sdpa(python, problems, Device::Cuda, timer);
    CHECK(t.times.empty());
    CHECK(contains(t.why_not, "its reply is not JSON: this is not json"));
  }
  SUBCASE("an interpreter ended by a signal") {
    const std::string python = dir.script("python-crashes", "kill -SEGV $$\n");
    const SdpaTimes t = time_sdpa(python, problems, Device::Cuda, timer);
    CHECK(t.times.empty());
    CHECK(contains(t.why_not, "was ended by signal 11"));
  }
  SUBCASE("no such interpreter") {
    const SdpaTimes t = time_sdpa("no-such-python-for-flashlab", problems, Device::Cuda, timer);
    CHECK(t.times.empty());
    CHECK(contains(t.why_not, "cannot start `no-such-python-for-flashlab` (No such file or directory)"));
    CHECK(contains(t.why_not, "--python names the interpreter that has PyTorch"));
  }
  SUBCASE("no timer where the build put it") {
    const SdpaTimes t = time_sdpa("sh", problems, Device::Cuda, (dir.path / "moved.py").string());
    CHECK(t.times.empty());
    CHECK(contains(t.why_not, "moved.py is missing"));
  }
}

TEST_CASE("time_sdpa with the real timer, where torch does not import: the timer's own sentence") {
  // A `torch` package that raises on import, first on PYTHONPATH: the same reply with PyTorch installed or not.
  TempDir dir;
  std::filesystem::create_directory(dir.path / "torch");
  std::ofstream(dir.path / "torch" / "__init__.py") << "raise ImportError('planted by test_sdpa_child')\n";
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old ? old : "";
  setenv("PYTHONPATH", dir.path.c_str(), 1);
  const SdpaTimes t = time_sdpa("python3", {problem(128, CausalAlign::None, DType::BF16, false)}, Device::Cuda);
  if (old) setenv("PYTHONPATH", saved.c_str(), 1);
  else unsetenv("PYTHONPATH");
  CHECK(t.times.empty());
  CHECK(t.why_not == "`python3` cannot import torch (ImportError: planted by test_sdpa_child); --python names an "
                     "interpreter that has PyTorch");
}
