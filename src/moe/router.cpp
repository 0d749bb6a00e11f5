#include "moe/router.h"

#include <ATen/ATen.h>

#include <cmath>

#include "moe/aux_loss.h"
#include "tensor_parallel/mappings.h"

namespace megatron::moe {

at::Tensor within_capacity(const at::Tensor& probs, const at::Tensor& indices, int num_experts, double capacity_factor,
                           const std::string& policy) {
  const int64_t T = probs.size(0), k = probs.size(1);
  const int64_t capacity = int64_t(std::ceil(double(T * k) / num_experts * capacity_factor));
  if (capacity >= T) return at::ones_like(indices, at::kBool);  // no expert can overflow
  at::NoGradGuard no_grad;
  const at::Tensor routed = at::zeros({T, num_experts}, probs.options().dtype(at::kBool)).scatter_(1, indices, true);  // [T, E]
  at::Tensor keep;  // [T, E]
  if (policy == "position") {
    // The first `capacity` tokens routed to each expert, in token order.
    keep = routed & (routed.to(at::kInt).cumsum(0) <= capacity);
  } else {
    // The `capacity` highest weights of each expert's column (tokens not routed there weigh 0).
    const at::Tensor weights = at::zeros({T, num_experts}, probs.options().dtype(at::kFloat)).scatter_(1, indices, probs.to(at::kFloat));
    const at::Tensor top = std::get<1>(weights.topk(capacity, 0, /*largest=*/true, /*sorted=*/false));  // [capacity, E]
    keep = routed & at::zeros_like(routed).scatter_(0, top, true);
  }
  return keep.gather(1, indices);  // [T, k]
}

TopKRouter::TopKRouter(const PartContext& ctx) : config_(ctx.config), tp_(ctx.tp) {
  const ModelConfig& c = ctx.config;
  // Each TP rank routes its own sequence shard: its gradient is a partial sum over TP.
  tp::ParamInfo info = tp::sequence_sharded_replica(ctx.tp, tp::Init::Normal);
  weight = add_parameter("weight", at::empty({c.num_experts, c.hidden_size}, at::TensorOptions().device(ctx.device)), info);
  const std::vector<std::string> names = tracked_loss_names(c);
  tracked_count_ = int64_t(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "z_loss") z_slot_ = int(i);
    else balancing_slot_ = int(i);
  }
}

at::Tensor TopKRouter::logits_of(const at::Tensor& tokens) const {
  const std::string& dtype = config_.moe_router_dtype;
  if (dtype.empty()) return at::linear(tokens, weight);
  const at::ScalarType t = dtype == "fp64" ? at::kDouble : at::kFloat;
  return at::linear(tokens.to(t), weight.to(t));
}

void TopKRouter::track(int slot, const at::Tensor& value) {
  if (!tracked_.defined()) {
    tracked_ = at::zeros({tracked_count_}, value.options().dtype(at::kFloat));
  }
  tracked_.select(0, slot).add_(value.detach().to(at::kFloat) * loss_scale_);
}

at::Tensor TopKRouter::take_tracked() {
  at::Tensor out = tracked_;
  tracked_ = at::Tensor();
  return out;
}

Routing TopKRouter::forward(const at::Tensor& tokens, int64_t batch) {
  const ModelConfig& c = config_;
  const int64_t E = c.num_experts, k = c.moe_router_topk, T = tokens.size(0);
  at::Tensor logits = logits_of(tokens);  // [T, E]
  if (c.moe_router_force_load_balancing) logits = at::randn_like(logits);  // balanced on average (benchmarks)
  const bool losses = is_training() && at::GradMode::is_enabled();
  const int tp = tp_.size();
  if (losses && c.moe_z_loss_coeff > 0) {
    // Each TP rank's mean over its own tokens: the coefficient is shared out over TP.
    const at::Tensor z = z_loss(logits, c.moe_z_loss_coeff / tp);
    logits = attach_loss(logits, z, loss_scale_);
    track(z_slot_, z / c.moe_z_loss_coeff);  // mean logsumexp^2 / tp: summed over TP, the mean
  }

  at::Tensor probs, indices;  // [T, k]
  if (c.moe_router_score_function == "softmax") {
    if (c.moe_router_pre_softmax) {
      std::tie(probs, indices) = at::softmax(logits, -1, at::kFloat).topk(k, 1);
    } else {
      at::Tensor top;
      std::tie(top, indices) = logits.topk(k, 1);
      probs = at::softmax(top, -1, at::kFloat);
    }
  } else {  // sigmoid, renormalised over the chosen experts
    at::Tensor scores;
    std::tie(scores, indices) = at::sigmoid(logits.to(at::kFloat)).topk(k, 1);
    probs = k > 1 ? scores / (scores.sum(-1, true) + 1e-20) : scores;
  }
  if (c.moe_router_topk_scaling_factor > 0) probs = probs * c.moe_router_topk_scaling_factor;
  probs = probs.to(tokens.scalar_type());
  at::Tensor kept;  // [T, k], as Megatron drops before the balancing loss (which does not see it)
  if (c.moe_expert_capacity_factor > 0) {
    kept = within_capacity(probs, indices, int(E), c.moe_expert_capacity_factor, c.moe_token_drop_policy);
  }

  if (losses && balancing_slot_ >= 0) {
    // The scores and top-k of the loss: over all experts, whatever the routing did.
    at::Tensor scores = c.moe_router_score_function == "softmax" ? at::softmax(logits, -1, at::kFloat)
                                                                 : at::sigmoid(logits.to(at::kFloat));
    if (c.moe_router_score_function != "softmax") scores = scores / (scores.sum(-1, true) + 1e-20);
    const at::Tensor chosen = std::get<1>(scores.topk(k, 1));
    at::Tensor routed = at::zeros({T, E}, scores.options()).scatter_(1, chosen, 1.0);  // [T, E]
    // seq_aux_loss: per sequence, as [s, b * E] columns (each sequence's experts apart),
    // averaged over the sequences.
    const int64_t sequences = c.moe_router_load_balancing_type == "seq_aux_loss" ? batch : 1;
    scores = scores.reshape({T / sequences, sequences * E});
    routed = routed.reshape({T / sequences, sequences * E});
    at::Tensor counts = routed.sum(0);  // over the sequence shards of every TP rank
    if (tp > 1) tp_.group.all_reduce(counts);
    const at::Tensor loss =
        switch_load_balancing_loss(scores, counts, (T / sequences) * tp, int(k), int(E), c.moe_aux_loss_coeff) / double(sequences);
    probs = attach_loss(probs, loss, loss_scale_);
    track(balancing_slot_, loss / c.moe_aux_loss_coeff);
  }
  return {probs, indices, kept};
}

}  // namespace megatron::moe
