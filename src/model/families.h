// Model-family presets (`--model-family llama3`, or `model-family:` in a recipe): the
// architectural switches a family always uses, so a recipe only states sizes.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron {

// Applies the preset to `model` (throws UserError listing the known names if unknown).
void apply_model_family(const std::string& family, ModelConfig& model);

std::vector<std::string> known_model_families();

}  // namespace megatron
