// LayerNorm / RMSNorm as used in front of attention and MLP and at the end of the decoder.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "kernels/gemv_ops.h"

namespace megatron {

enum class NormKind { LayerNorm, RMSNorm };

NormKind norm_kind_from_name(const std::string& name);

// x: [..., h]; weight, bias: [h] (bias undefined for RMSNorm). Statistics are computed in fp32
// whatever x's dtype, then the result is cast back to x's dtype and scaled (as HF Llama and
// Transformer Engine do).
// fp32 for 16-bit inputs, the input's own type otherwise (fp64 stays fp64 for gradient checks).
at::ScalarType at_least_fp32(at::ScalarType t);

at::Tensor apply_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, NormKind kind,
                      double eps);

// What a norm is: kind, epsilon, and whether its weight is stored zero-centred (Megatron's
// --apply-layernorm-1p: the scale applied is 1 + weight, the weight starts at zeros).
struct NormSpec {
  NormKind kind = NormKind::RMSNorm;
  double eps = 1e-5;
  bool zero_centered_gamma = false;
};

// The scale a stored norm weight applies: the weight itself, or 1 + weight when zero-centred.
at::Tensor norm_scale(const at::Tensor& weight, bool zero_centered_gamma);

// A norm's parameters and kind, wherever the parameters live (a norm module of the layer, or
// fused into the linear after it).
struct NormParams {
  at::Tensor weight;  // [h] as stored (see NormSpec::zero_centered_gamma)
  at::Tensor bias;    // [h] LayerNorm only
  NormKind kind = NormKind::RMSNorm;
  double eps = 1e-5;
  bool zero_centered_gamma = false;
  at::Tensor gamma() const { return norm_scale(weight, zero_centered_gamma); }  // [h] the scale applied
  at::Tensor apply(const at::Tensor& x) const { return apply_norm(x, gamma(), bias, kind, eps); }
};

// A norm not applied yet: `norm` of the residual sum base + delta (delta undefined: base alone).
// A part whose first linear can apply it inside its own kernel (a batch-1 decode step's GEMV)
// takes it as it is (LayerPart::forward_after_norm), saving the norm's launch. `prepared`: the
// GEMV that produced base (then the sum itself, delta undefined) also did the norm's first half
// for `norm` (kernels::gemv_into_norm); a part may finish it in its first GEMV or ignore it.
struct PendingNorm {
  at::Tensor base;
  at::Tensor delta;
  NormParams norm;
  std::optional<kernels::PreparedNorm> prepared;
};

}  // namespace megatron
