// What the backward of a blockwise attention needs from its forward (ring_attention and
// blockwise_attention save and read it alike): q, k, v, the merged output and log-sum-exp, the
// mask if there is one, and the softmax scale.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

namespace megatron::cp {

struct SavedAttention {
  at::Tensor q, k, v, out, lse, mask;
  double scale = 1.0;

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->save_for_backward({q, k, v, out, lse});
    if (mask.defined()) ctx->saved_data["mask"] = mask;
    ctx->saved_data["scale"] = scale;
  }
  static SavedAttention load(torch::autograd::AutogradContext* ctx) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    SavedAttention s{saved[0], saved[1], saved[2], saved[3], saved[4], at::Tensor(), ctx->saved_data["scale"].toDouble()};
    if (ctx->saved_data.count("mask")) s.mask = ctx->saved_data["mask"].toTensor();
    return s;
  }
};

}  // namespace megatron::cp
