// AdamW with fp32 master weights: the model may hold bf16 parameters; gradients are
// accumulated in fp32 (`main_grad`, as Megatron names it) across micro-batches, clipped by the
// global L2 norm, and the fused AdamW kernel steps the fp32 masters, which are then copied back
// into the model's parameters. No weight decay on norms and biases (1-D parameters).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

struct OptimizerParam {
  std::string name;
  at::Tensor model_param;  // what the model computes with (fp32 or bf16)
  at::Tensor master;       // fp32; the same tensor as model_param when that is fp32
  at::Tensor main_grad;    // fp32 gradient accumulator
  at::Tensor exp_avg;      // fp32
  at::Tensor exp_avg_sq;   // fp32
  bool decay;              // weight decay applies
};

class AdamW {
 public:
  AdamW(const std::vector<NamedTensor>& params, const TrainConfig& config);

  void zero_grad();
  // Moves the model parameters' .grad into the fp32 accumulators; call after each backward.
  void accumulate_grads();
  // Global L2 norm of the accumulated gradients.
  double grad_norm() const;
  // Scales gradients so their norm is at most clip_grad (Megatron's clip_grad_norm_).
  void clip(double total_norm);
  // One AdamW step at learning rate `lr`, then master -> model parameters.
  void step(double lr);

  // Checkpoint state: masters, moments and the step count under "<param name>.<field>".
  std::vector<NamedTensor> state() const;
  void load_state(const std::vector<NamedTensor>& state, bool load_moments);
  int64_t steps_taken() const;
  // Masters := model parameters (after loading weights without optimizer state).
  void reset_from_model();

  std::vector<OptimizerParam>& params() { return params_; }

 private:
  void copy_master_to_model();

  std::vector<OptimizerParam> params_;
  at::Tensor step_;  // [] fp32, shared by all parameters (they always step together)
  TrainConfig c_;
};

}  // namespace megatron
