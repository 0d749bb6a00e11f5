#include "model/norm.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"

namespace megatron {

NormKind norm_kind_from_name(const std::string& name) {
  return name == "RMSNorm" ? NormKind::RMSNorm : NormKind::LayerNorm;
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
  at::Tensor out = normed.to(x.scalar_type()) * weight;
  if (bias.defined()) out = out + bias;
  return out;
}

}  // namespace megatron
