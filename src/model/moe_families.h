// The mixture-of-experts families built in (moe_families.cpp): Mixtral, and Qwen2-MoE /
// Qwen3-MoE in one record (the HF model_type says which).
#pragma once

#include "model/family.h"

namespace megatron {

ModelFamily mixtral_family();
ModelFamily qwen_moe_family();

}  // namespace megatron
