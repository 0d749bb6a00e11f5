// A Megatron-LM run's arguments (the argparse.Namespace its checkpoints pickle as "args") read as
// the ModelConfig of the model they built: `megatron convert --from megatron`.
#pragma once

#include <string>

#include "checkpoint/pickle.h"
#include "core/config.h"

namespace megatron {

// The ModelConfig of a Megatron run's arguments: dense GPT models (Llama, Qwen, Mistral, GPT),
// mixtures of experts (--num-experts and the --moe-* flags that shape the model or its routing),
// DeepSeek's multi-latent attention and multi-token prediction. UserError naming `what` and the
// argument for a value out of place. Speed choices (grouped GEMM, dispatcher, fusions) keep this
// project's defaults: they do not change the weights or the model's outputs.
ModelConfig model_config_from_megatron_args(const pickle::Value& args, const std::string& what);

// The run's integer argument `name` (a bool reads as 0/1), `fallback` when `args` is null or the
// argument absent or None; UserError naming `what` and the argument when it holds another type.
int64_t megatron_int_arg(const pickle::Value* args, const char* name, int64_t fallback, const std::string& what);

}  // namespace megatron
