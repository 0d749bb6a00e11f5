#include "model/mlp.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"

namespace megatron {

MLP::MLP(const ModelConfig& c, const tp::TensorParallel& tp) : swiglu_(c.swiglu), swiglu_fusion_(c.bias_swiglu_fusion) {
  const int64_t fc1_out = (c.swiglu ? 2 : 1) * int64_t(c.ffn_hidden_size);
  linear_fc1 = register_module("linear_fc1", std::make_shared<tp::LayerNormColumnParallelLinear>(
      c.hidden_size, fc1_out, c.add_bias_linear, norm_kind_from_name(c.normalization), c.norm_epsilon, tp));
  linear_fc2 = register_module("linear_fc2", std::make_shared<tp::RowParallelLinear>(
      c.ffn_hidden_size, c.hidden_size, c.add_bias_linear, tp));
}

at::Tensor MLP::forward(const at::Tensor& hidden) {
  return activation_and_fc2(linear_fc1->forward(hidden));  // fc1: [s, b, 2f/tp] or [s, b, f/tp]
}

at::Tensor MLP::forward_normed(const at::Tensor& normed) {
  return activation_and_fc2(linear_fc1->forward_normed(normed));
}

at::Tensor MLP::activation_and_fc2(at::Tensor h) {
  if (swiglu_ && swiglu_fusion_) {
    h = kernels::swiglu(h);                    // [s, b, f/tp]
  } else if (swiglu_) {
    auto gate_up = h.chunk(2, -1);
    h = at::silu(gate_up[0]) * gate_up[1];    // [s, b, f/tp]
  } else {
    h = at::gelu(h);
  }
  return linear_fc2->forward(h);
}

}  // namespace megatron
