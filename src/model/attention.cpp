#include "model/attention.h"

#include <ATen/ATen.h>

#include "kernels/attention_ops.h"
#include "kernels/ops.h"
#include "model/core_attention.h"
#include "model/norm_module.h"

namespace megatron {

SelfAttention::SelfAttention(const PartContext& ctx, std::shared_ptr<CoreAttention> core_attention)
    : core_attention_(std::move(core_attention)),
      tp_(ctx.tp),
      heads_(ctx.config.num_attention_heads / ctx.tp.size()),
      groups_(ctx.config.num_query_groups / ctx.tp.size()),
      head_dim_(ctx.config.kv_channels),
      attention_dropout_(ctx.config.attention_dropout),
      norm_epsilon_(ctx.config.norm_epsilon),
      zero_centered_gamma_(ctx.config.layernorm_zero_centered_gamma),
      rope_fusion_(ctx.config.apply_rope_fusion),
      recompute_core_attention_(ctx.config.selectively_recomputes("core_attn")) {
  const ModelConfig& c = ctx.config;
  TORCH_CHECK(c.num_query_groups % ctx.tp.size() == 0, "query groups do not split across tensor-parallel ranks");
  // Per query group: its query heads, one key head, one value head; TP ranks take whole groups.
  const int64_t qkv_out = int64_t(c.num_attention_heads + 2 * c.num_query_groups) * head_dim_;
  const bool qkv_bias = c.add_bias_linear || c.add_qkv_bias;
  if (ctx.norm_in_linear) {
    norm_in_qkv_ = std::make_shared<tp::LayerNormColumnParallelLinear>(c.hidden_size, qkv_out, qkv_bias, norm_spec(c), ctx.tp,
                                                                       ctx.linear(tp::Init::Normal));
    linear_qkv = register_module("linear_qkv", std::shared_ptr<tp::ColumnParallelLinear>(norm_in_qkv_));
  } else {
    linear_qkv = register_module("linear_qkv", std::make_shared<tp::ColumnParallelLinear>(c.hidden_size, qkv_out, qkv_bias,
                                                                                          ctx.tp, ctx.linear(tp::Init::Normal)));
  }
  linear_proj = register_module("linear_proj", std::make_shared<tp::RowParallelLinear>(
      int64_t(c.num_attention_heads) * head_dim_, c.hidden_size, c.add_bias_linear, ctx.tp, ctx.linear(tp::Init::ScaledNormal)));
  if (c.qk_layernorm) {
    // Megatron names these q_layernorm.weight / k_layernorm.weight. Each TP rank normalises its
    // own heads only, so its gradient of the shared weight is a partial sum.
    tp::ParamInfo info;
    info.init = norm_weight_init(c);
    info.partial_grad = ctx.tp.size() > 1;
    const at::TensorOptions on = at::TensorOptions().device(ctx.device);
    auto q = register_module("q_layernorm", std::make_shared<tp::DescribedModule>());
    auto k = register_module("k_layernorm", std::make_shared<tp::DescribedModule>());
    const double start = c.layernorm_zero_centered_gamma ? 0.0 : 1.0;
    q_layernorm_weight = q->add_parameter("weight", at::full({head_dim_}, start, on), info);
    k_layernorm_weight = k->add_parameter("weight", at::full({head_dim_}, start, on), info);
  }
}

std::optional<NormParams> SelfAttention::fused_norm() const {
  if (!norm_in_qkv_) return std::nullopt;
  return norm_in_qkv_->norm();
}

at::Tensor SelfAttention::forward(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask,
                                  const LayerKvCache* cache) {
  if (std::optional<AfterNorm> decoded = decode_with_rope_in_gemv(normed, nullptr, rope, cache, nullptr)) return decoded->out;
  return attend_qkv(linear_qkv->forward(normed), rope, attention_mask, cache);  // qkv: [s, b, (H + 2G) * d / tp], whole sequence
}

std::optional<AfterNorm> SelfAttention::forward_after_norm(const PendingNorm& pending, const RopeTables* rope,
                                                           const at::Tensor& attention_mask, const LayerKvCache* cache,
                                                           const NormParams* next) {
  if (std::optional<AfterNorm> decoded = decode_with_rope_in_gemv(pending.base, &pending, rope, cache, next)) return decoded;
  std::optional<kernels::NormedLinear> qkv = linear_qkv->forward_after_norm(pending, /*gated=*/false);
  if (!qkv) return std::nullopt;
  return AfterNorm{qkv->sum, attend_qkv(qkv->y, rope, attention_mask, cache), {}};
}

std::optional<AfterNorm> SelfAttention::decode_with_rope_in_gemv(const at::Tensor& base, const PendingNorm* pending,
                                                                 const RopeTables* rope, const LayerKvCache* cache, const NormParams* next) {
  // With a prepared norm the GEMV reads its scaled row; base stays the residual sum.
  const bool prepared = pending != nullptr && pending->prepared.has_value();
  const at::Tensor& x = prepared ? pending->prepared->scaled : base;
  if (cache == nullptr || rope == nullptr || !rope_fusion_ || q_layernorm_weight.defined() || !cache->step->decode_kernels().rope_in_gemv ||
      !linear_qkv->computes_plain_linear() || (pending != nullptr && pending->norm.kind != NormKind::RMSNorm) || x.dim() != 3 ||
      x.size(0) * x.size(1) != 1) {
    return std::nullopt;
  }
  const at::TensorOptions o = x.options();
  const at::Tensor probe = at::empty({1, 1, groups_, 1, head_dim_}, o);  // q's dtype, device and head dim
  if (!core_attention_->reads_cache_in_place(probe, *cache)) return std::nullopt;
  kernels::QkvIntoCache into;
  into.heads_per_group = heads_ / groups_;
  into.cos = rope->cos, into.sin = rope->sin;
  into.store_rows = cache->step->store_rows();
  // The stores as every cached path makes them at its first write (zeros, rows [G/tp, d]).
  into.k_store = cache->store(0, {groups_, head_dim_}, o).flatten(0, 1);  // [slots * capacity, G/tp, d]
  into.v_store = cache->store(1, {groups_, head_dim_}, o).flatten(0, 1);
  const at::Tensor &weight = linear_qkv->weight, &bias = linear_qkv->bias;
  at::Tensor q, sum;  // q [1, 1, H/tp, d]; sum: the residual sum (without a norm: unused)
  if (prepared) {
    if (!kernels::gemv_rope_into_cache_takes(*pending->prepared, weight, bias, into)) return std::nullopt;
    cache->step->decode_kernels_run().rope_in_gemv = true;
    q = kernels::gemv_rope_into_cache(*pending->prepared, weight, bias, into);
    sum = base;
  } else {
    std::optional<kernels::InputNorm> norm;
    if (pending != nullptr) norm = kernels::InputNorm{pending->delta, pending->norm.gamma(), pending->norm.eps};
    if (!kernels::gemv_rope_into_cache_takes(x, weight, bias, into, norm ? &*norm : nullptr)) return std::nullopt;
    cache->step->decode_kernels_run().rope_in_gemv = true;
    q = kernels::gemv_rope_into_cache(x, weight, bias, into, norm ? &*norm : nullptr, &sum);
  }
  return project(core_attention_->forward_over_written_cache(q, *cache), sum, next);
}

AfterNorm SelfAttention::project(const at::Tensor& attended, const at::Tensor& sum, const NormParams* next) const {
  if (next != nullptr && sum.defined()) {
    if (std::optional<kernels::PreparedNorm> p = linear_proj->forward_into_norm(attended, sum, *next)) return AfterNorm{sum, {}, std::move(p)};
  }
  return AfterNorm{sum, linear_proj->forward(attended), {}};
}

at::Tensor SelfAttention::attend_qkv(at::Tensor qkv, const RopeTables* rope, const at::Tensor& attention_mask, const LayerKvCache* cache) {
  const int64_t per_group = heads_ / groups_;
  const int64_t s = qkv.size(0), b = qkv.size(1);
  qkv = qkv.view({s, b, groups_, (per_group + 2) * head_dim_});
  if (cache != nullptr && rope != nullptr && rope_fusion_ && !q_layernorm_weight.defined() &&
      kernels::qkv_rope_into_cache_takes(qkv, head_dim_, rope->cos)) {
    // Generation with attention reading the cache in place: one pass rotates the queries and
    // writes the rotated keys and the values straight into the cache's rows.
    const at::Tensor probe = qkv.narrow(-1, 0, head_dim_).unsqueeze(-2);  // [s, b, G, 1, d]: q's dtype, device and head dim
    if (core_attention_->reads_cache_in_place(probe, *cache)) {
      const at::TensorOptions o = qkv.options();
      const at::Tensor k_store = cache->store(0, {groups_, head_dim_}, o).flatten(0, 1);  // [slots * capacity, G/tp, d]
      const at::Tensor v_store = cache->store(1, {groups_, head_dim_}, o).flatten(0, 1);
      const at::Tensor q =
          kernels::qkv_rope_into_cache(qkv, per_group, rope->cos, rope->sin, k_store, v_store, cache->step->store_rows());  // [s, b, H, d]
      return linear_proj->forward(core_attention_->forward_over_written_cache(q, *cache));
    }
  }
  if (rope != nullptr && rope_fusion_ && !q_layernorm_weight.defined()) {
    // One autograd node: q and k rotated straight out of the QKV output, and in backward the
    // three gradients written straight into the QKV output's gradient.
    const kernels::QkvRope parts = kernels::split_qkv_rope(qkv, per_group, rope->cos, rope->sin);
    return attend_heads(parts.q, parts.k, parts.v, attention_mask, cache);  // q: [s, b, H, d]; k, v: [s, b, G, d]
  }
  auto parts = qkv.split_with_sizes({per_group * head_dim_, head_dim_, head_dim_}, -1);
  at::Tensor q = parts[0].view({s, b, groups_, per_group, head_dim_});  // [s, b, G, H/G, d], in place
  at::Tensor k = parts[1];                                              // [s, b, G, d]
  at::Tensor v = parts[2];                                              // [s, b, G, d]
  if (q_layernorm_weight.defined()) {
    q = apply_norm(q, norm_scale(q_layernorm_weight, zero_centered_gamma_), {}, NormKind::RMSNorm, norm_epsilon_);
    k = apply_norm(k, norm_scale(k_layernorm_weight, zero_centered_gamma_), {}, NormKind::RMSNorm, norm_epsilon_);
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
  return attend_heads(q, k, v, attention_mask, cache);
}

at::Tensor SelfAttention::attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& attention_mask, const LayerKvCache* cache) {
  const double dropout = is_training() ? attention_dropout_ : 0.0;
  if (cache != nullptr) {
    // Read where the cache holds them when the backend can; else every key and value of the
    // sequences gathered, [L, b, G/tp, d] each, under the cache's mask.
    at::Tensor out = core_attention_->forward_over_cache(q, k, v, *cache);
    if (!out.defined()) out = core_attention_->forward(q, cache->extend(0, k), cache->extend(1, v), cache->attention_mask(), dropout);
    return linear_proj->forward(out);
  }
  const at::Tensor out = attend(*core_attention_, q, k, v, attention_mask, dropout, recompute_core_attention_, tp_);
  return linear_proj->forward(out);  // [s, b, h] ([s/tp, b, h] with sequence parallelism)
}

}  // namespace megatron
