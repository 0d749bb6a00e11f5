// Self-attention: fused QKV projection in Megatron's per-query-group layout, optional per-head
// q/k norm (Qwen3), RoPE, core attention (the spec's: SDPA today), output projection.
#pragma once

#include <memory>

#include "model/layer_spec.h"

namespace megatron {

class SelfAttention : public AttentionBlock {
 public:
  SelfAttention(const PartContext& context, std::shared_ptr<CoreAttention> core_attention);

  // normed: [s, b, h] ([s/tp, b, h] with sequence parallelism) -> the same shape.
  // attention_mask: [b, 1, s, s] bool, true = may attend; [b, s] document ids; undefined = causal. With a cache the
  // keys and values after RoPE are what it keeps (parts 0 and 1: [s, b, G/tp, d] a token).
  at::Tensor forward(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask,
                     const LayerKvCache* cache = nullptr) override;
  std::optional<AfterNorm> forward_after_norm(const PendingNorm& pending, const RopeTables* rope, const at::Tensor& attention_mask,
                                              const LayerKvCache* cache, const NormParams* next) override;
  std::optional<NormParams> fused_norm() const override;

  // weight [(H + 2G) * d / tp, h]; a LayerNormColumnParallelLinear when the input norm lives in it
  std::shared_ptr<tp::ColumnParallelLinear> linear_qkv;
  std::shared_ptr<tp::RowParallelLinear> linear_proj;  // weight [h, H * d / tp]
  at::Tensor q_layernorm_weight;                       // [d] (qk_layernorm only)
  at::Tensor k_layernorm_weight;                       // [d]

 private:
  // A batch-1 decode step reading the cache in place with RoPE in the QKV GEMV's epilogue
  // (DecodeKernels::rope_in_gemv) and, given `pending`, the input norm in it too (base is then
  // pending's base, else the normed row; a prepared norm's scaled row is what the GEMV reads):
  // one launch up to attention; given `next`, the output projection prepares that norm where it
  // can (AfterNorm::prepared). nullopt where it does not apply (having at most made the cache's
  // stores, as the other cached paths would).
  std::optional<AfterNorm> decode_with_rope_in_gemv(const at::Tensor& base, const PendingNorm* pending, const RopeTables* rope,
                                                    const LayerKvCache* cache, const NormParams* next);
  // The attention's output [s, b, H/tp * d] through linear_proj, on top of the residual sum `sum`:
  // prepared for `next` where the GEMV can take it, else the plain output.
  AfterNorm project(const at::Tensor& attended, const at::Tensor& sum, const NormParams* next) const;
  // linear_qkv's output [s, b, (H + 2G) * d / tp] -> proj output: RoPE, core attention, linear_proj.
  at::Tensor attend_qkv(at::Tensor qkv, const RopeTables* rope, const at::Tensor& attention_mask, const LayerKvCache* cache);
  // The heads (q: [s, b, H/tp, d], k and v: [s, b, G/tp, d]) -> proj output, with recomputation.
  at::Tensor attend_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask,
                          const LayerKvCache* cache);
  std::shared_ptr<CoreAttention> core_attention_;
  std::shared_ptr<tp::LayerNormColumnParallelLinear> norm_in_qkv_;  // linear_qkv, when it holds the norm
  tp::TensorParallel tp_;
  int64_t heads_, groups_, head_dim_;  // heads_ and groups_: this TP rank's
  double attention_dropout_;
  double norm_epsilon_;
  bool zero_centered_gamma_;  // --apply-layernorm-1p: q/k norm weights stored as gamma - 1
  bool rope_fusion_;
  bool recompute_core_attention_;  // --recompute-granularity selective
};

}  // namespace megatron
