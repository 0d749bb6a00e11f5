// The mixture-of-experts feed-forward (Megatron-Core's MoELayer): a router picks each token's
// top-k experts, a token dispatcher brings the tokens to the ranks holding those experts, the
// experts run, and the weighted results come back; shared experts (Qwen2-MoE, DeepSeek) run on
// every token beside them, optionally behind a sigmoid gate.
//
// Under tensor parallelism (which needs sequence parallelism here, as in Megatron) each TP rank
// routes its own sequence shard. The experts' weights are split over the expert-TP ranks
// (--expert-tensor-parallel-size, by default the TP ranks) like the dense MLP's: the tokens and
// their routing are gathered over them and the partial outputs reduce-scattered back. With expert
// TP 1 under TP each rank sends its own shard's tokens to the experts' ranks.
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
  bool recompute_shared_;  // --recompute-modules shared_experts: their activations recomputed in backward
};

}  // namespace megatron::moe
