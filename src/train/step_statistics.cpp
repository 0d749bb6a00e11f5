#include "train/step_statistics.h"

#include <ATen/ATen.h>

namespace megatron {

void StepStatistics::add(const at::Tensor& loss, const at::Tensor& grad_norm, const at::Tensor& applied) {
  const at::Tensor loss64 = loss.to(at::kDouble);
  const at::Tensor counted = at::where(applied, loss64, 0.0);
  const at::Tensor skipped = applied.logical_not();
  // [loss sum of the applied, skipped, skipped with a loss that is not finite, loss sum of all]
  const at::Tensor row =
      at::stack({counted, skipped.to(at::kDouble), skipped.logical_and(loss.isfinite().logical_not()).to(at::kDouble), loss64});
  sums_ = iterations_ == 0 ? row : sums_ + row;
  last_grad_norm_ = grad_norm;
  last_applied_ = applied;
  ++iterations_;
}

StepStatistics::Totals StepStatistics::take() {
  Totals t;
  if (iterations_ == 0) return t;
  // One device-to-host copy for all of them.
  const at::Tensor host =
      at::cat({sums_, last_grad_norm_.to(at::kDouble).reshape({1}), last_applied_.to(at::kDouble).reshape({1})}).cpu();
  const double* v = host.data_ptr<double>();
  t.iterations = iterations_;
  t.applied_loss_sum = v[0];
  t.skipped = static_cast<int64_t>(v[1]);
  t.nan = static_cast<int64_t>(v[2]);
  t.loss_sum = v[3];
  t.last_grad_norm = v[4];
  t.last_applied = v[5] != 0.0;
  iterations_ = 0;
  return t;
}

}  // namespace megatron
