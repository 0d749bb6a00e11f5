// `megatron eval`: the loss and perplexity of a checkpoint on the validation and test splits.
// It takes `megatron train`'s flags (the same recipe, data and parallel layout the run trained
// with) and a checkpoint, builds the model as training would, and scores the first --eval-iters
// global batches of each split instead of training: every checkpoint is measured on the same
// batches. Runs under `megatron launch` like training.
#include <cstdio>

#include "checkpoint/hf_mapping.h"
#include "cli/commands.h"
#include "core/arguments.h"
#include "core/errors.h"
#include "train/trainer.h"

namespace megatron::cli {

int eval(const Args& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs("usage: megatron eval --load DIR | --load-hf DIR [--config recipe.yaml] [train flags]\n\n"
                 "Prints the validation and test loss (and perplexity) of a checkpoint over the first\n"
                 "--eval-iters global batches of each split, in Megatron's validation format. It takes\n"
                 "`megatron train`'s flags: give those the run trained with (model, data, --split,\n"
                 "--train-iters, --eval-interval and the parallel layout), so that the splits are the\n"
                 "run's. Nothing is trained or saved.\n",
                 stdout);
      return 0;
    }
  }
  Config config = parse_train_arguments(args);
  if (config.train.load.empty() && config.train.load_hf.empty()) {
    throw UserError("megatron eval needs the weights to evaluate: --load DIR (a megatron.cpp checkpoint) or "
                    "--load-hf DIR (a Hugging Face model)");
  }
  if (!config.train.save.empty() || !config.train.save_hf.empty()) {
    throw UserError("megatron eval trains nothing and saves nothing: drop --save / --save-hf");
  }
  // The optimizer is built but never steps: a run's recipe may give --lr, a bare HF model need not,
  // and only the weights are read (a converted, weights-only checkpoint loads as a full one does).
  if (config.train.lr <= 0.0) config.train.lr = 1.0;
  config.train.no_load_optim = true;
  config.train.no_load_rng = true;
  if (!config.train.load_hf.empty()) adopt_hf_architecture(config);
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  finalize_config(config, env.world_size);
  return run_training(config, env, RunMode::Evaluate);
}

}  // namespace megatron::cli
