#include "moe/router.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "moe/aux_loss.h"
#include "moe/counts.h"
#include "tensor_parallel/mappings.h"

namespace megatron::moe {

std::tuple<at::Tensor, at::Tensor> group_limited_topk(const at::Tensor& scores, int64_t k, int64_t groups, int64_t group_topk) {
  const int64_t T = scores.size(0), E = scores.size(1), per_group = E / groups;
  const at::Tensor group_scores = std::get<0>(scores.view({T, groups, per_group}).topk(k / group_topk, -1)).sum(-1);  // [T, G]
  const at::Tensor chosen = std::get<1>(group_scores.topk(group_topk, -1, /*largest=*/true, /*sorted=*/false));   // [T, gk]
  const at::Tensor in_group = at::zeros({T, groups}, scores.options().dtype(at::kBool)).scatter_(1, chosen, true);
  const at::Tensor allowed = in_group.unsqueeze(-1).expand({T, groups, per_group}).reshape({T, E});
  return scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity()).topk(k, 1);
}

at::Tensor sinkhorn(const at::Tensor& cost, double tolerance) {
  at::NoGradGuard no_grad;
  const at::Tensor weights = cost.to(at::kFloat).exp();  // [T, E]
  const double T = double(weights.size(0)), E = double(weights.size(1));
  constexpr double eps = 1e-8;  // an all-underflowed row or column scales to 1 / eps, not inf
  at::Tensor row_scale;                                 // [T]
  at::Tensor column_scale = at::ones({weights.size(1)}, weights.options());  // [E]
  double moved = std::numeric_limits<double>::infinity();
  while (moved > tolerance) {
    row_scale = (1.0 / T) / ((column_scale * weights).sum(1) + eps);
    const at::Tensor next = (1.0 / E) / ((row_scale.unsqueeze(1) * weights).sum(0) + eps);
    moved = (column_scale - next).abs().mean().item<double>();
    column_scale = next;
  }
  return column_scale * weights * row_scale.unsqueeze(1);
}

std::pair<at::Tensor, at::Tensor> sinkhorn_routing(const at::Tensor& logits, int64_t k, bool training) {
  const at::Tensor weights = k == 1 ? at::sigmoid(logits) : at::softmax(logits, -1, at::kFloat).to(logits.scalar_type());  // [T, E]
  const at::Tensor indices = std::get<1>((training ? sinkhorn(logits) : weights.detach()).topk(k, 1));                  // [T, k]
  return {weights.gather(1, indices), indices};
}

int64_t expert_capacity(int64_t tokens, int64_t topk, int64_t num_experts, double capacity_factor) {
  return int64_t(std::ceil(double(tokens * topk) / double(num_experts) * capacity_factor));
}

at::Tensor within_capacity(const at::Tensor& probs, const at::Tensor& indices, int num_experts, double capacity_factor,
                           const std::string& policy) {
  const int64_t T = probs.size(0), k = probs.size(1);
  const int64_t capacity = expert_capacity(T, k, num_experts, capacity_factor);
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
  if (c.moe_router_enable_expert_bias) {
    tp::ParamInfo bias;
    bias.init = tp::Init::Zeros;
    bias.trainable = false;
    bias.keep_fp32 = true;
    expert_bias = add_parameter("expert_bias", at::zeros({c.num_experts}, at::TensorOptions().device(ctx.device)), bias);
  }
  tracked_count_ = int64_t(tracked_loss_names(c).size());
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
  // Under the loss scale: 1 / micro-batches, and under context parallelism CP times each CP
  // rank's share, so the log line's average over CP is the whole sequence's value.
  tracked_.select(0, slot).add_(value.detach().to(at::kFloat) * loss_scale_);
}

at::Tensor TopKRouter::take_tracked() {
  at::Tensor out = tracked_;
  tracked_ = at::Tensor();
  global_counts_ = at::Tensor();  // global_aux_loss averages over one step's micro-batches
  global_micro_batches_ = 0;
  return out;
}

