#include "model/transformer_layer.h"

#include <ATen/ATen.h>

namespace megatron {

TransformerLayer::TransformerLayer(const ModelConfig& c, const tp::TensorParallel& tp) : hidden_dropout_(c.hidden_dropout) {
  self_attention = register_module("self_attention", std::make_shared<SelfAttention>(c, tp));
  mlp = register_module("mlp", std::make_shared<MLP>(c, tp));
}

at::Tensor TransformerLayer::forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask) {
  const bool train = is_training();
  at::Tensor x = hidden + at::dropout(self_attention->forward(hidden, rope, attention_mask), hidden_dropout_, train);
  return x + at::dropout(mlp->forward(x), hidden_dropout_, train);
}

}  // namespace megatron
