// How a decoder layer is assembled, as Megatron-Core's layer specs (gpt_layer_specs.py): a layer
// is built from parts behind small interfaces, and one function per family picks the parts.
//
//   attention block   normed hidden -> attention output (self-attention, or multi-latent attention)
//   core attention    q, k, v -> context (SDPA; across context-parallel ranks: ring, all-gather or a2a)
//   feed-forward      normed hidden -> MLP output (the dense MLP, or MoE: src/moe)
//
// The layer owns the pre-norms and the residual stream. Where a norm's parameters live is the
// spec's choice: fused into the part's first linear (Transformer Engine's layout and Megatron's
// names, `self_attention.linear_qkv.layer_norm_weight`), or modules of the layer
// (`input_layernorm.weight`, `pre_mlp_layernorm.weight`). Either way the layer applies it, so it
// can fuse the residual add into the norm.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "core/config.h"
#include "model/document_attention.h"
#include "model/kv_cache.h"
#include "model/norm.h"
#include "model/rope.h"
#include "tensor_parallel/layers.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

// What every part is built from.
struct PartContext {
  const ModelConfig& config;
  const tp::TensorParallel& tp;
  at::Device device = at::kCPU;  // kMeta: parameters described, not allocated
  bool norm_in_linear = true;    // the norm before this part lives in the part's first linear
  int layer = 0;                 // the decoder layer's global index (0-based): MoE layers are chosen by it
  // The layer's linear layers run their GEMMs in FP8 under this context; null: in bf16 / fp32.
  std::shared_ptr<fp8::Fp8Context> fp8 = nullptr;
  // The packed documents of the micro-batch's mask, read once for all the model's layers; null:
  // each core attention reads them itself.
  std::shared_ptr<DocumentsMemo> documents = nullptr;
  // The options of a linear layer of this part.
  tp::LinearOptions linear(tp::Init weight_init, bool gated = false) const { return {device, weight_init, gated, fp8}; }
};

// q and k: [s, b, H/tp, d] and [s, b, G/tp, d], v: [s, b, G/tp, dv] -> context [s, b, H/tp * dv]
// (dv = d except under multi-latent attention). Holds no parameters.
class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  // attention_mask: [b, 1, s, s] bool (true = may attend), [b, s] int32 document ids (packed
  // documents, model/document_attention.h), or undefined for causal attention.
  virtual at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& attention_mask, double dropout) const = 0;
  // Generation: the step's new tokens over their sequences' cached keys and values, read where the
  // cache holds them. q: [s, b, H/tp, d]; k, v: [s, b, G/tp, d], the new rows, which this writes
  // into the cache -> [s, b, H/tp * d]. Undefined, with nothing written, where the backend cannot:
  // the caller then gathers the rows (LayerKvCache::extend) and calls forward().
  virtual at::Tensor forward_over_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const LayerKvCache& cache) const {
    return {};
  }
  // For a caller that writes the new rows into the cache itself (LayerKvCache::store, at
  // KvCacheStep::store_rows()): whether this backend reads the cache in place for queries like q,
  // and then the attention over it ([s, b, H/tp * d]).
  virtual bool reads_cache_in_place(const at::Tensor& q, const LayerKvCache& cache) const { return false; }
  virtual at::Tensor forward_over_written_cache(const at::Tensor& q, const LayerKvCache& cache) const { return {}; }
};

// A part on the residual stream: takes hidden states already normalised with the norm in front
// of it and returns what is added to the stream.
class LayerPart : public tp::DescribedModule {
 public:
  // The norm in front of this part when its parameters live in the part (norm_in_linear).
  virtual std::optional<NormParams> fused_norm() const = 0;
};

// What a part returns from hidden states whose norm is still pending (forward_after_norm): the
// residual sum it computed (the stream's next value) and its output; or, where it was asked for
// the norm after it (`next`) and its last GEMV could take it, `out` undefined and the output
// already added to that sum with the next norm's first half done (prepared->sum: the stream's
// value after the part).
struct AfterNorm {
  at::Tensor sum;
  at::Tensor out;
  std::optional<kernels::PreparedNorm> prepared;
};

class AttentionBlock : public LayerPart {
 public:
  // forward(pending's norm of base + delta, ...) with the norm computed inside the block's first
  // kernel; nullopt, with nothing run, where the block cannot (the layer then applies the norm).
  // next (may be null): the norm after the block, which its last GEMV may prepare (AfterNorm).
  virtual std::optional<AfterNorm> forward_after_norm(const PendingNorm& pending, const RopeTables* rope,
                                                      const at::Tensor& attention_mask, const LayerKvCache* cache,
                                                      const NormParams* next) {
    return std::nullopt;
  }
  // normed: [s, b, h] ([s/tp, b, h] under sequence parallelism) -> the same shape.
  // rope: tables for the positions, or null without rotary embeddings. cache (generation only):
  // the block appends what it needs of the new tokens and attends over the cached tokens too,
  // under the cache's mask instead of attention_mask.
  virtual at::Tensor forward(const at::Tensor& normed, const RopeTables* rope, const at::Tensor& attention_mask,
                             const LayerKvCache* cache = nullptr) = 0;
};

class FeedForward : public LayerPart {
 public:
  // As AttentionBlock::forward_after_norm.
  virtual std::optional<AfterNorm> forward_after_norm(const PendingNorm& pending, const NormParams* next) { return std::nullopt; }
  // normed: [s, b, h] ([s/tp, b, h] under sequence parallelism) -> the same shape.
  virtual at::Tensor forward(const at::Tensor& normed) = 0;
};

struct LayerSpec {
  std::function<std::shared_ptr<CoreAttention>(const PartContext&)> core_attention;
  std::function<std::shared_ptr<AttentionBlock>(const PartContext&, std::shared_ptr<CoreAttention>)> attention;
  std::function<std::shared_ptr<FeedForward>(const PartContext&)> feed_forward;
  // false: input_layernorm / pre_mlp_layernorm modules of the layer. A part may keep its norm
  // out of its linears regardless (fused_norm() empty: MLA, MoE), and the layer then holds it.
  bool norms_in_linears = true;
};

// The decoder layer of every family built in: self-attention (GQA, optional q/k norm, RoPE)
// over SDPA, norms fused into linear_qkv and linear_fc1, or with --multi-latent-attention MLA
// (model/mla.h; its input norm the layer's input_layernorm); the feed-forward a dense SwiGLU or
// GELU MLP, or on the layers --moe-layer-freq names the MoE layer (its norm then the layer's
// pre_mlp_layernorm, as Megatron-Core's MoE specs).
LayerSpec gpt_layer_spec(const ModelConfig& config);

}  // namespace megatron
