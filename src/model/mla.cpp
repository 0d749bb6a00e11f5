#include "model/mla.h"

#include <ATen/ATen.h>

#include <cmath>

#include "kernels/ops.h"
#include "model/core_attention.h"
#include "model/norm.h"
#include "model/norm_module.h"
#include "tensor_parallel/grad_accumulation.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/recompute.h"

namespace megatron {

namespace {

// A column-parallel up projection from a latent of `rank` channels, holding the latent's RMSNorm
// with --qk-layernorm.
std::shared_ptr<tp::ColumnParallelLinear> up_projection(const PartContext& ctx, int64_t rank, int64_t out) {
  if (!ctx.config.qk_layernorm) {
    return std::make_shared<tp::ColumnParallelLinear>(rank, out, false, ctx.tp, ctx.linear(tp::Init::Normal));
  }
  NormSpec spec = norm_spec(ctx.config);
  spec.kind = NormKind::RMSNorm;  // the latent norms are RMSNorms whatever --normalization says
  return std::make_shared<tp::LayerNormColumnParallelLinear>(rank, out, false, spec, ctx.tp, ctx.linear(tp::Init::Normal));
}

}  // namespace

at::Tensor MultiLatentAttention::norm_latent(const at::Tensor& latent, const tp::ColumnParallelLinear& up) {
  const auto* with_norm = dynamic_cast<const tp::LayerNormColumnParallelLinear*>(&up);
  return with_norm ? with_norm->norm().apply(latent) : latent;
}

double MultiLatentAttention::softmax_scale(const ModelConfig& c) {
  const double mscale = yarn_get_mscale(c.rotary_scaling_factor, c.mscale_all_dim);
  return mscale * mscale / std::sqrt(double(c.qk_head_dim + c.qk_pos_emb_head_dim));
}

MultiLatentAttention::MultiLatentAttention(const PartContext& ctx, std::shared_ptr<CoreAttention> core_attention)
    : core_attention_(std::move(core_attention)),
      tp_(ctx.tp),
      heads_(ctx.config.num_attention_heads / ctx.tp.size()),
      nope_dim_(ctx.config.qk_head_dim),
      rope_dim_(ctx.config.qk_pos_emb_head_dim),
      v_dim_(ctx.config.v_head_dim),
      kv_lora_rank_(ctx.config.kv_lora_rank),
      attention_dropout_(ctx.config.attention_dropout),
      rope_fusion_(ctx.config.apply_rope_fusion),
      recompute_core_attention_(ctx.config.selectively_recomputes("core_attn")),
      recompute_up_projections_(ctx.config.selectively_recomputes("mla_up_proj")) {
  const ModelConfig& c = ctx.config;
  const int64_t h = c.hidden_size, H = c.num_attention_heads;
  const at::TensorOptions on = at::TensorOptions().device(ctx.device);
  // The down projections are replicated ("duplicated" in Megatron): under SP each rank applies
  // them to its own sequence shard, so their gradients are partial sums over TP.
  const tp::ParamInfo replica = tp::sequence_sharded_replica(ctx.tp, tp::Init::Normal);
  if (c.q_lora_rank > 0) {
    auto down = register_module("linear_q_down_proj", std::make_shared<tp::DescribedModule>());
    q_down_weight = down->add_parameter("weight", at::empty({c.q_lora_rank, h}, on), replica);
    linear_q_up_proj = register_module("linear_q_up_proj", up_projection(ctx, c.q_lora_rank, H * (nope_dim_ + rope_dim_)));
  } else {
    linear_q_proj = register_module("linear_q_proj", std::make_shared<tp::ColumnParallelLinear>(
                                                         h, H * (nope_dim_ + rope_dim_), false, ctx.tp, ctx.linear(tp::Init::Normal)));
  }
  auto kv_down = register_module("linear_kv_down_proj", std::make_shared<tp::DescribedModule>());
  kv_down_weight = kv_down->add_parameter("weight", at::empty({c.kv_lora_rank + rope_dim_, h}, on), replica);
  linear_kv_up_proj = register_module("linear_kv_up_proj", up_projection(ctx, c.kv_lora_rank, H * (nope_dim_ + v_dim_)));
  linear_proj = register_module("linear_proj", std::make_shared<tp::RowParallelLinear>(H * v_dim_, h, c.add_bias_linear, ctx.tp,
                                                                                       ctx.linear(tp::Init::ScaledNormal)));
}

at::Tensor MultiLatentAttention::rotate(const at::Tensor& x, const RopeTables& rope) const {
  const int64_t s = x.size(0), b = x.size(1), n = x.size(2);
  // [.., dr] pairs (x0, x1), (x2, x3), ... -> [x0, x2, ... | x1, x3, ...]: rotate-half's layout.
  const at::Tensor halves = x.reshape({s, b, n, rope_dim_ / 2, 2}).transpose(-1, -2).reshape({s, b, n, rope_dim_});
  return rope_fusion_ ? kernels::rope(halves, rope.cos, rope.sin) : apply_rope(halves, rope);
}

at::Tensor MultiLatentAttention::forward(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask,
                                         const LayerKvCache* cache) {
  TORCH_CHECK(rope != nullptr, "multi-latent attention needs rotary position embeddings");
  if (cache != nullptr) return forward_cached(normed, *rope, *cache);
  // The query's input to its up projection: the latent [s(/tp), b, q_lora] (without q LoRA, the
  // normed input itself, projected by linear_q_proj).
  const at::Tensor q_in = linear_q_proj ? normed : tp::linear(normed, q_down_weight);
  const at::Tensor kv_down = tp::linear(normed, kv_down_weight);  // [s(/tp), b, kv_lora + dr]
  // The rotary key, one for all heads: the whole sequence on every rank, and in backward the
  // heads' partial gradients summed over TP (gather / copy).
  at::Tensor k_rope = kv_down.narrow(-1, kv_lora_rank_, rope_dim_);  // [s(/tp), b, dr]
  k_rope = tp_.sequence_parallel ? tp::gather_from_sp(k_rope, tp_.group) : tp::copy_to_tp(k_rope, tp_.group);
  // The up projections and the rotary embedding (Megatron's "mla_up_proj" region): their outputs,
  // H/tp heads over the whole sequence, are the largest activations MLA keeps.
  const RopeTables tables = *rope;
  auto up = [this, tables](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const at::Tensor q = linear_q_proj ? linear_q_proj->forward(in[0])
                                       : linear_q_up_proj->forward(norm_latent(in[0], *linear_q_up_proj));  // [s, b, H/tp (dn + dr)]
    const at::Tensor kv = linear_kv_up_proj->forward(norm_latent(in[1], *linear_kv_up_proj));         // [s, b, H/tp (dn + dv)]
    const int64_t s = q.size(0), b = q.size(1);
    const at::Tensor q_heads = q.view({s, b, heads_, nope_dim_ + rope_dim_});
    const at::Tensor kv_heads = kv.view({s, b, heads_, nope_dim_ + v_dim_});
    const at::Tensor q_rope = rotate(q_heads.narrow(-1, nope_dim_, rope_dim_), tables);  // [s, b, H/tp, dr]
    const at::Tensor k_rot = rotate(in[2].unsqueeze(2), tables);                        // [s, b, 1, dr]
    return {at::cat({q_heads.narrow(-1, 0, nope_dim_), q_rope}, -1),                     // query [s, b, H/tp, dn + dr]
            at::cat({kv_heads.narrow(-1, 0, nope_dim_), k_rot.expand({s, b, heads_, rope_dim_})}, -1),  // key
            kv_heads.narrow(-1, nope_dim_, v_dim_).contiguous()};                        // value [s, b, H/tp, dv]
  };
  const std::vector<at::Tensor> in = {q_in, kv_down.narrow(-1, 0, kv_lora_rank_), k_rope};
  const std::vector<at::Tensor> qkv =
      recompute_up_projections_ && is_training() ? tp::recompute_in_backward(up, in, tp_, /*draws_random=*/false) : up(in);
  const at::Tensor &query = qkv[0], &key = qkv[1], &value = qkv[2];
  const double dropout = is_training() ? attention_dropout_ : 0.0;
  const at::Tensor context =
      attend(*core_attention_, query, key, value.contiguous(), attention_mask, dropout, recompute_core_attention_, tp_);  // [s, b, H/tp dv]
  return linear_proj->forward(context);  // [s, b, h] ([s/tp, b, h] under SP)
}

at::Tensor MultiLatentAttention::forward_cached(const at::Tensor& normed, const RopeTables& rope, const LayerKvCache& cache) {
  TORCH_CHECK(!tp_.sequence_parallel, "multi-latent attention over a key/value cache runs without sequence parallelism");
  const at::Tensor q = linear_q_proj ? linear_q_proj->forward(normed)
                                     : linear_q_up_proj->forward(norm_latent(tp::linear(normed, q_down_weight), *linear_q_up_proj));
  const int64_t s = q.size(0), b = q.size(1);
  const at::Tensor q_heads = q.view({s, b, heads_, nope_dim_ + rope_dim_});                  // [s, b, H/tp, dn + dr]
  const at::Tensor query = at::cat({q_heads.narrow(-1, 0, nope_dim_), rotate(q_heads.narrow(-1, nope_dim_, rope_dim_), rope)}, -1);
  const at::Tensor kv_down = tp::linear(normed, kv_down_weight);                             // [s, b, kv_lora + dr]
  // The latents are what the cache keeps: kv_lora + dr channels a token against the heads'
  // H (dn + dv + dr); the up projection then runs over every cached token at each step.
  const at::Tensor latent = cache.extend(0, kv_down.narrow(-1, 0, kv_lora_rank_).contiguous());       // [L, b, kv_lora]
  const at::Tensor k_rot = cache.extend(1, rotate(kv_down.narrow(-1, kv_lora_rank_, rope_dim_).unsqueeze(2), rope).squeeze(2));  // [L, b, dr]
  const int64_t L = latent.size(0);
  const at::Tensor kv = linear_kv_up_proj->forward(norm_latent(latent, *linear_kv_up_proj)).view({L, b, heads_, nope_dim_ + v_dim_});
  const at::Tensor key = at::cat({kv.narrow(-1, 0, nope_dim_), k_rot.unsqueeze(2).expand({L, b, heads_, rope_dim_})}, -1);
  const at::Tensor value = kv.narrow(-1, nope_dim_, v_dim_).contiguous();                    // [L, b, H/tp, dv]
  return linear_proj->forward(core_attention_->forward(query, key, value, cache.attention_mask(), 0.0));  // [s, b, h]
}

}  // namespace megatron
