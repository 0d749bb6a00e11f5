#include "model/layer_spec.h"

#include "model/attention.h"
#include "model/context_parallel_attention.h"
#include "model/core_attention.h"
#include "model/mla.h"
#include "model/mlp.h"
#include "moe/moe_layer.h"

namespace megatron {

LayerSpec gpt_layer_spec(const ModelConfig& config) {
  LayerSpec spec;
  if (config.multi_latent_attention) {
    // Megatron's MLA spec: its own softmax scale (YaRN's mscale squared), the input norm a module
    // of the layer.
    spec.core_attention = [](const PartContext& ctx) -> std::shared_ptr<CoreAttention> {
      const double scale = MultiLatentAttention::softmax_scale(ctx.config);
      if (ctx.tp.context.size() > 1) {
        return std::make_shared<ContextParallelAttention>(ctx.tp, ctx.config.cp_comm_type_of(ctx.layer), scale, ctx.documents);
      }
      return std::make_shared<SdpaAttention>(ctx.tp, scale, ctx.documents);
    };
    spec.attention = [](const PartContext& ctx, std::shared_ptr<CoreAttention> core) -> std::shared_ptr<AttentionBlock> {
      return std::make_shared<MultiLatentAttention>(ctx, std::move(core));
    };
  } else {
    spec.core_attention = [](const PartContext& ctx) -> std::shared_ptr<CoreAttention> {
      if (ctx.tp.context.size() > 1) {
        return std::make_shared<ContextParallelAttention>(ctx.tp, ctx.config.cp_comm_type_of(ctx.layer), std::nullopt, ctx.documents);
      }
      return std::make_shared<SdpaAttention>(ctx.tp, std::nullopt, ctx.documents);
    };
    spec.attention = [](const PartContext& ctx, std::shared_ptr<CoreAttention> core) -> std::shared_ptr<AttentionBlock> {
      return std::make_shared<SelfAttention>(ctx, std::move(core));
    };
  }
  spec.feed_forward = [](const PartContext& ctx) -> std::shared_ptr<FeedForward> {
    if (ctx.config.is_moe_layer(ctx.layer)) return std::make_shared<moe::MoELayer>(ctx);
    return std::make_shared<MLP>(ctx);
  };
  spec.norms_in_linears = true;
  return spec;
}

}  // namespace megatron
