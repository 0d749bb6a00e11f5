// The mixture-of-experts feed-forward (Megatron-Core's MoELayer): a router picks each token's
// top-k experts, a token dispatcher brings the tokens to the ranks holding those experts, the
// experts run, and the weighted results come back; shared experts (Qwen2-MoE, DeepSeek) run on
// every token beside them, optionally behind a sigmoid gate.
//
// Under tensor parallelism (which needs sequence parallelism here, as in Megatron) each TP rank
// routes its own sequence shard; the tokens and their routing are then gathered over TP, the
// experts' weights are split over TP like the dense MLP's, and the partial outputs are
// reduce-scattered back to the shards.
#pragma once

#include <memory>

#include "model/layer_spec.h"
#include "model/mlp.h"
#include "moe/experts.h"
#include "moe/router.h"
#include "moe/token_dispatcher.h"

namespace megatron::moe {

class MoELayer : public FeedForward {
 public:
  explicit MoELayer(const PartContext& context);
  at::Tensor forward(const at::Tensor& normed) override;  // [s, b, h] -> [s, b, h] ([s/tp, b, h] under SP)
  // The layer's pre-MLP norm is a module of the layer (`pre_mlp_layernorm`), as Megatron's MoE specs.
  std::optional<NormParams> fused_norm() const override { return std::nullopt; }

  std::shared_ptr<TopKRouter> router;
  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<MLP> shared_experts;  // null without --moe-shared-expert-intermediate-size
  at::Tensor shared_gate_weight;        // [1, h] with --moe-shared-expert-gate (`shared_experts.gate_weight`)

 private:
  at::Tensor shared_output(const at::Tensor& normed) const;  // the shared experts (behind their gate): [s, b, h]

  TokenDispatcher dispatcher_;
  tp::TensorParallel tp_;
  bool overlap_shared_;
};

}  // namespace megatron::moe
