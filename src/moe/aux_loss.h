// The router's auxiliary losses with Megatron-Core's formulas (moe_utils.py) and the way their
// gradients reach backward. A layer adds them where it computes them (Megatron's
// MoEAuxLossAutoScaler): the loss rides on an activation through an autograd function whose
// backward hands the loss a gradient of `scale` (the main loss's 1 / micro-batches; times the
// loss scale under --fp16, as the main loss enters backward scaled). That works
// on every pipeline stage, where a loss function on the last stage could not see them; the
// values are tracked apart for the log line.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron::moe {

// `activation` unchanged, with `loss` ([] scalar) entering backward with gradient `scale`
// (times `loss_scale`, [] fp32 on the loss's device, when defined).
at::Tensor attach_loss(const at::Tensor& activation, const at::Tensor& loss, double scale, const at::Tensor& loss_scale = {});

// Switch Transformer's load-balancing loss: scores [T, E'] of this rank's tokens, counts [E']
// tokens routed to each (summed over every rank sharing the batch), T_total tokens in that batch:
//   E * coeff / (k * T_total^2) * sum_i (sum_t scores_ti) * counts_i
at::Tensor switch_load_balancing_loss(const at::Tensor& scores, const at::Tensor& counts, int64_t total_tokens, int topk,
                                      int num_experts, double coeff);

// ST-MoE's router z-loss: coeff * mean_t(logsumexp(logits_t)^2), logits [T, E].
at::Tensor z_loss(const at::Tensor& logits, double coeff);

// Megatron's load-balancing losses: the --moe-router-load-balancing-type that selects each and the
// name its value is logged under. aux_loss: over each micro-batch; seq_aux_loss: per sequence,
// averaged; global_aux_loss: expert counts over the whole data-parallel batch, averaged over the
// step's micro-batches so far.
struct BalancingLoss {
  std::string type;
  std::string logged_as;
};
const std::vector<BalancingLoss>& balancing_losses();

// The names of the router losses `model` tracks, as Megatron logs them, in this order: the
// balancing losses with a coefficient (balancing_losses' order), then z_loss with a z-loss
// coefficient.
std::vector<std::string> tracked_loss_names(const ModelConfig& model);

}  // namespace megatron::moe
