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

}  // namespace megatron
