#include "model/norm.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"

namespace megatron {

NormKind norm_kind_from_name(const std::string& name) {
  return name == "RMSNorm" ? NormKind::RMSNorm : NormKind::LayerNorm;
}

at::Tensor norm_scale(const at::Tensor& weight, bool zero_centered_gamma) {
  // In fp32 at least: 1 + w in bf16 would keep only 2^-7 of w's resolution, the precision the
  // zero-centred form is there to keep (Transformer Engine adds the 1 in fp32 too).
  return zero_centered_gamma ? weight.to(at_least_fp32(weight.scalar_type())) + 1.0 : weight;
}

at::ScalarType at_least_fp32(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor apply_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, NormKind kind,
                      double eps) {
  if (kind == NormKind::RMSNorm && !bias.defined() && weight.scalar_type() == x.scalar_type()) {
    // One fused kernel each way on CUDA (kernels/rmsnorm.cu), statistics and the weight product
    // in fp32 whatever the activation dtype, rounded once; ATen's rms_norm elsewhere.
    return kernels::rms_norm(x, weight, eps);
  }
  at::Tensor x32 = x.to(at_least_fp32(x.scalar_type()));
  at::Tensor normed;
  if (kind == NormKind::RMSNorm) {
    normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  } else {
    normed = at::layer_norm(x32, {x.size(-1)}, /*weight=*/{}, /*bias=*/{}, eps);
  }
  if (weight.scalar_type() != x.scalar_type() && weight.scalar_type() == normed.scalar_type()) {
    // An fp32 scale (zero-centred weights of a 16-bit model): scaled in fp32, rounded once.
    at::Tensor out = normed * weight;
    if (bias.defined()) out = out + bias;
    return out.to(x.scalar_type());
  }
  at::Tensor out = normed.to(x.scalar_type()) * weight;
  if (bias.defined()) out = out + bias;
  return out;
}

}  // namespace megatron