at::Tensor TopKRouter::attach_balancing_losses(at::Tensor probs, const at::Tensor& logits, int64_t batch) {
  const ModelConfig& c = config_;
  const int64_t E = c.num_experts, k = c.moe_router_topk, T = logits.size(0);
  // Counted over the sequence's shards: TP ranks' (sequence parallel) and CP ranks' chunks.
  const int tp = tp_.size(), cp = tp_.context.size(), dp = tp_.data.size();
  auto count_over_sequence = [&](at::Tensor& counts) {
    if (tp > 1) tp_.group.all_reduce(counts);
    if (cp > 1) tp_.context.all_reduce(counts);
  };
  at::Tensor scores, routed;  // [T, E]: the scores and top-k of the losses, over all experts whatever the routing did
  int slot = 0;
  for (const BalancingLoss& kind : balancing_losses()) {
    const double coeff = c.aux_loss_coeff(kind.type);
    if (coeff <= 0) continue;
    if (!scores.defined()) {
      scores = c.moe_router_score_function == "softmax" ? at::softmax(logits, -1, at::kFloat) : at::sigmoid(logits.to(at::kFloat));
      if (c.moe_router_score_function != "softmax") scores = scores / (scores.sum(-1, true) + 1e-20);
      routed = at::zeros({T, E}, scores.options()).scatter_(1, std::get<1>(scores.topk(k, 1)), 1.0);
    }
    at::Tensor loss;
    double shown = 1.0;  // the log line shows loss / coeff, times this
    if (kind.type == "seq_aux_loss") {
      // Per sequence, as [s, b * E] columns (each sequence's experts apart), averaged over them.
      const at::Tensor seq_scores = scores.reshape({T / batch, batch * E}), seq_routed = routed.reshape({T / batch, batch * E});
      at::Tensor counts = seq_routed.sum(0);
      count_over_sequence(counts);
      loss = switch_load_balancing_loss(seq_scores, counts, (T / batch) * tp * cp, int(k), int(E), coeff) / double(batch);
    } else {
      at::Tensor counts = routed.sum(0);  // [E]
      int64_t total = T * tp;
      if (kind.type != "global_aux_loss") {
        count_over_sequence(counts);
        total *= cp;
      } else {
        // Over every TP rank, then every data-parallel (and context-parallel) replica, averaged
        // over the step's micro-batches so far.
        if (tp > 1) tp_.group.all_reduce(counts);
        if (dp > 1) tp_.data.all_reduce(counts);
        global_counts_ = global_counts_.defined() ? global_counts_ + counts : counts;
        counts = global_counts_ / double(++global_micro_batches_);
        total *= dp;
        // Each rank's share of the batch's loss: the log line averages over DP, Megatron sums.
        // (CP ranks' shares are tracked CP times already, under the loss scale.)
        shown = double(dp / cp);
      }
      loss = switch_load_balancing_loss(scores, counts, total, int(k), int(E), coeff);
    }
    probs = attach_loss(probs, loss, loss_scale_, fp16_loss_scale_);
    track(slot++, loss / coeff * shown);
  }
  return probs;
}

