#include "model/mlp.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"
#include "model/norm_module.h"

namespace megatron {

MLP::MLP(const PartContext& ctx, int64_t ffn_hidden_size)
    : swiglu_(ctx.config.swiglu), swiglu_fusion_(ctx.config.bias_swiglu_fusion) {
  const ModelConfig& c = ctx.config;
  const int64_t ffn = ffn_hidden_size > 0 ? ffn_hidden_size : c.ffn_hidden_size;
  const int64_t fc1_out = (c.swiglu ? 2 : 1) * ffn;
  // SwiGLU's [gate; up] halves are split over TP separately, so each rank gates its own columns.
  const tp::LinearOptions fc1 = ctx.linear(tp::Init::Normal, /*gated=*/c.swiglu);
  if (ctx.norm_in_linear) {
    norm_in_fc1_ = std::make_shared<tp::LayerNormColumnParallelLinear>(c.hidden_size, fc1_out, c.add_bias_linear, norm_spec(c), ctx.tp, fc1);
    linear_fc1 = register_module("linear_fc1", std::shared_ptr<tp::ColumnParallelLinear>(norm_in_fc1_));
  } else {
    linear_fc1 = register_module("linear_fc1", std::make_shared<tp::ColumnParallelLinear>(c.hidden_size, fc1_out, c.add_bias_linear, ctx.tp, fc1));
  }
  linear_fc2 = register_module("linear_fc2", std::make_shared<tp::RowParallelLinear>(
      ffn, c.hidden_size, c.add_bias_linear, ctx.tp, ctx.linear(tp::Init::ScaledNormal)));
}

std::optional<NormParams> MLP::fused_norm() const {
  if (!norm_in_fc1_) return std::nullopt;
  return norm_in_fc1_->norm();
}

at::Tensor MLP::forward(const at::Tensor& normed) {
  // The fused activation: for a batch-1 decode step one GEMV with SwiGLU in its epilogue.
  if (swiglu_ && swiglu_fusion_) return linear_fc2->forward(linear_fc1->forward_swiglu(normed));  // fc1 out [s, b, f/tp]
  return linear_fc2->forward(activate(linear_fc1->forward(normed)));
}

std::optional<AfterNorm> MLP::forward_after_norm(const PendingNorm& pending, const NormParams* next) {
  const bool gated = swiglu_ && swiglu_fusion_;  // the activation in fc1's epilogue too
  std::optional<kernels::NormedLinear> fc1 = linear_fc1->forward_after_norm(pending, gated);
  if (!fc1) return std::nullopt;
  const at::Tensor activated = gated ? fc1->y : activate(fc1->y);  // [1, 1, f/tp]
  if (next != nullptr) {
    // fc2 adds its output to the residual and prepares the next norm in its epilogue.
    if (std::optional<kernels::PreparedNorm> prepared = linear_fc2->forward_into_norm(activated, fc1->sum, *next)) {
      return AfterNorm{fc1->sum, {}, std::move(prepared)};
    }
  }
  return AfterNorm{fc1->sum, linear_fc2->forward(activated), {}};
}

at::Tensor MLP::activate(const at::Tensor& h) const {
  if (!swiglu_) return at::gelu(h);
  auto gate_up = h.chunk(2, -1);
  return at::silu(gate_up[0]) * gate_up[1];  // [s, b, f/tp]
}

}  // namespace megatron
