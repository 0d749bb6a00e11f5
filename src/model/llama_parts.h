// What the Llama record (families.cpp) shares with the families built on its decoder, such as
// the MoE families (moe_families.cpp): the architecture switches, config.json's attention and
// RoPE fields both ways, the attention and embedding rows of the weight table, dense FLOPs.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

#include "model/family.h"

namespace megatron {

double dense_flops_per_token(const ModelConfig& model, int64_t parameters);
// RMSNorm, SwiGLU, RoPE, no linear biases, no dropout, untied output layer.
void llama_like(ModelConfig& model);
ModelConfig llama_config_from_hf(const nlohmann::json& config, const std::string& path);
nlohmann::json llama_config_to_hf(const ModelConfig& model, int64_t hf_vocab, at::ScalarType dtype);
std::vector<HfWeightRule> llama_weights();

}  // namespace megatron
