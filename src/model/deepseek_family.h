// The DeepSeek family built in (deepseek_family.cpp): DeepSeek-V2 / V2-Lite and DeepSeek-V3 /
// Moonlight in one record (the HF model_type says which).
#pragma once

#include "model/family.h"

namespace megatron {

ModelFamily deepseek_family();

}  // namespace megatron
