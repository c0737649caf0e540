// flashlab ring --gpus P: ring attention over NCCL, one process per GPU (registry/ring.hpp, cuda/ring_nccl.hpp).
// The command as typed is the launcher: it checks the problem once (so a refusal is one sentence, not P), makes
// the ring's NCCL id, and starts P copies of this same executable (/proc/self/exe) with the same flags, each
// told its rank and the id through the environment (FLASHLAB_RING_RANK, FLASHLAB_RING_ID), with
// NCCL_NVLS_ENABLE=0 (NVLink multicast off, as multi-GPU hosts here require). Then it waits for them; if one
// fails, it stops the others, which would otherwise wait in NCCL for it. Rank 0 prints the results.
//
// Under a cluster launcher (torchrun, Slurm's srun; rendezvous.hpp) the launcher starts the ranks, on as many nodes
// as it likes, and each process is one rank: rank 0 makes the id and the seed and hands them to the others over
// TCP at MASTER_ADDR, each rank runs on its node's GPU LOCAL_RANK (SLURM_LOCALID), and the connections stay open so
// that a rank which fails stops the others instead of leaving them waiting in NCCL.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <iostream>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.hpp"
#include "core/flops.hpp"
#include "model/ring_timeline.hpp"
#include "registry/ring.hpp"
#include "cli/rendezvous.hpp"

extern char** environ;

namespace flashlab::cli {
namespace {

constexpr const char* kRankEnv = "FLASHLAB_RING_RANK";
constexpr const char* kIdEnv = "FLASHLAB_RING_ID";

// Starts the ranks and waits for them; returns the exit code the command ends with.
int launch(const std::vector<std::string>& args, int ranks, const std::string& id, std::ostream& err) {
  // argv and each rank's environment, made before fork: the child only calls execve.
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    if (var.rfind(std::string(kRankEnv) + "=", 0) == 0 || var.rfind(std::string(kIdEnv) + "=", 0) == 0 ||
        var.rfind("NCCL_NVLS_ENABLE=", 0) == 0)
      continue;
    inherited.push_back(var);
  }
  std::vector<std::vector<std::string>> envs(ranks, inherited);
  std::vector<std::vector<char*>> envps(ranks);
  for (int r = 0; r < ranks; ++r) {
    envs[r].push_back(std::string(kRankEnv) + "=" + std::to_string(r));
    envs[r].push_back(std::string(kIdEnv) + "=" + id);
    envs[r].push_back("NCCL_NVLS_ENABLE=0");
    for (std::string& s : envs[r]) envps[r].push_back(s.data());
    envps[r].push_back(nullptr);
  }
  std::vector<pid_t> pids;
  std::cout.flush();
  std::cerr.flush();
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGTERM);
      throw std::runtime_error("fork failed while starting rank " + std::to_string(r));
    }
    if (pid == 0) {
      execve("/proc/self/exe", argv.data(), envps[r].data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  int code = kExitOk, running = ranks;
  bool stopped_others = false;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    const auto it = std::find(pids.begin(), pids.end(), pid);
    if (it == pids.end()) continue;
    --running;
    const int r = int(it - pids.begin());
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok) continue;
    if (WIFSIGNALED(status)) {
      if (!stopped_others) err << "flashlab: rank " << r << " was killed by signal " << WTERMSIG(status) << "\n";
      code = std::max(code, kExitCheckFailed);
    } else {
      if (WEXITSTATUS(status) == 127)
        err << "flashlab: rank " << r << " could not be started (execve of /proc/self/exe)\n";
      code = std::max(code, WEXITSTATUS(status) == kExitCheckFailed ? kExitCheckFailed : kExitBadInput);
    }
    if (!stopped_others && running > 0) {  // the others would wait in NCCL for this one
      stopped_others = true;
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (int(i) != r) kill(pids[i], SIGTERM);
    }
  }
  return code;
}

// How long a rank under a cluster launcher waits for the others to meet (rank 0) or for rank 0 to listen (the
// others): the launcher starts them within seconds of each other.
constexpr std::chrono::seconds kRendezvousTimeout{60};

