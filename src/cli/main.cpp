// build/bin/flashlab: a thin main; everything is in the flashlab_cli library (cli.hpp).
#include <iostream>

#include "cli/cli.hpp"

int main(int argc, char** argv) { return flashlab::run_cli(argc, argv, std::cout, std::cerr); }
