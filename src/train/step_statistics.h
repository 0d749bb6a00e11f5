// Training statistics kept on the device between log intervals. An iteration's loss, gradient
// norm and whether its update was applied are known on the GPU only after the step's kernels
// have run; reading them back every iteration would stall the host until the GPU drains (about
// 5 ms of idle GPU per step at the 1.1B reference shape). They are accumulated here instead and
// read once per log interval, checkpoint or exit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace megatron {

class StepStatistics {
 public:
  struct Totals {
    int64_t iterations = 0;       // added since the last take()
    int64_t skipped = 0;          // of which the update was skipped (loss or grad norm not finite)
    int64_t nan = 0;              // of those, the ones whose loss was not finite (Megatron's nan iterations)
    double applied_loss_sum = 0;  // the losses of the applied ones
    double loss_sum = 0;          // the losses of all of them (NaN if any was)
    double last_grad_norm = 0;    // of the latest iteration
    bool last_applied = true;     // whether the latest iteration's update was applied
  };

  // loss: [] (any float dtype), grad_norm: [] fp32, applied: [] bool, all on one device.
  void add(const at::Tensor& loss, const at::Tensor& grad_norm, const at::Tensor& applied);
  // One host synchronisation: the totals since the last take(), then starts over.
  Totals take();

 private:
  at::Tensor sums_;            // [4] fp64: the applied iterations' loss sum, skipped, skipped with a non-finite loss, every loss's sum
  at::Tensor last_grad_norm_;  // [] fp32
  at::Tensor last_applied_;    // [] bool
  int64_t iterations_ = 0;
};

}  // namespace megatron
