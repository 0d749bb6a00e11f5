#include "model/norm_module.h"

#include <ATen/ATen.h>

namespace megatron {

NormSpec norm_spec(const ModelConfig& c) {
  return {norm_kind_from_name(c.normalization), c.norm_epsilon, c.layernorm_zero_centered_gamma};
}

tp::Init norm_weight_init(const ModelConfig& c) { return c.layernorm_zero_centered_gamma ? tp::Init::Zeros : tp::Init::Ones; }

NormModule::NormModule(const ModelConfig& c, const tp::TensorParallel& tp, at::Device device) : spec_(norm_spec(c)) {
  const at::TensorOptions on = at::TensorOptions().device(device);
  weight = add_parameter("weight", at::zeros({c.hidden_size}, on) + (spec_.zero_centered_gamma ? 0.0 : 1.0),
                         tp::sequence_sharded_replica(tp, norm_weight_init(c)));
  if (spec_.kind == NormKind::LayerNorm) {
    bias = add_parameter("bias", at::zeros({c.hidden_size}, on), tp::sequence_sharded_replica(tp, tp::Init::Zeros));
  }
}

}  // namespace megatron
