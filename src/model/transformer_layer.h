// One decoder layer, pre-norm: x + dropout(attn(norm(x))), then + dropout(mlp(norm(.))).
// The norms live inside linear_qkv and linear_fc1 (Megatron-Core's TE layout and names).
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "model/attention.h"
#include "model/mlp.h"

namespace megatron {

// The residual stream between layers as a sum not formed yet: hidden = base + delta (delta
// undefined: base alone). A layer hands its MLP output on unadded so that the next layer's
// input norm (or the final norm) adds it in the same kernel (kernels::add_rms_norm).
struct ResidualStream {
  at::Tensor base;   // [s, b, h] ([s/tp, b, h] under sequence parallelism)
  at::Tensor delta;  // same shape, or undefined
  at::Tensor materialize() const;  // base + delta
};

class TransformerLayer : public torch::nn::Module {
 public:
  TransformerLayer(const ModelConfig& config, const tp::TensorParallel& tp);
  // attention_mask: [b, 1, s, s] bool (true = attend) or undefined for plain causal attention.
  at::Tensor forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask = {});  // [s, b, h] -> [s, b, h]; [s/tp, b, h] under SP
  // The same on the residual stream; the result's delta is defined when the residual adds are
  // fused with the norms (RMSNorm, --bias-dropout-fusion, no hidden dropout in effect).
  ResidualStream forward(const ResidualStream& in, const RopeTables* rope, const at::Tensor& attention_mask = {});

  std::shared_ptr<SelfAttention> self_attention;
  std::shared_ptr<MLP> mlp;

 private:
  double hidden_dropout_;
  bool fuse_add_norm_;  // the residual adds fused with the RMSNorms after them
  double norm_epsilon_;
  tp::TensorParallel tp_;
};

}  // namespace megatron
