#include "model/linear.h"

#include <ATen/ATen.h>

namespace megatron {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias) {
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", at::zeros({out_features}));
}

at::Tensor Linear::forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }

LayerNormLinear::LayerNormLinear(int64_t in_features, int64_t out_features, bool bias, NormKind norm, double eps)
    : norm_(norm), eps_(eps) {
  layer_norm_weight = register_parameter("layer_norm_weight", at::ones({in_features}));
  if (norm == NormKind::LayerNorm) layer_norm_bias = register_parameter("layer_norm_bias", at::zeros({in_features}));
  weight = register_parameter("weight", at::empty({out_features, in_features}));
  if (bias) this->bias = register_parameter("bias", at::zeros({out_features}));
}

at::Tensor LayerNormLinear::forward(const at::Tensor& x) const {
  return at::linear(apply_norm(x, layer_norm_weight, layer_norm_bias, norm_, eps_), weight, bias);
}

}  // namespace megatron
