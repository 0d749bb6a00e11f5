// The dense MLP: linear_fc1 -> SwiGLU or GELU -> linear_fc2 (the pre-MLP norm fused into
// linear_fc1 when the spec puts it there).
#pragma once

#include <memory>

#include "model/layer_spec.h"

namespace megatron {

class MLP : public FeedForward {
 public:
  // ffn_hidden_size 0: the model's (--ffn-hidden-size); MoE's shared experts give theirs.
  explicit MLP(const PartContext& context, int64_t ffn_hidden_size = 0);
  at::Tensor forward(const at::Tensor& normed) override;  // [s, b, h] -> [s, b, h] (dim 0 s/tp under sequence parallelism)
  std::optional<AfterNorm> forward_after_norm(const PendingNorm& pending, const NormParams* next) override;
  std::optional<NormParams> fused_norm() const override;

  // [2f/tp, h] = [gate block; up block] of this rank with SwiGLU, else [f/tp, h]; a
  // LayerNormColumnParallelLinear when the pre-MLP norm lives in it
  std::shared_ptr<tp::ColumnParallelLinear> linear_fc1;
  std::shared_ptr<tp::RowParallelLinear> linear_fc2;  // weight [h, f/tp]

 private:
  // fc1's output [s, b, 2f/tp] ([gate; up]) or [s, b, f/tp] -> the activation's [s, b, f/tp].
  at::Tensor activate(const at::Tensor& h) const;
  std::shared_ptr<tp::LayerNormColumnParallelLinear> norm_in_fc1_;
  bool swiglu_;
  bool swiglu_fusion_;
};

}  // namespace megatron
