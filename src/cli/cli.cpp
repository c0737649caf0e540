// The `flashlab` command: six subcommands on one CLI11 app. Errors are one line on stderr,
// "flashlab: <sentence>", and exit code 2; a check that fails exits 1.
#include "cli/cli.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "cli/commands.hpp"

namespace flashlab {

int run_cli(int argc, char** argv, std::ostream& out, std::ostream& err) {
  using namespace cli;
  CLI::App app{"FlashLab: FlashAttention built step by step, every variant checked against naive attention.",
               "flashlab"};
  app.require_subcommand(1);
  CheckCommand check;
  RunCommand run;
  TraceCommand trace;
  BenchCommand bench;
  RingCommand ring;
  VerifyCommand verify;
  check.add_to(
      *app.add_subcommand("check", "run every variant on the same random inputs against naive attention in double"));
  run.add_to(*app.add_subcommand(
      "run",
      "run one variant on .npy inputs (B, S, H, D) and write .npy outputs (bf16 results are written as float32; "
      "--dtype e4m3 runs the FP8 forward on inputs quantized per head)"));
  trace.add_to(*app.add_subcommand("trace", "count an algorithm's HBM <-> SRAM traffic per tensor"));
  bench.add_to(*app.add_subcommand("bench", "time variants against sequence length: time, TFLOP/s, memory, HBM bytes"));
  ring.add_to(*app.add_subcommand(
      "ring", "ring attention over NCCL: the sequence split over P GPUs, one process each, K/V passed round the ring"));
  verify.add_to(*app.add_subcommand(
      "verify", "check your own attention kernel (a plugin, include/flashlab/plugin.h) the way FlashLab checks its own, "
                "and say what the failing cases have in common"));
  for (int n = 0; n < argc; ++n) bench.command_line += (n ? " " : "") + std::string(argv[n]);
  ring.argv.assign(argv, argv + argc);

  // CLI11 would say only "a subcommand is required" for a mistyped command name.
  const std::string first = argc > 1 ? argv[1] : "";
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.push_back(sub->get_name());
  if (!first.empty() && first[0] != '-' && std::find(commands.begin(), commands.end(), first) == commands.end()) {
    err << "flashlab: unknown command '" << first << "': the commands are " << join(commands, ", ") << "\n";
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, out, err);  // --help
    err << "flashlab: " << e.what() << " (see flashlab --help)\n";
    return kExitBadInput;
  }
  try {
    if (app.got_subcommand("check")) return check.run(out, err);
    if (app.got_subcommand("run")) return run.run(out, err);
    if (app.got_subcommand("trace")) return trace.run(out, err);
    if (app.got_subcommand("ring")) return ring.run(out, err);
    if (app.got_subcommand("verify")) return verify.run(out, err);
    return bench.run(out, err);
  } catch (const InputError& e) {
    out.flush();
    err << "flashlab: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    out.flush();
    err << "flashlab: internal error: " << e.what() << "\n";
    return kExitCheckFailed;
  }
}

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<std::string> storage = {"flashlab"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  return run_cli(static_cast<int>(storage.size()), argv.data(), out, err);
}

}  // namespace flashlab
