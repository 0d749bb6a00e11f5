#include <cstdio>

#include "cli/commands.h"
#include "checkpoint/hf_mapping.h"
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
  if (!config.train.load_hf.empty()) adopt_hf_architecture(config);
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  finalize_config(config, env.world_size);
  return run_training(config, env);
}

}  // namespace megatron::cli
