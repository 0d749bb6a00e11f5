// One decoder layer, pre-norm: x + dropout(attn(norm(x))), then + dropout(mlp(norm(.))).
// The norms live inside linear_qkv and linear_fc1 (Megatron-Core's TE layout and names).
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "model/attention.h"
#include "model/mlp.h"

namespace megatron {

class TransformerLayer : public torch::nn::Module {
 public:
  TransformerLayer(const ModelConfig& config, const tp::TensorParallel& tp);
  // attention_mask: [b, 1, s, s] bool (true = attend) or undefined for plain causal attention.
  at::Tensor forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask = {});  // [s, b, h] -> [s, b, h]; [s/tp, b, h] under SP

  std::shared_ptr<SelfAttention> self_attention;
  std::shared_ptr<MLP> mlp;

 private:
  double hidden_dropout_;
  bool fuse_add_norm_;  // the residual add after attention fused with the pre-MLP RMSNorm
  double norm_epsilon_;
  tp::TensorParallel tp_;
};

}  // namespace megatron
