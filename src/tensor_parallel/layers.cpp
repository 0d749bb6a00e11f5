#include "tensor_parallel/layers.h"

#include <ATen/ATen.h>

#include "kernels/gemv_ops.h"
#include "kernels/ops.h"
#include "tensor_parallel/grad_accumulation.h"
#include "tensor_parallel/mappings.h"

namespace megatron::tp {
namespace {

int64_t split(int64_t n, const TensorParallel& tp, const char* what) {
  TORCH_CHECK(n % tp.size() == 0, what, " ", n, " is not divisible by the tensor-parallel size ", tp.size());
  return n / tp.size();
}

std::shared_ptr<Fp8Linear> fp8_for(const LinearOptions& options, const char* kind, int64_t in, int64_t out) {
  if (!options.fp8) return nullptr;
  return std::make_shared<Fp8Linear>(options.fp8, std::string(kind) + " linear layer " + std::to_string(in) + " -> " +
                                                       std::to_string(out));
}

}  // namespace

ParamInfo sequence_sharded_replica(const TensorParallel& tp, Init init) {
  ParamInfo info;
  info.init = init;
  info.partial_grad = tp.sequence_parallel && tp.size() > 1;
  return info;
}

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool bias, const TensorParallel& tp,
                                           const LinearOptions& options)
    : tp_(tp) {
  const int64_t local_out = split(out, tp, "output features");
  const at::TensorOptions on = at::TensorOptions().device(options.device);
  ParamInfo info;
  info.split = {0, options.gated};
  info.init = options.weight_init;
  weight = add_parameter("weight", at::empty({local_out, in}, on), info);
  fp8 = fp8_for(options, "column-parallel", in, out);
  if (bias) {
    info.init = Init::Zeros;
    this->bias = add_parameter("bias", at::zeros({local_out}, on), info);
  }
}

at::Tensor ColumnParallelLinear::enter(const at::Tensor& x) const {
  return tp_.sequence_parallel ? gather_from_sp(x, tp_.group) : copy_to_tp(x, tp_.group);
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) const {
  if (!fp8) return tp::linear(enter(x), weight, bias);
  const at::Tensor y = fp8->forward(enter(x), weight);  // [s, b, out/tp]
  return bias.defined() ? y + bias : y;
}

at::Tensor ColumnParallelLinear::forward_swiglu(const at::Tensor& x) const {
  if (fp8 || bias.defined()) return kernels::swiglu(forward(x));
  const at::Tensor in = enter(x);  // [s, b, in]
  if (kernels::gemv_takes(in, weight, {})) return kernels::linear_swiglu(in, weight);  // one row, no gradient: one GEMV
  return kernels::swiglu(tp::linear(in, weight, {}));
}

std::optional<kernels::NormedLinear> ColumnParallelLinear::forward_after_norm(const PendingNorm& pending, bool gated) const {
  // Without sequence parallelism enter() is the identity forward, so the GEMV reads the row as is.
  if (!computes_plain_linear() || pending.norm.kind != NormKind::RMSNorm) return std::nullopt;
  if (pending.prepared) {  // the GEMV before did the norm's first half: finish it
    if (!kernels::gemv_after_prepared_norm_takes(*pending.prepared, weight, bias, gated)) return std::nullopt;
    return kernels::NormedLinear{pending.base, kernels::gemv_after_prepared_norm(*pending.prepared, weight, bias, gated)};
  }
  const at::Tensor gamma = pending.norm.gamma();  // [in] the scale applied
  if (!kernels::gemv_after_norm_takes(pending.base, pending.delta, gamma, weight, bias, gated)) return std::nullopt;
  return kernels::gemv_after_norm(pending.base, pending.delta, gamma, pending.norm.eps, weight, bias, gated);
}

LayerNormColumnParallelLinear::LayerNormColumnParallelLinear(int64_t in, int64_t out, bool bias, const NormSpec& norm,
                                                             const TensorParallel& tp, const LinearOptions& options)
    : ColumnParallelLinear(in, out, bias, tp, options), norm_(norm) {
  // The norm runs on the sequence shard under SP, before the gather into the TP region: its
  // gradient is then a partial sum.
  const at::TensorOptions on = at::TensorOptions().device(options.device);
  // Zero-centred (--apply-layernorm-1p): stored as gamma - 1, so it starts at zeros.
  const Init gamma_init = norm.zero_centered_gamma ? Init::Zeros : Init::Ones;
  layer_norm_weight = add_parameter("layer_norm_weight", at::zeros({in}, on) + (norm.zero_centered_gamma ? 0.0 : 1.0),
                                    sequence_sharded_replica(tp, gamma_init));
  if (norm.kind == NormKind::LayerNorm) {
    layer_norm_bias = add_parameter("layer_norm_bias", at::zeros({in}, on), sequence_sharded_replica(tp, Init::Zeros));
  }
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool bias, const TensorParallel& tp,
                                     const LinearOptions& options)
    : tp_(tp) {
  const at::TensorOptions on = at::TensorOptions().device(options.device);
  ParamInfo info;
  info.split = {1, false};
  info.init = options.weight_init;
  weight = add_parameter("weight", at::empty({out, split(in, tp, "input features")}, on), info);
  fp8 = fp8_for(options, "row-parallel", in, out);
  // Added after the reduction: on sequence shards under SP.
  if (bias) this->bias = add_parameter("bias", at::zeros({out}, on), sequence_sharded_replica(tp, Init::Zeros));
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x) const {
  at::Tensor partial = fp8 ? fp8->forward(x, weight) : tp::linear(x, weight);  // [s, b, out], this rank's share of the sum
  at::Tensor y = tp_.sequence_parallel ? reduce_scatter_to_sp(partial, tp_.group) : reduce_from_tp(partial, tp_.group);
  return bias.defined() ? y + bias : y;
}

std::optional<kernels::PreparedNorm> RowParallelLinear::forward_into_norm(const at::Tensor& x, const at::Tensor& residual,
                                                                          const NormParams& next) const {
  if (fp8 || bias.defined() || tp_.sequence_parallel || tp_.size() > 1 || next.kind != NormKind::RMSNorm) return std::nullopt;
  const at::Tensor gamma = next.gamma();  // [out] the scale applied
  if (!kernels::gemv_into_norm_takes(x, weight, residual, gamma)) return std::nullopt;
  return kernels::gemv_into_norm(x, weight, residual, gamma, next.eps);
}

at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, const TensorParallel& tp) {
  if (tp.size() == 1) return at::embedding(weight, tokens);
  const int64_t rows = weight.size(0);
  const int64_t first = tp.rank() * rows;
  at::Tensor outside = (tokens < first).logical_or(tokens >= first + rows);        // [s, b]
  at::Tensor local = (tokens - first).masked_fill(outside, 0);
  at::Tensor e = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);  // [s, b, h]
  return reduce_from_tp(e, tp.group);
}

}  // namespace megatron::tp
