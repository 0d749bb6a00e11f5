// Writes a Hugging Face model directory, streaming: config.json, the weights as safetensors
// shards of at most max_shard_bytes (model-0000i-of-0000n.safetensors + model.safetensors.index.json,
// or one model.safetensors), and the tokenizer files of a tokenizer directory. Only the shard being
// filled is held in memory; tensors come one Megatron parameter at a time from `full_tensor`.
// Everything is written under a temporary name and renamed into place when complete.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "core/config.h"

namespace megatron {

struct HfExportOptions {
  int64_t max_shard_bytes = 5000000000;  // transformers' default "5GB"
  std::string config_json;               // an original config.json to write unchanged; "": generate one
  std::string tokenizer_dir;             // copy its tokenizer files; "": none
};

// config.json for `model` (Llama, Qwen2 with qkv bias, Qwen3 with q/k norm) with `hf_vocab` rows.
nlohmann::json hf_config_json(const ModelConfig& model, int64_t hf_vocab, at::ScalarType dtype);

// `full_tensor(name)` returns the whole (TP-unsplit) Megatron parameter `name`.
void save_hf_checkpoint(const std::string& out_dir, const ModelConfig& model, int64_t hf_vocab,
                        const std::function<at::Tensor(const std::string&)>& full_tensor, const HfExportOptions& options);

}  // namespace megatron