// A rank started by a cluster launcher: sets its GPU and rank, and meets the others through rank 0, which makes the
// ring's NCCL id and the seed of the random inputs (`seed` when --seed was given) and hands them out. From here on
// the connections watch the run: a rank that ends before it finished ends this one, with one sentence.
RingRendezvous join_cluster_ring(const RingPlacement& at, RingRankRequest& q, std::optional<std::uint64_t> seed,
                                 bool backward, const std::string& blocks) {
  // Not built with CUDA and NCCL, or no GPU on this node: every rank refuses alike, before anyone waits.
  if (cuda_device_count() == 0) {
    check_nccl_ring(q.layout, 1, q.problem, q.dtype, backward, blocks);
    throw InputError("rank " + std::to_string(at.rank) + " sees no CUDA GPU on its node");
  }
  // The multi-GPU hosts here need NVLink multicast off; under a launcher the environment is the user's, so only
  // when they left it unset. Before NCCL starts, which reads it once.
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  q.rank = at.rank;
  q.device = at.local_rank;

  std::optional<RingRendezvous> met;
  if (at.rank == 0) {
    q.problem.options.seed = seed ? *seed : fresh_seed();
    met = serve_ring_id("", at.port, at.world_size, at.job,
                        new_nccl_ring_id() + " " + std::to_string(q.problem.options.seed), kRendezvousTimeout);
  } else {
    met = fetch_ring_id(at.master_addr, at.port, at.rank, at.world_size, at.job, kRendezvousTimeout);
  }
  // "<id> <seed>"
  const std::string& payload = met->payload();
  const std::size_t space = payload.find(' ');
  q.nccl_id = payload.substr(0, space);
  std::uint64_t shared_seed = 0;
  const char* end = payload.data() + payload.size();
  if (space == std::string::npos ||
      std::from_chars(payload.data() + space + 1, end, shared_seed).ptr != end)
    throw InputError("rank 0 sent rank " + std::to_string(at.rank) + " no seed after the ring's id: are all ranks "
                     "the same flashlab?");
  q.problem.options.seed = shared_seed;
  met->watch([](const std::string& why) {  // on the watcher's thread, maybe while NCCL waits: end the process
    const std::string line = "flashlab: " + why + "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
    ::_exit(kExitBadInput);
  });

  // After the watch, so the others learn at once that this rank cannot run.
  const int visible = cuda_device_count();
  if (at.local_rank >= visible)
    throw InputError("rank " + std::to_string(at.rank) + " is local rank " + std::to_string(at.local_rank) + " (" +
                     (at.launcher == RingLauncher::Slurm ? "SLURM_LOCALID" : "LOCAL_RANK") + ") but its node shows " +
                     std::to_string(visible) + (visible == 1 ? " GPU" : " GPUs") + ": start at most " +
                     std::to_string(visible) + " ranks per node, one per GPU (" +
                     (at.launcher == RingLauncher::Slurm ? "srun --ntasks-per-node" : "torchrun --nproc_per_node") +
                     "), each process seeing all of the node's GPUs");
  return std::move(*met);
}

}  // namespace

void RingCommand::add_to(CLI::App& app) {
  app.add_option("--gpus", gpus,
                 "ranks P, one process per GPU (GPUs 0 .. P-1); under torchrun or srun, the number of processes it "
                 "starts, each on its node's GPU LOCAL_RANK / SLURM_LOCALID")
      ->required();
  app.footer("Started as is, it starts its P ranks on this host. Under torchrun (--no-python) or srun each process is "
             "one rank, on as many nodes as the launcher spans: rank 0 hands the others the NCCL id over TCP at "
             "MASTER_ADDR, port MASTER_PORT + 1 under torchrun (its agent holds MASTER_PORT), MASTER_PORT under srun "
             "(export both), or FLASHLAB_RING_PORT.");
  app.add_option("--layout", layout, "contiguous, zigzag or striped")->capture_default_str();
  shape.add_to(app);
  app.add_option("--causal", causal, "none, top-left or bottom-right")->capture_default_str();
  app.add_option("--dtype", dtype, "f16 or bf16")->capture_default_str();
  app.add_option("--blocks", blocks, "the block kernel: cuda-fa3-ws (Hopper) or cuda-fa2")->capture_default_str();
  app.add_flag("--backward", backward, "also the backward pass");
  app.add_flag("--check", check,
               "one run on random inputs, checked against naive attention in double as `flashlab check` checks "
               "(small problems), instead of timed runs");
  seed_option = app.add_option("--seed", seed, "--check's inputs (default: fresh)");
  app.add_option("--warmup", warmup, "untimed runs first")->capture_default_str();
  app.add_option("--iters", iters, "timed runs (the median of the slowest rank is reported)")->capture_default_str();
  app.add_flag("--no-one-shot", no_one_shot,
               "do not time the block kernel on the whole problem on GPU 0 beside the ring");
  app.add_option("--json", json_path, "write the timings as JSON to this file (rank 0)");
  app.add_option("--timeline", timeline_path,
                 "record each rank's spans of the last timed run with CUDA events (block compute, merge, NCCL "
                 "send/recv; one lane per rank and stream) and write them as one Chrome trace to this file (rank 0); "
                 "with --backward the backward's goes beside it, \"-backward\" before \".json\"")
      ->type_name("FILE.json");
}

