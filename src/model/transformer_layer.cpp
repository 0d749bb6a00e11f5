#include "model/transformer_layer.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"
#include "model/mlp.h"
#include "moe/moe_layer.h"
#include "tensor_parallel/recompute.h"

namespace megatron {

TransformerLayer::TransformerLayer(const ModelConfig& c, const tp::TensorParallel& tp, const LayerSpec& spec,
                                   at::Device device, int layer, std::shared_ptr<fp8::Fp8Context> fp8,
                                   std::shared_ptr<DocumentsMemo> documents)
    : hidden_dropout_(c.hidden_dropout),
      fuse_add_norm_(c.bias_dropout_fusion && norm_kind_from_name(c.normalization) == NormKind::RMSNorm),
      tp_(tp) {
  const PartContext ctx{c, tp, device, spec.norms_in_linears, layer, std::move(fp8), std::move(documents)};
  std::shared_ptr<AttentionBlock> attention = spec.attention(ctx, spec.core_attention(ctx));
  // The layer holds the input norm when the attention block does not (the spec says so, or the
  // part keeps its norm apart: MLA).
  if (!attention->fused_norm()) input_layernorm_ = register_module("input_layernorm", std::make_shared<NormModule>(c, tp, device));
  self_attention = register_module("self_attention", attention);
  std::shared_ptr<FeedForward> feed_forward = spec.feed_forward(ctx);
  // The layer holds the pre-MLP norm when the feed-forward does not (the spec says so, or the
  // part keeps its norm apart: MoE).
  if (!feed_forward->fused_norm()) pre_mlp_layernorm_ = register_module("pre_mlp_layernorm", std::make_shared<NormModule>(c, tp, device));
  mlp = register_module("mlp", feed_forward);
  // Megatron's "mlp" module is the dense MLP; an MoE layer is its "moe" (router, dispatch, experts
  // and shared experts: its auxiliary losses and expert counts are taken in the backward's run,
  // the one with autograd on, as under full recomputation).
  const bool moe = std::dynamic_pointer_cast<moe::MoELayer>(feed_forward) != nullptr;
  recompute_mlp_ = moe ? c.selectively_recomputes("moe") : c.selectively_recomputes("mlp") && std::dynamic_pointer_cast<MLP>(feed_forward) != nullptr;
  recompute_draws_random_ = moe && c.moe_router_force_load_balancing;
  recompute_norms_ = c.selectively_recomputes("layernorm");
  TORCH_CHECK(spec.norms_in_linears || !self_attention->fused_norm(), "layer spec: norms_in_linears is false but the "
              "attention block holds the norm in front of it");
  TORCH_CHECK(spec.norms_in_linears || !mlp->fused_norm(), "layer spec: norms_in_linears is false but the feed-forward holds its norm");
}

NormParams TransformerLayer::input_norm() const {
  return input_layernorm_ ? input_layernorm_->params() : *self_attention->fused_norm();
}

NormParams TransformerLayer::pre_mlp_norm() const {
  return pre_mlp_layernorm_ ? pre_mlp_layernorm_->params() : *mlp->fused_norm();
}

at::Tensor ResidualStream::materialize() const { return delta.defined() ? base + delta : base; }

at::Tensor TransformerLayer::forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask) {
  return forward(ResidualStream{hidden, {}, {}}, rope, attention_mask).materialize();
}

