// Megatron-Core's TopKRouter: logits = tokens x weight^T, scores by softmax (top-k first, or
// over all experts with --moe-router-pre-softmax) or sigmoid, the top-k experts of each token
// and their weights; the z-loss and load-balancing loss attached for backward (moe/aux_loss.h)
// and tracked for the log line.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <utility>

#include "model/layer_spec.h"

namespace megatron::moe {

struct Routing {
  at::Tensor probs;    // [T, k] each token's weights for its experts, in the tokens' dtype
  at::Tensor indices;  // [T, k] int64 expert ids
  at::Tensor kept;     // [T, k] bool: the pairs within their expert's capacity; undefined: all (dropless)
  // --moe-pad-expert-input-to-capacity: every expert takes exactly this many rows from these T
  // tokens (its kept pairs, then zero rows); 0: as many as it was routed.
  int64_t padded_capacity = 0;
};

// Megatron's group-limited top-k: experts in `groups` equal groups, each group scored by the sum of
// its top (k / group_topk) scores, a token's k experts chosen among its group_topk best groups.
// scores [T, E] -> (values, indices) [T, k].
std::tuple<at::Tensor, at::Tensor> group_limited_topk(const at::Tensor& scores, int64_t k, int64_t groups, int64_t group_topk);

// Megatron's sinkhorn routing (--moe-router-load-balancing-type sinkhorn), balanced by
// construction rather than by a loss. In training a token's k experts are the top k of
// sinkhorn(logits); at inference the top k of its weights. The weights are sigmoid(logits) for
// k = 1, else the softmax over all experts, in the logits' dtype and not renormalised over the k.
// logits [T, E] -> (probs, indices) [T, k].
std::pair<at::Tensor, at::Tensor> sinkhorn_routing(const at::Tensor& logits, int64_t k, bool training);

// exp(cost) with its rows and columns rescaled alternately towards sums of 1/T and 1/E, until
// the column scales move by less than `tolerance` on average (one host read per round).
// cost [T, E] -> [T, E] fp32.
at::Tensor sinkhorn(const at::Tensor& cost, double tolerance = 1e-4);

// Megatron's expert capacity for T tokens routed to k of E experts: ceil(T k / E x factor).
int64_t expert_capacity(int64_t tokens, int64_t topk, int64_t num_experts, double capacity_factor);

// Megatron's token dropping (--moe-expert-capacity-factor): each of `num_experts` experts takes
// at most ceil(T k / E x factor) of the T tokens routed here; `policy` probs keeps those with the
// highest weights, position the first in token order. probs, indices: [T, k] -> kept [T, k] bool.
at::Tensor within_capacity(const at::Tensor& probs, const at::Tensor& indices, int num_experts, double capacity_factor,
                           const std::string& policy);

class TopKRouter : public tp::DescribedModule {
 public:
  explicit TopKRouter(const PartContext& context);
  // tokens [T, h] (T = s * b in [s, b] order; this rank's sequence shard under sequence
  // parallelism) of `batch` sequences.
  Routing forward(const at::Tensor& tokens, int64_t batch);

  // The gradient the attached losses enter backward with (the main loss's 1 / micro-batches),
  // times `fp16_loss_scale` ([] fp32 on the device, --fp16) when defined.
  void set_loss_scale(double scale, const at::Tensor& fp16_loss_scale = {}) {
    loss_scale_ = scale;
    fp16_loss_scale_ = fp16_loss_scale;
  }
  // The tracked losses of the forwards since the last call, each times the loss scale, in the
  // order of tracked_loss_names, as this rank's share: summed over TP they are Megatron's
  // values (load balancing: aux / coeff; z: mean logsumexp^2). [n] fp32, or undefined.
  at::Tensor take_tracked();

  // --moe-router-enable-expert-bias: this step's tokens per expert so far ([E] fp32, this rank's;
  // reset), and the bias moved by rate x sign(mean - count) of the step's counts summed over
  // every rank sharing the batch.
  at::Tensor take_expert_counts();
  void update_expert_bias(const at::Tensor& counts);

  at::Tensor weight;       // [E, h], replicated
  at::Tensor expert_bias;  // [E] fp32, replicated, not trained (--moe-router-enable-expert-bias; HF e_score_correction_bias)

 private:
  at::Tensor logits_of(const at::Tensor& tokens) const;  // [T, E] in the router's dtype
  // Megatron's topk_routing_with_score_function: each token's k experts and their weights [T, k].
  std::pair<at::Tensor, at::Tensor> choose(const at::Tensor& logits) const;
  // probs with each load-balancing loss that has a coefficient attached for backward and tracked.
  at::Tensor attach_balancing_losses(at::Tensor probs, const at::Tensor& logits, int64_t batch);
  void track(int slot, const at::Tensor& value);

  // A copy: the model may outlive the configuration it was built from (generation loads one).
  const ModelConfig config_;
  tp::TensorParallel tp_;
  double loss_scale_ = 1.0;
  at::Tensor fp16_loss_scale_;
  at::Tensor tracked_;  // [n] fp32
  int64_t tracked_count_ = 0;  // tracked_loss_names(config).size()
  at::Tensor global_counts_;    // global_aux_loss: [E] tokens per expert over this step's micro-batches
  int64_t global_micro_batches_ = 0;
  at::Tensor expert_counts_;    // expert bias: [E] fp32 tokens routed to each expert this step
};

}  // namespace megatron::moe
