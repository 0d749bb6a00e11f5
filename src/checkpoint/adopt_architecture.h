// A run whose model comes from a saved one rather than its flags: `--load-hf DIR` (config.json)
// and Megatron's `--use-checkpoint-args` (a megatron.cpp checkpoint's state.json).
#pragma once

#include <string>

#include "core/config.h"

namespace megatron {

// Puts the architecture of `saved` (read from `source`) in place of the flags'. A model flag
// given explicitly that disagrees with it is a UserError naming both values, `source` and `via`
// (the flag that asked for this). What the saved model does not decide stays the run's own:
// fused kernels, activation recomputation, how MoE layers balance, drop and dispatch tokens, the
// vocabulary's padding rule and size flag, the initialisation, and the sequence length and
// dropouts when given. Returns the configuration the flags gave, for what the caller keeps.
ModelConfig adopt_architecture(Config& config, const ModelConfig& saved, const std::string& source, const std::string& via);

// Megatron's --use-checkpoint-args for a megatron.cpp checkpoint: the architecture recorded by the
// checkpoint --load names (--ckpt-step's, else the latest), with its tokenizer unless
// --tokenizer-type / --tokenizer-model are given. Without a checkpoint there, a notice and the
// flags' model, as Megatron (--exit-on-missing-checkpoint refuses that later). UserError without
// --load, with --load-hf, or for a damaged state.json.
void adopt_checkpoint_args(Config& config);

}  // namespace megatron
