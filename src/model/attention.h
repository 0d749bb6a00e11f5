// Self-attention: fused QKV projection in Megatron's per-query-group layout, optional per-head
// q/k norm (Qwen3), RoPE, causal scaled-dot-product attention (GQA without repeating K/V),
// output projection.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "core/config.h"
#include "model/rope.h"
#include "tensor_parallel/layers.h"

namespace megatron {

class SelfAttention : public torch::nn::Module {
 public:
  SelfAttention(const ModelConfig& config, const tp::TensorParallel& tp);

  // hidden: [s, b, h] ([s/tp, b, h] with sequence parallelism; the norm is inside linear_qkv)
  // -> the same shape.
  // attention_mask: [b, 1, s, s] bool, true = may attend; undefined = causal.
  at::Tensor forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask = {});
  // For hidden already normalised with linear_qkv's norm weight (the fused residual add + norm).
  at::Tensor forward_normed(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask = {});

  std::shared_ptr<tp::LayerNormColumnParallelLinear> linear_qkv;  // weight [(H + 2G) * d / tp, h]
  std::shared_ptr<tp::RowParallelLinear> linear_proj;             // weight [h, H * d / tp]
  at::Tensor q_layernorm_weight;                // [d] (qk_layernorm only)
  at::Tensor k_layernorm_weight;                // [d]

 private:
  at::Tensor attend(at::Tensor qkv, const RopeTables* rope, const at::Tensor& attention_mask);  // QKV output -> proj output
  // The heads (q: [s, b, H/tp, d], k and v: [s, b, G/tp, d]) -> proj output, with recomputation.
  at::Tensor attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask);
  // q: [s, b, H/tp, d], k and v: [s, b, G/tp, d] -> [s, b, H/tp * d]
  at::Tensor core_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask,
                            double dropout) const;
  tp::TensorParallel tp_;
  int64_t heads_, groups_, head_dim_;  // heads_ and groups_: this TP rank's
  double attention_dropout_;
  double norm_epsilon_;
  NormKind norm_kind_;
  bool rope_fusion_;
  bool recompute_core_attention_;  // --recompute-granularity selective
};

}  // namespace megatron
