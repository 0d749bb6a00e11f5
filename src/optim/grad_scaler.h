// Loss scaling for fp16 training, as Megatron-Core's grad_scaler.py: the loss enters backward
// multiplied by `scale()` so that small gradients survive fp16's range, and the optimizer divides
// the gradients by it again. Dynamic scaling (Megatron's DynamicGradScaler): a step whose
// gradients are not finite is skipped; once `hysteresis` such steps have come in a row the scale
// is halved (not below min_scale) on each further one, and after `growth_interval` finite steps
// in a row it doubles and the hysteresis count starts over. A constant scale (--loss-scale) never
// moves.
//
// The state stays on the device and update() only enqueues kernels, so a step never waits for
// the host to learn whether it overflowed, and can be captured in a CUDA graph.
#pragma once

#include <ATen/core/Tensor.h>

#include "core/config.h"

namespace megatron {

// The scaler's state as checkpoints hold it (Megatron's state_dict: scale, growth_tracker,
// hysteresis_tracker).
struct GradScalerState {
  double scale = 0;
  double growth_tracker = 0;
  double hysteresis_tracker = 0;
};

class GradScaler {
 public:
  // From --loss-scale (constant when > 0), --initial-loss-scale, --min-loss-scale,
  // --loss-scale-window and --hysteresis; the state on `device`.
  GradScaler(const TrainConfig& config, const at::Device& device);

  const at::Tensor& scale() const { return scale_; }  // [] fp32
  // The step's gradients were not finite ([] bool): Megatron's update(found_inf).
  void update(const at::Tensor& found_inf);

  GradScalerState state() const;  // reads the device
  void load_state(const GradScalerState& state);
  bool dynamic() const { return dynamic_; }

 private:
  bool dynamic_;
  double min_scale_, growth_interval_, hysteresis_;
  at::Tensor scale_;               // [] fp32
  at::Tensor growth_tracker_;      // [] fp32: finite steps in a row
  at::Tensor hysteresis_tracker_;  // [] fp32: overflows still tolerated before the scale backs off
};

}  // namespace megatron
