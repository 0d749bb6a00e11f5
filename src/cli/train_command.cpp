#include <cstdio>

#include "cli/commands.h"
#include "core/arguments.h"
#include "train/trainer.h"

namespace megatron::cli {

int train(const Args& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(train_help().c_str(), stdout);
      return 0;
    }
  }
  Config config = parse_train_arguments(args);
  finalize_config(config, /*world_size=*/1);
  return run_training(config);
}

}  // namespace megatron::cli
