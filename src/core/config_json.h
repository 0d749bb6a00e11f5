// ModelConfig and the tokenizer settings as JSON, so a checkpoint carries everything needed to
// rebuild its model (`megatron generate --load DIR` takes no model flags).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <vector>

#include "core/config.h"

namespace megatron {

nlohmann::json model_config_to_json(const ModelConfig& model);
ModelConfig model_config_from_json(const nlohmann::json& j);  // UserError on a missing key

// What a JSON field must hold to be read (checkpoint/hf_config_check.cpp checks them).
enum class FieldKind {
  Count,         // an integer >= `least`, within 32 bits
  CountOrNull,   // the same, or null (the family's default)
  Positive,      // a finite number > 0
  NonNegative,   // a finite number >= 0
  Finite,        // any finite number
  Bool,
  String,
  ObjectOrNull,
  CountList,     // a list of integers >= 0
  StringList,    // a non-empty list of strings
};
struct FieldRule {
  const char* key;
  FieldKind kind;
  int64_t least = 1;  // Count / CountOrNull
};

// Every key model_config_to_json writes, with what it must hold: the list that writes and reads
// them, so a new key cannot go unchecked.
std::vector<FieldRule> model_config_rules();

nlohmann::json tokenizer_config_to_json(const DataConfig& data);
void tokenizer_config_from_json(const nlohmann::json& j, DataConfig& data);

}  // namespace megatron
