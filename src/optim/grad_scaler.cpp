#include "optim/grad_scaler.h"

#include <ATen/ATen.h>

#include "core/errors.h"

namespace megatron {

GradScaler::GradScaler(const TrainConfig& c, const at::Device& device)
    : dynamic_(c.loss_scale <= 0.0),
      min_scale_(c.min_loss_scale),
      growth_interval_(c.loss_scale_window),
      hysteresis_(double(c.hysteresis)) {
  const auto options = at::TensorOptions().device(device).dtype(at::kFloat);
  scale_ = at::full({}, dynamic_ ? c.initial_loss_scale : c.loss_scale, options);
  growth_tracker_ = at::zeros({}, options);
  hysteresis_tracker_ = at::full({}, hysteresis_, options);
}

void GradScaler::update(const at::Tensor& found_inf) {
  if (!dynamic_) return;
  const at::Tensor overflow = found_inf.to(scale_.device()).to(at::kBool);
  // Megatron's branches, as selections: an overflow resets the growth count, spends one unit of
  // hysteresis, and with none left backs the scale off; a finite step counts towards growth.
  at::Tensor growth = at::where(overflow, at::zeros_like(growth_tracker_), growth_tracker_ + 1.0);
  at::Tensor hysteresis = at::where(overflow, hysteresis_tracker_ - 1.0, hysteresis_tracker_);
  at::Tensor scale = at::where(overflow.logical_and(hysteresis <= 0.0), (scale_ * 0.5).clamp_min(min_scale_), scale_);
  const at::Tensor grow = overflow.logical_not().logical_and(growth == growth_interval_);
  growth = at::where(grow, at::zeros_like(growth), growth);
  hysteresis = at::where(grow, at::full_like(hysteresis, hysteresis_), hysteresis);
  scale = at::where(grow, scale * 2.0, scale);
  // In place: a captured step graph keeps reading and writing the same storage.
  scale_.copy_(scale);
  growth_tracker_.copy_(growth);
  hysteresis_tracker_.copy_(hysteresis);
}

GradScalerState GradScaler::state() const {
  const at::Tensor host = at::stack({scale_, growth_tracker_, hysteresis_tracker_}).to(at::kCPU, at::kDouble);
  const double* v = host.data_ptr<double>();
  return {v[0], v[1], v[2]};
}

void GradScaler::load_state(const GradScalerState& s) {
  if (!dynamic_) return;  // a constant scale is the flag's, as Megatron's ConstantGradScaler
  if (!(s.scale > 0.0)) throw UserError("checkpoint: the loss scaler's scale is " + std::to_string(s.scale) + ", not positive");
  scale_.fill_(s.scale);
  growth_tracker_.fill_(s.growth_tracker);
  hysteresis_tracker_.fill_(s.hysteresis_tracker);
}

}  // namespace megatron
