// Names of the parameters other code treats specially, as Megatron-Core names them.
#pragma once

#include <string>

namespace megatron {

// The input embedding; with tied embeddings also the output layer's weight (and, under pipeline
// parallelism, a copy on the last stage).
inline constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";
// The untied output layer.
inline constexpr const char* kOutputLayer = "output_layer.weight";

}  // namespace megatron
