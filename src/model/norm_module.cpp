#include "model/norm_module.h"

#include <ATen/ATen.h>

namespace megatron {

NormModule::NormModule(const ModelConfig& c, const tp::TensorParallel& tp, at::Device device)
    : kind_(norm_kind_from_name(c.normalization)), eps_(c.norm_epsilon) {
  const at::TensorOptions on = at::TensorOptions().device(device);
  weight = add_parameter("weight", at::ones({c.hidden_size}, on), tp::sequence_sharded_replica(tp, tp::Init::Ones));
  if (kind_ == NormKind::LayerNorm) {
    bias = add_parameter("bias", at::zeros({c.hidden_size}, on), tp::sequence_sharded_replica(tp, tp::Init::Zeros));
  }
}

}  // namespace megatron
