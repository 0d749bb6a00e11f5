// Multi-latent attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention, TE spec names):
//
//   q  = linear_q_proj(x), or linear_q_up_proj(norm(linear_q_down_proj(x)))    per head [nope | rope]
//   kv = linear_kv_down_proj(x) = [latent | k_rope];  linear_kv_up_proj(norm(latent)) per head [k_nope | v]
//   k  = [k_nope | k_rope], one rotary key shared by all heads
//   out = linear_proj(softmax(q k^T * scale) v), scale = mscale(factor, mscale_all_dim)^2 / sqrt(nope + rope)
//
// The latent norms exist with --qk-layernorm, as in Megatron (DeepSeek's recipes pass it); there
// is no norm on the query path without a query latent (HF DeepSeek-V2-Lite has none; Megatron's
// newest spec adds one there, which no HF checkpoint carries).
//
// The rotary channels are consecutive pairs (DeepSeek's layout, as HF's rope_interleave and
// Megatron's MLA rotary): they are de-interleaved, then rotated in the rotate-half form, which
// gives the same scores since q and k are permuted alike.
//
// Under tensor parallelism the up projections are column-parallel (whole heads per rank) and
// linear_proj row-parallel; the down projections and the latent norms are replicated. Under
// sequence parallelism the down projections run on each rank's sequence shard (their weights'
// gradients are partial sums over TP), the up projections gather their input and the rotary key
// is gathered.
#pragma once

#include <memory>

#include "model/layer_spec.h"

namespace megatron {

class MultiLatentAttention : public AttentionBlock {
 public:
  MultiLatentAttention(const PartContext& context, std::shared_ptr<CoreAttention> core_attention);

  // normed: [s, b, h] ([s/tp, b, h] under sequence parallelism) -> the same shape. With a cache
  // it keeps the latents, not the heads: the key latent before its norm (part 0: [s, b, kv_lora])
  // and the rotated shared key (part 1: [s, b, dr]); the up projection runs over all of them.
  at::Tensor forward(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask,
                     const LayerKvCache* cache = nullptr) override;
  // The layer holds the input norm (input_layernorm): the first linears are the down projections.
  std::optional<NormParams> fused_norm() const override { return std::nullopt; }

  // Megatron's softmax scale for the configuration.
  static double softmax_scale(const ModelConfig& config);

  std::shared_ptr<tp::ColumnParallelLinear> linear_q_proj;     // [H (dn + dr) / tp, h], q_lora_rank 0
  at::Tensor q_down_weight;                                    // [q_lora, h] (linear_q_down_proj.weight)
  std::shared_ptr<tp::ColumnParallelLinear> linear_q_up_proj;  // [H (dn + dr) / tp, q_lora]
  at::Tensor kv_down_weight;                                   // [kv_lora + dr, h] (linear_kv_down_proj.weight)
  std::shared_ptr<tp::ColumnParallelLinear> linear_kv_up_proj; // [H (dn + dv) / tp, kv_lora]
  std::shared_ptr<tp::RowParallelLinear> linear_proj;          // [h, H dv / tp]

 private:
  at::Tensor rotate(const at::Tensor& x, const RopeTables& rope) const;  // [s, b, n, dr] interleaved pairs -> rotated
  // forward over a key/value cache (generation: no autograd, no sequence parallelism).
  at::Tensor forward_cached(const at::Tensor& normed, const RopeTables& rope, const LayerKvCache& cache);
  // The latent's RMSNorm, held by the up projection (`layer_norm_weight`) with --qk-layernorm
  // (Megatron's switch for DeepSeek's latent norms); none without.
  static at::Tensor norm_latent(const at::Tensor& latent, const tp::ColumnParallelLinear& up);

  std::shared_ptr<CoreAttention> core_attention_;
  tp::TensorParallel tp_;
  int64_t heads_;  // this TP rank's
  int64_t nope_dim_, rope_dim_, v_dim_, kv_lora_rank_;
  double attention_dropout_;
  bool rope_fusion_;
  bool recompute_core_attention_;  // --recompute-granularity selective
  bool recompute_up_projections_;  // --recompute-modules mla_up_proj
};

}  // namespace megatron