ResidualStream TransformerLayer::forward(const ResidualStream& in, const RopeTables* rope,
                                         const at::Tensor& attention_mask, const LayerKvCache* cache, const NormParams* next_norm) {
  const bool train = is_training();
  const NormParams first = input_norm(), second = pre_mlp_norm();
  const at::Tensor first_gamma = first.gamma(), second_gamma = second.gamma();  // [h] the scales applied
  if (fuse_add_norm_ && (!train || hidden_dropout_ == 0.0) && first_gamma.scalar_type() == in.base.scalar_type() &&
      second_gamma.scalar_type() == in.base.scalar_type()) {
    // h = base + delta with the input norm, then x = h + attn with the pre-MLP norm: one kernel
    // each way for each add + norm; the MLP output goes on as the next delta. In a decode step
    // that asks for it (DecodeKernels::norms_in_gemv) a part may take its norm still pending and
    // compute it in its first kernel (a batch-1 step's GEMV): no launch of the norm's own. Asked
    // for the norm after it, a part's last GEMV may also add its output to the residual and do
    // that norm's first half (AfterNorm::prepared), which the next part's first GEMV finishes.
    const bool pending_norms = !train && cache != nullptr && cache->step->decode_kernels().norms_in_gemv;
    std::optional<AfterNorm> h_attention;
    if (pending_norms) {
      h_attention = self_attention->forward_after_norm(PendingNorm{in.base, in.delta, first, in.prepared}, rope, attention_mask, cache,
                                                       &second);
      if (h_attention) cache->step->decode_kernels_run().norms_in_gemv = true;
    }
    if (!h_attention) {
      const kernels::AddRmsNorm h = in.delta.defined()
                                        ? kernels::add_rms_norm(in.base, in.delta, first_gamma, first.eps)
                                        : kernels::AddRmsNorm{in.base, kernels::rms_norm(in.base, first_gamma, first.eps)};
      h_attention = AfterNorm{h.sum, self_attention->forward(h.normed, rope, attention_mask, cache), {}};
      // The fused kernel normalises the rounded sum, as rms_norm of the sum does.
      if (recompute_norms_) {
        discard_norm_output(h.normed, h_attention->out,
                            [sum = h.sum, gamma = first_gamma, eps = first.eps] { return kernels::rms_norm(sum, gamma, eps); });
      }
    }
    // The stream after the attention block: sum + out, or prepared->sum with the norm half done.
    const std::optional<kernels::PreparedNorm>& prepared = h_attention->prepared;
    std::optional<AfterNorm> x_mlp;
    if (pending_norms) {
      x_mlp = mlp->forward_after_norm(prepared ? PendingNorm{prepared->sum, {}, second, prepared}
                                               : PendingNorm{h_attention->sum, h_attention->out, second, {}},
                                      next_norm);
      if (x_mlp) cache->step->decode_kernels_run().norms_in_gemv = true;
    }
    if (!x_mlp) {
      const kernels::AddRmsNorm x = prepared ? kernels::AddRmsNorm{prepared->sum, kernels::rms_norm(prepared->sum, second_gamma, second.eps)}
                                             : kernels::add_rms_norm(h_attention->sum, h_attention->out, second_gamma, second.eps);
      x_mlp = AfterNorm{x.sum, feed_forward(x.normed), {}};
      if (recompute_norms_) {
        discard_norm_output(x.normed, x_mlp->out, [sum = x.sum, gamma = second_gamma, eps = second.eps] { return kernels::rms_norm(sum, gamma, eps); });
      }
    }
    if (prepared || x_mlp->prepared) cache->step->decode_kernels_run().norms_prepared_in_epilogues = true;
    if (x_mlp->prepared) return {x_mlp->prepared->sum, {}, x_mlp->prepared};
    return {x_mlp->sum, x_mlp->out, {}};
  }
  // Under sequence parallelism each TP rank holds different tokens: independent masks.
  const bool sharded = tp_.sequence_parallel && train && hidden_dropout_ > 0.0;
  auto dropout = [&](const at::Tensor& y) { return tp_.random(sharded, [&] { return at::dropout(y, hidden_dropout_, train); }); };
  const at::Tensor hidden = in.materialize();
  const at::Tensor first_normed = first.apply(hidden);
  const at::Tensor attention = self_attention->forward(first_normed, rope, attention_mask, cache);
  if (recompute_norms_) discard_norm_output(first_normed, attention, [hidden, first] { return first.apply(hidden); });
  at::Tensor x = hidden + dropout(attention);
  const at::Tensor second_normed = second.apply(x);
  const at::Tensor mlp_out = feed_forward(second_normed);
  if (recompute_norms_) discard_norm_output(second_normed, mlp_out, [x, second] { return second.apply(x); });
  return {x + dropout(mlp_out), {}, {}};
}

void TransformerLayer::discard_norm_output(const at::Tensor& normed, const at::Tensor& consumer_output,
                                           std::function<at::Tensor()> recompute) const {
  if (!is_training()) return;
  tp::discard_output_until_backward(normed, consumer_output, std::move(recompute));
}

at::Tensor TransformerLayer::feed_forward(const at::Tensor& normed) {
  if (!recompute_mlp_ || !is_training()) return mlp->forward(normed);
  // Only the input is kept; the MLP (no dropout inside) runs again in the backward.
  const std::shared_ptr<FeedForward> block = mlp;
  return tp::recompute_in_backward([block](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{block->forward(in[0])}; },
                                   {normed}, tp_, recompute_draws_random_)[0];
}

}  // namespace megatron
