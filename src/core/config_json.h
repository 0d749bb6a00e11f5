// ModelConfig and the tokenizer settings as JSON, so a checkpoint carries everything needed to
// rebuild its model (`megatron generate --load DIR` takes no model flags).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "core/config.h"

namespace megatron {

nlohmann::json model_config_to_json(const ModelConfig& model);
ModelConfig model_config_from_json(const nlohmann::json& j);  // UserError on a missing key

nlohmann::json tokenizer_config_to_json(const DataConfig& data);
void tokenizer_config_from_json(const nlohmann::json& j, DataConfig& data);

}  // namespace megatron
