// `megatron train` and `megatron eval`: the two ways into the trainer. Both take train's flags;
// eval (and train --skip-train, Megatron's way of asking for it) builds the model and loads the
// weights as a run would, then scores the validation and test splits instead of training (the
// first --eval-iters global batches of each, so every checkpoint is measured on the same
// batches). Both run under `megatron launch`.
#include <algorithm>
#include <cstdio>

#include "checkpoint/adopt_architecture.h"
#include "checkpoint/hf_mapping.h"
#include "cli/commands.h"
#include "train/arguments.h"
#include "core/errors.h"
#include "train/trainer.h"

namespace megatron::cli {
namespace {

bool asks_for_help(const Args& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

// The parsed flags, with the architecture of a --load-hf model or (--use-checkpoint-args) of the
// --load checkpoint, finalized for this launch.
int run_trainer(Config config, RunMode mode, const ModelFamily* family = nullptr) {
  if (family != nullptr) config.model.family = family;
  if (config.train.use_checkpoint_args) adopt_checkpoint_args(config);
  if (!config.train.load_hf.empty()) adopt_hf_architecture(config);
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  finalize_config(config, env.world_size);  // may add notices of its own
  if (env.rank == 0) {
    for (const auto& notice : config.flag_notices) std::printf("> note: %s\n", notice.c_str());
  }
  return run_training(config, env, mode);
}

// `megatron eval`, and `megatron train --skip-train` (`who`): the checkpoint's validation and
// test loss, nothing trained or saved.
int evaluate(Config config, const std::string& who, const ModelFamily* family = nullptr) {
  if (config.train.load.empty() && config.train.load_hf.empty()) {
    throw UserError(who + " needs the weights to evaluate: --load DIR (a megatron.cpp checkpoint) or "
                          "--load-hf DIR (a Hugging Face model)");
  }
  // No optimizer is built: a run's recipe may give --lr, a bare HF model need not, and only the
  // weights are read (a converted, weights-only checkpoint loads as a full one does).
  if (config.train.lr <= 0.0) config.train.lr = 1.0;
  config.train.no_load_optim = true;
  config.train.no_load_rng = true;
  return run_trainer(std::move(config), RunMode::Evaluate, family);
}

// A training run, or under Megatron's --skip-train the evaluation it would end with.
int train_or_evaluate(Config config, const ModelFamily* family = nullptr) {
  if (!config.train.skip_train) return run_trainer(std::move(config), RunMode::Train, family);
  if (!config.train.save.empty() || !config.train.save_hf.empty()) {
    // Megatron too saves nothing when it skips training.
    config.flag_notices.push_back("--skip-train: nothing is trained, so --save / --save-hf write nothing");
    config.train.save.clear();
    config.train.save_hf.clear();
  }
  return evaluate(std::move(config), "--skip-train", family);
}

}  // namespace

int train(const Args& args) {
  if (asks_for_help(args)) {
    std::fputs(train_help().c_str(), stdout);
    return 0;
  }
  if (args.empty()) {
    std::fputs("usage: megatron train [--config recipe.yaml] [--model-family NAME] [Megatron-LM flags]\n"
               "e.g.   megatron train --config examples/tiny_cpu.yaml --mock-data\n"
               "       torchrun --nproc-per-node 8 --no-python megatron pretrain_gpt.py ARGS   (a Megatron launch line)\n"
               "megatron train --help lists every flag.\n",
               stderr);
    return 2;
  }
  return train_or_evaluate(parse_train_arguments(args));
}

int train_as(const ModelFamily& family, const Args& args) {
  if (asks_for_help(args)) return train(args);
  return train_or_evaluate(parse_train_arguments(args), &family);
}

int eval(const Args& args) {
  if (std::find(args.begin(), args.end(), "--task") != args.end()) return eval_task(args);
  if (asks_for_help(args)) {
    std::fputs("usage: megatron eval --load DIR | --load-hf DIR [--config recipe.yaml] [train flags]\n\n"
               "Prints the validation and test loss (and perplexity) of a checkpoint over the first\n"
               "--eval-iters global batches of each split, in Megatron's validation format. It takes\n"
               "`megatron train`'s flags: give those the run trained with (model, data, --split,\n"
               "--train-iters, --eval-interval and the parallel layout), so that the splits are the\n"
               "run's. Nothing is trained or saved.\n\n"
               "megatron eval --task FILE.jsonl --help: benchmark scores (MMLU, ARC, HellaSwag, C-Eval,\n"
               "GSM8K, ...) by lm-evaluation-harness's rules.\n",
               stdout);
    return 0;
  }
  Config config = parse_train_arguments(args);
  if (!config.train.save.empty() || !config.train.save_hf.empty()) {
    throw UserError("megatron eval trains nothing and saves nothing: drop --save / --save-hf");
  }
  return evaluate(std::move(config), "megatron eval");
}

}  // namespace megatron::cli
