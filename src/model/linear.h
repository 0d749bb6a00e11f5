// The linear building blocks of a layer, named as Megatron-Core (Transformer Engine) names
// them so parameter names match Megatron checkpoints: `linear_qkv.weight`,
// `linear_qkv.layer_norm_weight`, ... A LayerNormLinear owns the norm that precedes it.
// Shapes are the local shard's; with tensor parallelism they become column/row shards.
#pragma once

#include <torch/nn/module.h>

#include "model/norm.h"

namespace megatron {

class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias);
  at::Tensor forward(const at::Tensor& x) const;  // [..., in] -> [..., out]

  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out] or undefined
};

class LayerNormLinear : public torch::nn::Module {
 public:
  LayerNormLinear(int64_t in_features, int64_t out_features, bool bias, NormKind norm, double eps);
  at::Tensor forward(const at::Tensor& x) const;  // [..., in] -> [..., out]

  at::Tensor layer_norm_weight;  // [in]
  at::Tensor layer_norm_bias;    // [in] for LayerNorm, undefined for RMSNorm
  at::Tensor weight;             // [out, in]
  at::Tensor bias;               // [out] or undefined

 private:
  NormKind norm_;
  double eps_;
};

}  // namespace megatron
