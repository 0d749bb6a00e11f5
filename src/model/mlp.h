// The MLP: linear_fc1 (with the pre-MLP norm fused in front) -> SwiGLU or GELU -> linear_fc2.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "core/config.h"
#include "model/linear.h"

namespace megatron {

class MLP : public torch::nn::Module {
 public:
  explicit MLP(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& hidden);  // [s, b, h] -> [s, b, h]

  std::shared_ptr<LayerNormLinear> linear_fc1;  // weight [2f, h] = [gate; up] with SwiGLU, else [f, h]
  std::shared_ptr<Linear> linear_fc2;           // weight [h, f]

 private:
  bool swiglu_;
};

}  // namespace megatron
