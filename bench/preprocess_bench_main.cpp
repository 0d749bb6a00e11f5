// A LibTorch-free `megatron preprocess` for bench/preprocess_bench.sh: the same command code
// (src/cli/preprocess_command.cpp), so the benchmark builds in seconds with plain g++ on a
// machine without the project's full build.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/errors.h"

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "preprocess") {
    std::fprintf(stderr, "usage: %s preprocess [flags]\n", argv[0]);
    return 2;
  }
  try {
    return megatron::cli::preprocess(megatron::cli::Args(argv + 2, argv + argc));
  } catch (const megatron::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
