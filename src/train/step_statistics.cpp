#include "train/step_statistics.h"

#include <ATen/ATen.h>

namespace megatron {

void StepStatistics::add(const at::Tensor& loss, const at::Tensor& grad_norm, const at::Tensor& applied) {
  const at::Tensor counted = at::where(applied, loss.to(at::kDouble), 0.0);
  const at::Tensor skipped = applied.logical_not().to(at::kLong);
  if (iterations_ == 0) {
    applied_loss_sum_ = counted;
    skipped_ = skipped;
  } else {
    applied_loss_sum_ = applied_loss_sum_ + counted;
    skipped_ = skipped_ + skipped;
  }
  last_grad_norm_ = grad_norm;
  ++iterations_;
}

StepStatistics::Totals StepStatistics::take() {
  Totals t;
  if (iterations_ == 0) return t;
  // One device-to-host copy for all three.
  const at::Tensor host = at::stack({applied_loss_sum_, skipped_.to(at::kDouble), last_grad_norm_.to(at::kDouble)}).cpu();
  const double* v = host.data_ptr<double>();
  t.iterations = iterations_;
  t.applied_loss_sum = v[0];
  t.skipped = static_cast<int64_t>(v[1]);
  t.last_grad_norm = v[2];
  iterations_ = 0;
  return t;
}

}  // namespace megatron
