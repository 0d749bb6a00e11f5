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

at::Tensor TransformerLayer::forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask) {
  const bool train = is_training();
  // Under sequence parallelism each TP rank holds different tokens: independent masks.
  const bool sharded = tp_.sequence_parallel && train && hidden_dropout_ > 0.0;
  auto dropout = [&](const at::Tensor& y) { return tp_.random(sharded, [&] { return at::dropout(y, hidden_dropout_, train); }); };
  if (fuse_add_norm_ && (!train || hidden_dropout_ == 0.0) &&
      mlp->linear_fc1->layer_norm_weight.scalar_type() == hidden.scalar_type()) {
    // x = hidden + attn and the pre-MLP norm of x in one kernel each way.
    const kernels::AddRmsNorm x = kernels::add_rms_norm(hidden, self_attention->forward(hidden, rope, attention_mask),
                                                        mlp->linear_fc1->layer_norm_weight, norm_epsilon_);
    return x.sum + dropout(mlp->forward_normed(x.normed));
  }
  at::Tensor x = hidden + dropout(self_attention->forward(hidden, rope, attention_mask));
  return x + dropout(mlp->forward(x));
}

}  // namespace megatron
