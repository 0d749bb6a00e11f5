#include "model/transformer_layer.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"

namespace megatron {

TransformerLayer::TransformerLayer(const ModelConfig& c, const tp::TensorParallel& tp)
    : hidden_dropout_(c.hidden_dropout),
      fuse_add_norm_(c.bias_dropout_fusion && norm_kind_from_name(c.normalization) == NormKind::RMSNorm),
      norm_epsilon_(c.norm_epsilon),
      tp_(tp) {
  self_attention = register_module("self_attention", std::make_shared<SelfAttention>(c, tp));
  mlp = register_module("mlp", std::make_shared<MLP>(c, tp));
}

at::Tensor ResidualStream::materialize() const { return delta.defined() ? base + delta : base; }

at::Tensor TransformerLayer::forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask) {
  return forward(ResidualStream{hidden, {}}, rope, attention_mask).materialize();
}

ResidualStream TransformerLayer::forward(const ResidualStream& in, const RopeTables* rope,
                                         const at::Tensor& attention_mask) {
  const bool train = is_training();
  const at::Tensor& qkv_norm = self_attention->linear_qkv->layer_norm_weight;
  const at::Tensor& mlp_norm = mlp->linear_fc1->layer_norm_weight;
  if (fuse_add_norm_ && (!train || hidden_dropout_ == 0.0) && qkv_norm.scalar_type() == in.base.scalar_type() &&
      mlp_norm.scalar_type() == in.base.scalar_type()) {
    // h = base + delta with the input norm, then x = h + attn with the pre-MLP norm: one kernel
    // each way for each add + norm; the MLP output goes on as the next delta.
    const kernels::AddRmsNorm h = in.delta.defined()
                                      ? kernels::add_rms_norm(in.base, in.delta, qkv_norm, norm_epsilon_)
                                      : kernels::AddRmsNorm{in.base, kernels::rms_norm(in.base, qkv_norm, norm_epsilon_)};
    const kernels::AddRmsNorm x =
        kernels::add_rms_norm(h.sum, self_attention->forward_normed(h.normed, rope, attention_mask), mlp_norm, norm_epsilon_);
    return {x.sum, mlp->forward_normed(x.normed)};
  }
  // Under sequence parallelism each TP rank holds different tokens: independent masks.
  const bool sharded = tp_.sequence_parallel && train && hidden_dropout_ > 0.0;
  auto dropout = [&](const at::Tensor& y) { return tp_.random(sharded, [&] { return at::dropout(y, hidden_dropout_, train); }); };
  const at::Tensor hidden = in.materialize();
  at::Tensor x = hidden + dropout(self_attention->forward(hidden, rope, attention_mask));
  return {x + dropout(mlp->forward(x)), {}};
}

}  // namespace megatron
