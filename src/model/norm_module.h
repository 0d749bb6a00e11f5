// A norm as a module of its own (`final_layernorm`, or a layer's `input_layernorm` /
// `pre_mlp_layernorm` when the spec keeps the norms out of the linears): weight, and bias for
// LayerNorm. Replicated over TP; applied to sequence shards under sequence parallelism.
#pragma once

#include "core/config.h"
#include "model/norm.h"
#include "tensor_parallel/layers.h"

namespace megatron {

class NormModule : public tp::DescribedModule {
 public:
  NormModule(const ModelConfig& config, const tp::TensorParallel& tp, at::Device device = at::kCPU);
  NormParams params() const { return {weight, bias, spec_.kind, spec_.eps, spec_.zero_centered_gamma}; }

  at::Tensor weight;  // [h]
  at::Tensor bias;    // [h] LayerNorm only

 private:
  NormSpec spec_;
};

// The spec of the model's norms (--normalization, --norm-epsilon, --apply-layernorm-1p).
NormSpec norm_spec(const ModelConfig& config);
// Init::Ones for a norm's weight, or Init::Zeros when it is stored zero-centred.
tp::Init norm_weight_init(const ModelConfig& config);

}  // namespace megatron
