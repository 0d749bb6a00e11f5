// One decoder layer, pre-norm: x + dropout(attn(norm(x))), then + dropout(ffn(norm(.))), with
// its parts chosen by a LayerSpec (model/layer_spec.h).
#pragma once

#include <functional>
#include <memory>

#include "model/layer_spec.h"
#include "model/norm_module.h"

namespace megatron {

// The residual stream between layers as a sum not formed yet: hidden = base + delta (delta
// undefined: base alone). A layer hands its MLP output on unadded so that the next layer's
// input norm (or the final norm) adds it in the same kernel (kernels::add_rms_norm).
struct ResidualStream {
  at::Tensor base;   // [s, b, h] ([s/tp, b, h] under sequence parallelism)
  at::Tensor delta;  // same shape, or undefined
  // With delta undefined: the next norm (the one the layer was told of) half done by the GEMV
  // that wrote base (kernels::gemv_into_norm; a batch-1 decode step).
  std::optional<kernels::PreparedNorm> prepared;
  at::Tensor materialize() const;  // base + delta
};

class TransformerLayer : public tp::DescribedModule {
 public:
  // `layer`: the global index of this layer (the spec may choose parts by it). `fp8`: the
  // context its linear layers run their GEMMs in FP8 under (null: not in FP8). `documents`: the
  // packed documents' memo the model's layers share (null: the layer reads them itself).
  TransformerLayer(const ModelConfig& config, const tp::TensorParallel& tp, const LayerSpec& spec,
                   at::Device device = at::kCPU, int layer = 0, std::shared_ptr<fp8::Fp8Context> fp8 = nullptr,
                   std::shared_ptr<DocumentsMemo> documents = nullptr);
  // attention_mask: [b, 1, s, s] bool (true = attend), [b, s] document ids (packed documents), or
  // undefined for plain causal attention.
  at::Tensor forward(const at::Tensor& hidden, const RopeTables* rope, const at::Tensor& attention_mask = {});  // [s, b, h] -> [s, b, h]; [s/tp, b, h] under SP
  // The same on the residual stream; the result's delta is defined when the residual adds are
  // fused with the norms (RMSNorm, --bias-dropout-fusion, no hidden dropout in effect).
  // cache (generation): the attention block's key/value cache for this step. next_norm (a decode
  // step taking the norms in its GEMVs; may be null): the norm after this layer (the next layer's
  // input norm, or the final norm), which the layer's last GEMV may prepare (ResidualStream::prepared).
  ResidualStream forward(const ResidualStream& in, const RopeTables* rope, const at::Tensor& attention_mask = {},
                         const LayerKvCache* cache = nullptr, const NormParams* next_norm = nullptr);

  // The norms in front of the attention block and the feed-forward, wherever their parameters live.
  NormParams input_norm() const;
  NormParams pre_mlp_norm() const;

  std::shared_ptr<AttentionBlock> self_attention;
  std::shared_ptr<FeedForward> mlp;

 private:
  std::shared_ptr<NormModule> input_layernorm_;    // null when the norm lives in the attention block
  std::shared_ptr<NormModule> pre_mlp_layernorm_;  // null when the norm lives in the feed-forward
  double hidden_dropout_;
  bool fuse_add_norm_;  // the residual adds fused with the RMSNorms after them
  // --recompute-modules mlp (a dense MLP) or moe (an MoE layer): the feed-forward runs again in
  // the backward; drawing random numbers (--moe-router-force-load-balancing) the same both times.
  bool recompute_mlp_ = false;
  // --recompute-modules layernorm: the two norms' outputs freed once the attention and the
  // feed-forward have kept them, made again at the start of their backward.
  bool recompute_norms_ = false;
  bool recompute_draws_random_ = false;
  tp::TensorParallel tp_;
  // The feed-forward on the normed input [s(/tp), b, h], recomputed in the backward when asked.
  at::Tensor feed_forward(const at::Tensor& normed);
  // Frees a norm's output [s(/tp), b, h] until the backward reaches its consumer's output.
  void discard_norm_output(const at::Tensor& normed, const at::Tensor& consumer_output, std::function<at::Tensor()> recompute) const;
};

}  // namespace megatron
