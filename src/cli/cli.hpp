#pragma once
// The `flashlab` command as a library, so tests run it in-process: parse argv, run the subcommand,
// print to `out` (results) and `err` (progress, errors). Returns the exit code: 0 success, 1 a check
// failed, 2 bad input (one sentence on `err`, prefixed "flashlab: ").
#include <ostream>
#include <string>
#include <vector>

namespace flashlab {

int run_cli(int argc, char** argv, std::ostream& out, std::ostream& err);
// The same with argv[1..] given as strings (argv[0] is "flashlab").
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace flashlab
