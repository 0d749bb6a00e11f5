// The MLP: linear_fc1 (with the pre-MLP norm fused in front) -> SwiGLU or GELU -> linear_fc2.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "core/config.h"
#include "tensor_parallel/layers.h"

namespace megatron {

class MLP : public torch::nn::Module {
 public:
  MLP(const ModelConfig& config, const tp::TensorParallel& tp);
  at::Tensor forward(const at::Tensor& hidden);  // [s, b, h] -> [s, b, h] (dim 0 s/tp under sequence parallelism)
  // For hidden already normalised with linear_fc1's norm weight (the fused residual add + norm).
  at::Tensor forward_normed(const at::Tensor& normed);

  // [2f/tp, h] = [gate block; up block] of this rank with SwiGLU, else [f/tp, h]
  std::shared_ptr<tp::LayerNormColumnParallelLinear> linear_fc1;
  std::shared_ptr<tp::RowParallelLinear> linear_fc2;  // weight [h, f/tp]

 private:
  at::Tensor activation_and_fc2(at::Tensor h);  // [s, b, 2f/tp or f/tp] -> [s, b, h]
  bool swiglu_;
  bool swiglu_fusion_;
};

}  // namespace megatron
