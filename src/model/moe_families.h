// The mixture-of-experts families built in (moe_families.cpp): Mixtral, and Qwen2-MoE /
// Qwen3-MoE in one record (the HF model_type says which).
#pragma once

#include "model/family.h"

namespace megatron {

ModelFamily mixtral_family();
ModelFamily qwen_moe_family();

// FLOPs per token of an MoE model of `parameters` (counted as Megatron does): 6 per parameter a
// token meets, the experts it is not routed to left out, plus causal attention over heads x head
// dims (MLA's query/key and value dims where it has them).
double moe_flops_per_token(const ModelConfig& model, int64_t parameters);

// The weight-table rows of an MoE layer whose HF block is `model.layers.{layer}.<hf_moe>`: the
// pre-MLP norm, the router (`gate`) and each expert's [gate; up] and down projections under the
// HF names given (Mixtral's w1 / w3 / w2, the others' gate_proj / up_proj / down_proj).
std::vector<HfWeightRule> moe_expert_rows(const std::string& hf_moe, const char* gate, const char* up, const char* down);

}  // namespace megatron
