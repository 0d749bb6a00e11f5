#include "model/attention.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"
#include "tensor_parallel/recompute.h"

namespace megatron {

SelfAttention::SelfAttention(const ModelConfig& c, const tp::TensorParallel& tp)
    : tp_(tp),
      heads_(c.num_attention_heads / tp.size()),
      groups_(c.num_query_groups / tp.size()),
      head_dim_(c.kv_channels),
      attention_dropout_(c.attention_dropout),
      norm_epsilon_(c.norm_epsilon),
      norm_kind_(norm_kind_from_name(c.normalization)),
      rope_fusion_(c.apply_rope_fusion),
      recompute_core_attention_(c.recompute_granularity == "selective") {
  TORCH_CHECK(c.num_query_groups % tp.size() == 0, "query groups do not split across tensor-parallel ranks");
  // Per query group: its query heads, one key head, one value head; TP ranks take whole groups.
  const int64_t qkv_out = int64_t(c.num_attention_heads + 2 * c.num_query_groups) * head_dim_;
  linear_qkv = register_module("linear_qkv", std::make_shared<tp::LayerNormColumnParallelLinear>(
      c.hidden_size, qkv_out, c.add_bias_linear || c.add_qkv_bias, norm_kind_, c.norm_epsilon, tp));
  linear_proj = register_module("linear_proj", std::make_shared<tp::RowParallelLinear>(
      int64_t(c.num_attention_heads) * head_dim_, c.hidden_size, c.add_bias_linear, tp));
  if (c.qk_layernorm) {
    // Megatron names these q_layernorm.weight / k_layernorm.weight; submodules keep the names.
    auto q = register_module("q_layernorm", std::make_shared<torch::nn::Module>());
    auto k = register_module("k_layernorm", std::make_shared<torch::nn::Module>());
    q_layernorm_weight = q->register_parameter("weight", at::ones({head_dim_}));
    k_layernorm_weight = k->register_parameter("weight", at::ones({head_dim_}));
  }
}

at::Tensor SelfAttention::forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask) {
  return attend(linear_qkv->forward(hidden), rope, attention_mask);  // QKV: [s, b, (H + 2G) * d / tp], whole sequence
}

at::Tensor SelfAttention::forward_normed(const at::Tensor& normed, const RopeTables* rope,
                                         const at::Tensor& attention_mask) {
  return attend(linear_qkv->forward_normed(normed), rope, attention_mask);
}

at::Tensor SelfAttention::attend(at::Tensor qkv, const RopeTables* rope, const at::Tensor& attention_mask) {
  const int64_t per_group = heads_ / groups_;
  const int64_t s = qkv.size(0), b = qkv.size(1);
  qkv = qkv.view({s, b, groups_, (per_group + 2) * head_dim_});
  if (rope != nullptr && rope_fusion_ && !q_layernorm_weight.defined()) {
    // One autograd node: q and k rotated straight out of the QKV output, and in backward the
    // three gradients written straight into the QKV output's gradient.
    const kernels::QkvRope parts = kernels::split_qkv_rope(qkv, per_group, rope->cos, rope->sin);
    return attend_heads(parts.q, parts.k, parts.v, attention_mask);  // q: [s, b, H, d]; k, v: [s, b, G, d]
  }
  auto parts = qkv.split_with_sizes({per_group * head_dim_, head_dim_, head_dim_}, -1);
  at::Tensor q = parts[0].view({s, b, groups_, per_group, head_dim_});  // [s, b, G, H/G, d], in place
  at::Tensor k = parts[1];                                        // [s, b, G, d]
  at::Tensor v = parts[2];                                        // [s, b, G, d]
  if (q_layernorm_weight.defined()) {
    q = apply_norm(q, q_layernorm_weight, {}, NormKind::RMSNorm, norm_epsilon_);
    k = apply_norm(k, k_layernorm_weight, {}, NormKind::RMSNorm, norm_epsilon_);
  }
  if (rope != nullptr && rope_fusion_) {
    // After the q/k norms: one pass each way; q comes out as [s, b, H, d].
    q = kernels::rope(q, rope->cos, rope->sin);
    k = kernels::rope(k, rope->cos, rope->sin);
  } else {
    q = q.reshape({s, b, heads_, head_dim_});  // [s, b, H, d]
    if (rope != nullptr) {
      q = apply_rope(q, *rope);
      k = apply_rope(k, *rope);
    }
  }
  return attend_heads(q, k, v, attention_mask);
}

at::Tensor SelfAttention::attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& attention_mask) {
  const double dropout = is_training() ? attention_dropout_ : 0.0;
  at::Tensor out;
  if (recompute_core_attention_) {
    // Selective recomputation: the attention output and its softmax statistics are not kept;
    // the backward runs attention again from q, k and v (saved anyway).
    auto region = [this, dropout, attention_mask](const std::vector<at::Tensor>& qkv_in) {
      return std::vector<at::Tensor>{core_attention(qkv_in[0], qkv_in[1], qkv_in[2], attention_mask, dropout)};
    };
    out = tp::recompute_in_backward(region, {q, k, v}, tp_, dropout > 0.0)[0];
  } else {
    out = core_attention(q, k, v, attention_mask, dropout);
  }
  return linear_proj->forward(out);  // [s, b, h] ([s/tp, b, h] with sequence parallelism)
}

at::Tensor SelfAttention::core_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& attention_mask, double dropout) const {
  const int64_t s = q.size(0), b = q.size(1);
  // SDPA wants [b, heads, s, d]; permuted views keep d contiguous, which the kernels need.
  at::Tensor out = tp_.random(dropout > 0.0, [&] {
    return at::scaled_dot_product_attention(
        q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}),
        attention_mask.defined() ? std::optional<at::Tensor>(attention_mask) : std::nullopt, dropout,
        /*is_causal=*/!attention_mask.defined(), /*scale=*/std::nullopt, /*enable_gqa=*/groups_ != heads_);
  });                                                             // [b, H/tp, s, d]
  return out.permute({2, 0, 1, 3}).reshape({s, b, heads_ * head_dim_});  // [s, b, H*d]
}

}  // namespace megatron
