#include "moe/aux_loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>

namespace megatron::moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AttachLoss : torch::autograd::Function<AttachLoss> {
  // loss_scale: optional, as an undefined tensor cannot be a function's input.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& activation, const at::Tensor& loss, double scale,
                            const std::optional<at::Tensor>& loss_scale) {
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["loss_scale"] = loss_scale.value_or(at::Tensor());
    ctx->saved_data["like"] = at::empty({0}, loss.options());  // the loss's dtype and device, no storage
    // A copy, not the input itself: an autograd function's output may not alias its input here.
    return activation.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const double scale = ctx->saved_data["scale"].toDouble();
    at::Tensor loss_grad = at::full({}, scale, ctx->saved_data["like"].toTensor().options());
    const at::Tensor loss_scale = ctx->saved_data["loss_scale"].toTensor();
    if (loss_scale.defined()) loss_grad = loss_grad * loss_scale.to(loss_grad.scalar_type());
    return {grad[0], loss_grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

const std::vector<BalancingLoss>& balancing_losses() {
  static const std::vector<BalancingLoss> losses = {
      {"aux_loss", "load_balancing_loss"},
      {"seq_aux_loss", "seq_load_balancing_loss"},
      {"global_aux_loss", "global_load_balancing_loss"},
  };
  return losses;
}

at::Tensor attach_loss(const at::Tensor& activation, const at::Tensor& loss, double scale, const at::Tensor& loss_scale) {
  return AttachLoss::apply(activation, loss, scale, loss_scale.defined() ? std::optional<at::Tensor>(loss_scale) : std::nullopt);
}

at::Tensor switch_load_balancing_loss(const at::Tensor& scores, const at::Tensor& counts, int64_t total_tokens, int topk,
                                      int num_experts, double coeff) {
  const double factor = double(num_experts) * coeff / (double(topk) * double(total_tokens) * double(total_tokens));
  return (scores.sum(0) * counts.to(scores.scalar_type())).sum() * factor;
}

at::Tensor z_loss(const at::Tensor& logits, double coeff) {
  return at::logsumexp(logits.to(at::kFloat), {-1}).square().mean() * coeff;
}

std::vector<std::string> tracked_loss_names(const ModelConfig& m) {
  std::vector<std::string> names;
  if (m.num_experts == 0) return names;
  for (const BalancingLoss& loss : balancing_losses()) {
    if (m.aux_loss_coeff(loss.type) > 0) names.push_back(loss.logged_as);
  }
  if (m.moe_z_loss_coeff > 0) names.push_back("z_loss");
  return names;
}

}  // namespace megatron::moe
