// Hugging Face <-> Megatron-Core naming and layout for the Llama family (Llama 2/3/3.1, Qwen2/
// 2.5/3, Mistral): config.json -> ModelConfig, and HF safetensors weights into a GPTModel
// (q/k/v fused per query group into linear_qkv, gate/up stacked into linear_fc1).
#pragma once

#include <string>

#include "core/config.h"

namespace megatron {

class GPTModel;

// Reads <dir>/config.json. The vocabulary is not padded (padded_vocab_size = vocab_size) so
// logits line up with HF's. UserError on a missing file or an unsupported architecture.
ModelConfig model_config_from_hf(const std::string& hf_dir);

// Copies the weights of <dir>/model.safetensors (or the shards named by
// model.safetensors.index.json) into `model`. Every model parameter must be covered and every
// HF tensor used; otherwise UserError naming the tensor.
void load_hf_weights(const std::string& hf_dir, GPTModel& model);

}  // namespace megatron
