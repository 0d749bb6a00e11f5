#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>
#include <unordered_map>

#include "core/errors.h"

namespace megatron {

AdamW::AdamW(const std::vector<NamedTensor>& params, const TrainConfig& config) : c_(config) {
  at::NoGradGuard no_grad;
  for (const auto& p : params) {
    OptimizerParam op;
    op.name = p.name;
    op.model_param = p.tensor;
    op.master = p.tensor.scalar_type() == at::kFloat ? p.tensor : p.tensor.detach().to(at::kFloat).clone();
    op.main_grad = at::zeros_like(op.master);
    op.exp_avg = at::zeros_like(op.master);
    op.exp_avg_sq = at::zeros_like(op.master);
    op.decay = p.tensor.dim() > 1;  // norms and biases are 1-D
    params_.push_back(std::move(op));
  }
  TORCH_CHECK(!params_.empty(), "AdamW: no parameters");
  step_ = at::zeros({}, params_[0].master.options());
}

void AdamW::zero_grad() {
  for (auto& p : params_) {
    p.main_grad.zero_();
    p.model_param.mutable_grad() = at::Tensor();
  }
}

void AdamW::accumulate_grads() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    at::Tensor& g = p.model_param.mutable_grad();
    if (!g.defined()) continue;
    p.main_grad.add_(g);  // upcasts bf16 gradients into the fp32 accumulator
    g = at::Tensor();
  }
}

double AdamW::grad_norm() const {
  std::vector<at::Tensor> grads;
  for (const auto& p : params_) grads.push_back(p.main_grad);
  auto norms = at::_foreach_norm(grads, 2);
  return at::stack(norms).pow(2).sum().sqrt().item<double>();
}

void AdamW::clip(double total_norm) {
  if (c_.clip_grad <= 0.0) return;
  const double coeff = c_.clip_grad / (total_norm + 1e-6);
  if (coeff >= 1.0) return;
  for (auto& p : params_) p.main_grad.mul_(coeff);
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  step_.add_(1);
  for (bool decay : {true, false}) {
    std::vector<at::Tensor> masters, grads, m, v, steps;
    for (auto& p : params_) {
      if (p.decay != decay) continue;
      masters.push_back(p.master);
      grads.push_back(p.main_grad);
      m.push_back(p.exp_avg);
      v.push_back(p.exp_avg_sq);
      steps.push_back(step_);
    }
    if (masters.empty()) continue;
    at::_fused_adamw_(masters, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, c_.adam_beta1, c_.adam_beta2,
                      decay ? c_.weight_decay : 0.0, c_.adam_eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  copy_master_to_model();
}

void AdamW::copy_master_to_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.master.is_same(p.model_param)) p.model_param.copy_(p.master);
  }
}

std::vector<NamedTensor> AdamW::state() const {
  std::vector<NamedTensor> out;
  for (const auto& p : params_) {
    out.push_back({p.name + ".master", p.master});
    out.push_back({p.name + ".exp_avg", p.exp_avg});
    out.push_back({p.name + ".exp_avg_sq", p.exp_avg_sq});
  }
  out.push_back({"step", step_});
  return out;
}

void AdamW::load_state(const std::vector<NamedTensor>& state, bool load_moments) {
  at::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& t : state) by_name[t.name] = t.tensor;
  auto take = [&](const std::string& name, at::Tensor& into) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw UserError("checkpoint has no optimizer tensor '" + name + "': load with --no-load-optim");
    if (!it->second.sizes().equals(into.sizes())) {
      throw UserError("checkpoint optimizer tensor '" + name + "' has a different shape than the model's");
    }
    into.copy_(it->second);
  };
  for (auto& p : params_) {
    take(p.name + ".master", p.master);
    if (load_moments) {
      take(p.name + ".exp_avg", p.exp_avg);
      take(p.name + ".exp_avg_sq", p.exp_avg_sq);
    }
  }
  if (load_moments) take("step", step_);
  copy_master_to_model();
}

void AdamW::reset_from_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.master.is_same(p.model_param)) p.master.copy_(p.model_param);
  }
}

int64_t AdamW::steps_taken() const { return static_cast<int64_t>(step_.item<float>()); }

}  // namespace megatron
