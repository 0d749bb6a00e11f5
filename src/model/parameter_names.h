// Names of the parameters other code treats specially, as Megatron-Core names them.
#pragma once

#include <string>

namespace megatron {

// The input embedding; with tied embeddings also the output layer's weight (and, under pipeline
// parallelism, a copy on the last stage).
inline constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";
// The untied output layer.
inline constexpr const char* kOutputLayer = "output_layer.weight";

// Whether `name` is the weight (gamma) of a norm: a norm module's ("input_layernorm.weight",
// "q_layernorm.weight", MTP's "enorm.weight", ...) or one held by the linear after it
// ("linear_qkv.layer_norm_weight").
inline bool is_norm_weight(const std::string& name) {
  auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("layer_norm_weight") || ends_with("norm.weight");
}

}  // namespace megatron