int RingCommand::run(std::ostream& out, std::ostream& err) const {
  RingRankRequest q;
  q.ranks = gpus;
  if (gpus < 1) throw InputError("--gpus takes the number of ranks P, at least 1, not " + std::to_string(gpus));
  q.layout = parse_ring_layout(layout);
  q.problem.shape = shape.shape();
  q.problem.options.causal = parse_causal(causal);
  q.dtype = parse_dtype(dtype);
  if (q.dtype != DType::F16 && q.dtype != DType::BF16)
    throw InputError("flashlab ring takes f16 or bf16 (its block kernels' dtypes), not " + dtype);
  check_ring_block_kernel(blocks);
  q.blocks = blocks;
  q.backward = backward;
  q.check = check;
  q.warmup = warmup;
  q.iters = iters;
  q.one_shot = !no_one_shot;
  q.timeline = !timeline_path.empty();
  if (warmup < 0 || iters < 1) throw InputError("--warmup must be >= 0 and --iters >= 1");
  if (check && !json_path.empty())
    throw InputError("--json writes timings, and --check times nothing: give one of them");
  if (check && !timeline_path.empty())
    throw InputError("--timeline records timed runs, and --check times nothing: give one of them");

  const char* rank_text = std::getenv(kRankEnv);
  const RingPlacement placement = rank_text ? RingPlacement{} : ring_placement(process_environment(), gpus);
  if (rank_text == nullptr && placement.launcher == RingLauncher::None) {  // the launcher
    q.problem.options.seed = seed_option->count() > 0 ? seed : fresh_seed();
    validate(q.problem);
    ring_schedule(q.layout, gpus, q.problem.shape.seq_q, q.problem.shape.seq_k, q.problem.options.causal);
    check_nccl_ring(q.layout, gpus, q.problem, q.dtype, backward, blocks);
    if (check) require_reference_memory(q.problem, backward);  // once, not in every rank
    std::vector<std::string> args = argv;
    args[0] = "flashlab";
    if (seed_option->count() == 0) args.insert(args.end(), {"--seed", std::to_string(q.problem.options.seed)});
    return launch(args, gpus, new_nccl_ring_id(), err);
  }

  // A rank: started by the launcher above, or by a cluster's.
  std::optional<RingRendezvous> cluster;
  if (rank_text != nullptr) {
    q.rank = std::atoi(rank_text);
    const char* id = std::getenv(kIdEnv);
    if (id == nullptr)
      throw InputError(std::string(kRankEnv) + " is set but " + kIdEnv +
                       " is not: start the ring with `flashlab ring`");
    q.nccl_id = id;
    q.problem.options.seed = seed;
    validate(q.problem);
  } else {
    validate(q.problem);  // every rank refuses a bad problem alike, before meeting the others
    ring_schedule(q.layout, gpus, q.problem.shape.seq_q, q.problem.shape.seq_k, q.problem.options.causal);
    cluster = join_cluster_ring(placement, q, seed_option->count() > 0 ? std::optional(seed) : std::nullopt,
                                backward, blocks);
  }
  const RingRankReport report = run_ring_rank(q);
  if (cluster) cluster->finish();
  if (q.rank != 0) return kExitOk;

  const Shape& s = q.problem.shape;
  out << "flashlab ring: " << gpus << (gpus == 1 ? " rank" : " ranks") << " over NCCL, one GPU each ("
      << cuda_device_name() << "), layout " << layout << ", " << blocks << " blocks, " << describe(s) << ", causal " << to_string(q.problem.options.causal) << ", "
      << to_string(q.dtype) << "\n";
  if (check) {
    out << "seed " << q.problem.options.seed << " (repeat with --seed " << q.problem.options.seed
        << "); reference: naive attention in double on the inputs rounded to " << to_string(q.dtype) << "\n\n";
    print_check_table(out, *report.check);
    return report.check->failed ? kExitCheckFailed : kExitOk;
  }
  out << "median of " << iters << " after " << warmup << " warm-up, each pass's slowest rank; efficiency: the ring's "
      << "rate over " << gpus << " x " << blocks << "'s rate on the whole problem, alone on GPU 0\n\n";
  const CausalAlign causal_align = q.problem.options.causal;
  const double fwd_flops = forward_flops(s, causal_align), bwd_flops = backward_flops(s, causal_align);
  const auto efficiency = [&](double one_ms, double ring_ms) { return one_ms > 0 ? one_ms / (gpus * ring_ms) : -1.0; };
  Table table({"pass", "ring ms", "ring TFLOP/s", "one-shot ms", "efficiency"});
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  const auto add = [&](const char* pass, double ring_ms, double flops, double one_ms) {
    table.add({pass, format_fixed(ring_ms, 3), format_fixed(tflops(flops, ring_ms), 1),
               one_ms > 0 ? format_fixed(one_ms, 3) : "-",
               one_ms > 0 ? format_fixed(efficiency(one_ms, ring_ms), 3) : "-"});
    rows.push_back({{"pass", pass}, {"ring_ms", ring_ms}, {"ring_tflops", tflops(flops, ring_ms)},
                    {"one_shot_ms", one_ms}, {"efficiency", efficiency(one_ms, ring_ms)}});
  };
  add("forward", report.forward_ms, fwd_flops, report.one_shot ? report.one_shot->forward_ms : -1);
  if (backward) add("backward", report.backward_ms, bwd_flops, report.one_shot ? report.one_shot->backward_ms : -1);
  table.print(out);
  if (!report.one_shot_skipped.empty()) out << "\none-shot skipped: " << report.one_shot_skipped << "\n";
  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["device"] = cuda_device_name();
    j["command"] = join(argv, " ");
    j["date"] = utc_now();
    j["settings"] = {{"ranks", gpus},      {"transport", "NCCL, one process per GPU"}, {"layout", layout},
                     {"block_kernel", blocks},
                     {"batch", s.batch},   {"heads", s.heads_q},  {"heads_kv", s.heads_kv},
                     {"seq_q", s.seq_q},   {"seq_k", s.seq_k},    {"head_dim", s.head_dim},
                     {"causal", to_string(q.problem.options.causal)}, {"dtype", to_string(q.dtype)},
                     {"warmup", warmup},   {"iters", iters}};
    j["notes"] = "ring_ms: median over the timed runs of the slowest rank's pass (host clock around a whole pass, each "
                 "run after a barrier). one_shot_ms: the block kernel on the whole problem alone on GPU 0 (CUDA events). "
                 "efficiency: one_shot_ms / (ranks x ring_ms)";
    if (!report.one_shot_skipped.empty()) j["one_shot_skipped"] = report.one_shot_skipped;
    j["rows"] = rows;
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    if (!f) throw InputError("cannot write the JSON results to '" + json_path + "'");
    out << "\nwrote " << json_path << "\n";
  }
  // The timelines: the forward's at the path given, the backward's beside it (ring_timeline_path).
  const auto write_timeline = [&](const std::optional<Timeline>& t, Pass pass) {
    if (!t) return;
    const std::string path = ring_timeline_path(timeline_path, pass);
    std::ofstream f(path);
    if (f) write_trace_event_json(*t, f);
    if (!f) throw InputError("cannot write the ring's timeline to '" + path + "'");
    out << (pass == Pass::Forward ? "\n" : "") << "wrote " << path << " (the " << t->info.at("pass")
        << "'s spans of every rank, last timed run)\n";
  };
  write_timeline(report.forward_timeline, Pass::Forward);
  write_timeline(report.backward_timeline, Pass::Backward);
  (void)err;
  return kExitOk;
}

}  // namespace flashlab::cli
