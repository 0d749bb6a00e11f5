// Ring attention's log-sum-exp merge as LibTorch sees it: the one-pass CUDA kernel of
// attention_merge.cu where the build has it and the accumulator lives on a CUDA device, ATen's
// composite of the same arithmetic elsewhere (Impl::Composite forces it; the CUDA test compares).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/ops.h"

namespace megatron::kernels {

// Folds a block's rows into the accumulator's, in place:
//   lse' = logaddexp(lse, part_lse), out' = out * exp(lse - lse') + part_out * exp(part_lse - lse'),
// rows where both log-sum-exps are -inf left at zero.
// out [b, H, rows, dv] fp32 and lse [b, H, rows] fp32 (views into the accumulator are fine);
// part_out [b, H, rows, dv] in any float dtype, part_lse [b, H, rows] fp32.
void attention_merge(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse,
                     Impl impl = Impl::Auto);

}  // namespace megatron::kernels