Routing TopKRouter::forward(const at::Tensor& tokens, int64_t batch) {
  const ModelConfig& c = config_;
  const int64_t E = c.num_experts, k = c.moe_router_topk, T = tokens.size(0);
  at::Tensor logits = logits_of(tokens);  // [T, E]
  if (c.moe_router_force_load_balancing) logits = at::randn_like(logits);  // balanced on average (benchmarks)
  const bool losses = is_training() && at::GradMode::is_enabled();
  const int tp = tp_.size(), cp = tp_.context.size();
  if (losses && c.moe_z_loss_coeff > 0) {
    // Each TP and CP rank's mean over its own tokens: the coefficient is shared out over both
    // (TP ranks' gradients are summed; CP ranks' averaged, with the losses scaled up by CP).
    const at::Tensor z = z_loss(logits, c.moe_z_loss_coeff / (tp * cp));
    logits = attach_loss(logits, z, loss_scale_, fp16_loss_scale_);
    // mean logsumexp^2 / (tp cp), summed over TP, tracked under the loss scale (CP times) and
    // averaged over CP: the mean; z_loss is tracked last
    track(int(tracked_count_) - 1, z / c.moe_z_loss_coeff);
  }

  auto [probs, indices] = choose(logits);  // [T, k]
  if (c.moe_router_topk_scaling_factor > 0) probs = probs * c.moe_router_topk_scaling_factor;
  probs = probs.to(tokens.scalar_type());
  at::Tensor kept;  // [T, k], as Megatron drops before the balancing loss (which does not see it)
  int64_t padded_capacity = 0;
  if (c.moe_expert_capacity_factor > 0) {
    kept = within_capacity(probs, indices, int(E), c.moe_expert_capacity_factor, c.moe_token_drop_policy);
    if (c.moe_pad_expert_input_to_capacity) padded_capacity = expert_capacity(T, k, E, c.moe_expert_capacity_factor);
  }

  if (losses && expert_bias.defined()) {
    // The routed (token, expert) pairs, after dropping, counted for the bias update.
    at::NoGradGuard no_grad;
    at::Tensor chosen = indices.reshape({-1});
    if (kept.defined()) chosen = at::where(kept.reshape({-1}), chosen, at::full({}, E, chosen.options()));  // dropped: bin E
    const at::Tensor counts = count_per_value(chosen, E + 1).narrow(0, 0, E).to(at::kFloat);
    expert_counts_ = expert_counts_.defined() ? expert_counts_ + counts : counts;
  }
  if (losses) probs = attach_balancing_losses(probs, logits, batch);
  return {probs, indices, kept, padded_capacity};
}

std::pair<at::Tensor, at::Tensor> TopKRouter::choose(const at::Tensor& logits) const {
  const ModelConfig& c = config_;
  const int64_t k = c.moe_router_topk;
  if (c.routes_by_sinkhorn()) return sinkhorn_routing(logits, k, is_training());
  auto topk = [&](const at::Tensor& scores) {
    return c.moe_router_num_groups > 0 ? group_limited_topk(scores, k, c.moe_router_num_groups, c.moe_router_group_topk)
                                       : scores.topk(k, 1);
  };
  at::Tensor probs, indices;  // [T, k]
  if (c.moe_router_score_function == "softmax") {
    if (c.moe_router_pre_softmax) {
      std::tie(probs, indices) = topk(at::softmax(logits, -1, at::kFloat));
    } else {
      at::Tensor top;
      std::tie(top, indices) = topk(logits);
      probs = at::softmax(top, -1, at::kFloat);
    }
    return {probs, indices};
  }
  // sigmoid, renormalised over the chosen experts; an expert bias steers the choice only.
  const at::Tensor scores = at::sigmoid(logits.to(at::kFloat));  // [T, E]
  if (expert_bias.defined()) {
    indices = std::get<1>(topk(scores + expert_bias.to(at::kFloat)));
    probs = scores.gather(1, indices);
  } else {
    std::tie(probs, indices) = topk(scores);
  }
  if (k > 1) probs = probs / (probs.sum(-1, true) + 1e-20);
  return {probs, indices};
}

at::Tensor TopKRouter::take_expert_counts() {
  at::Tensor counts = expert_counts_.defined() ? expert_counts_ : at::zeros({config_.num_experts}, expert_bias.options().dtype(at::kFloat));
  expert_counts_ = at::Tensor();
  return counts;
}

void TopKRouter::update_expert_bias(const at::Tensor& counts) {
  at::NoGradGuard no_grad;
  // Under-loaded experts up, over-loaded down (Megatron's get_updated_expert_bias).
  const at::Tensor mean = counts.sum() / double(config_.num_experts);
  expert_bias.add_(at::sign(mean - counts).to(expert_bias.scalar_type()) * config_.moe_router_bias_update_rate);
}

}  // namespace megatron::moe
