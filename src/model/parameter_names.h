// Names of the parameters other code treats specially, as Megatron-Core names them.
#pragma once

#include <string>

namespace megatron {

// The input embedding; with tied embeddings also the output layer's weight (and, under pipeline
// parallelism, a copy on the last stage).
inline constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";
// The untied output layer.
inline constexpr const char* kOutputLayer = "output_layer.weight";

inline bool name_ends_with(const std::string& name, const std::string& tail) {
  return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
}

// Whether `name` is the weight (gamma) of a norm: a norm module's ("input_layernorm.weight",
// "q_layernorm.weight", MTP's "enorm.weight", ...) or one held by the linear after it
// ("linear_qkv.layer_norm_weight").
inline bool is_norm_weight(const std::string& name) {
  return name_ends_with(name, "layer_norm_weight") || name_ends_with(name, "norm.weight");
}

// Megatron's is_embedding_or_output_parameter (what --decoupled-lr drives): the word embeddings
// wherever a chunk holds them, and the untied output layer.
inline bool is_embedding_or_output(const std::string& name) {
  return name_ends_with(name, kWordEmbeddings) || name_ends_with(name, kOutputLayer);
}

}  // namespace megatron
