// Core attention through at::scaled_dot_product_attention (cuDNN / flash backends on GPU, the
// flash CPU kernel on CPU): causal, or under an explicit mask; GQA without repeating K/V.
#pragma once

#include "model/layer_spec.h"

namespace megatron {

class SdpaAttention : public CoreAttention {
 public:
  explicit SdpaAttention(const tp::TensorParallel& tp) : tp_(tp) {}
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask,
                     double dropout) const override;

 private:
  tp::TensorParallel tp_;  // dropout inside the TP region draws from its generator
};

}  // namespace megatron
