// main() of the GPU suites: with no CUDA device, say so and exit 77, which CTest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "registry/variants.hpp"

int main(int argc, char** argv) {
  if (!flashlab::cuda_device_present()) {
    std::printf("no CUDA device on this machine: GPU tests skipped\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
