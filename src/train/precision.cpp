#include "train/precision.h"

#include <cstdio>

#include "optim/adamw.h"

namespace megatron {

std::string describe_precision(const TrainConfig& t, const ParallelConfig& p) {
  if (!t.bf16 && !t.fp16) return "fp32";
  std::string details = t.bf16 && stores_param_remainders(t) ? "fp32 master weights as bf16 + 16-bit remainders" : "fp32 master weights";
  details += p.grad_reduce_in_bf16 ? ", bf16 gradients" : t.fp16 ? " and gradients" : "";
  if (t.exp_avg_dtype == "bf16" || t.exp_avg_sq_dtype == "bf16") details += ", Adam moments " + t.exp_avg_dtype + "/" + t.exp_avg_sq_dtype;
  if (t.fp16) {
    char scale[96];
    std::snprintf(scale, sizeof(scale), t.loss_scale > 0 ? ", constant loss scale %g" : ", dynamic loss scale from %g",
                  t.loss_scale > 0 ? t.loss_scale : t.initial_loss_scale);
    details += scale;
  }
  return std::string(t.bf16 ? "bf16" : "fp16") + " (" + details + ")";
}

}  // namespace megatron
