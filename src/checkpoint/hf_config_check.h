// A Hugging Face config.json, or a native checkpoint's state.json, checked before and after its
// model configuration is read, so a damaged or hand-edited file is an error naming the file and
// field, never a crash (zero attention heads divided by), an internal JSON type error, or a model
// too large to address.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/config.h"

namespace megatron {

// Every field the families read, where present: of the JSON type it must be (integers that fit
// 32 bits, finite numbers, booleans, strings, objects), in its range (sizes and counts
// positive, epsilons and bases above zero); rope_scaling / rope_parameters likewise.
void check_hf_config_fields(const nlohmann::json& config, const std::string& path);

// The model read from it: a whole number of heads per key/value group, a head size, top-k
// within the experts, and every weight's rows x columns within 64-bit arithmetic.
void check_hf_model_sizes(const ModelConfig& model, const std::string& path);

// A native checkpoint's record of its model (state.json's "model_config"), likewise: every
// field's JSON type and range before it is read, then the model read from it (its names and
// kinds, one MoE entry per layer, a layer count any model has, and the sizes above).
void check_saved_model_fields(const nlohmann::json& model_config, const std::string& path);
void check_saved_model(const ModelConfig& model, const std::string& path);

}  // namespace megatron
