#include <torch/version.h>

#include <cstdio>

#include "cli/commands.h"

namespace megatron::cli {

int version(const Args& args) {
  std::printf("megatron.cpp 0.1.0 (LibTorch %s)\n", TORCH_VERSION);
  return 0;
}

}  // namespace megatron::cli
