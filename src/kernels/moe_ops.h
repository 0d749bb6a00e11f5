// The MoE token permutations as autograd functions (Megatron's permute / unpermute): the CUDA
// kernels of moe_permute.cu where the build has them and the tensors are on a CUDA device
// (--moe-permute-fusion), an ATen composite of the same arithmetic elsewhere. Both are gathers
// in both directions: no scatter-add, so backward is deterministic.
//
// A layer routes T tokens to k experts each; pair p = t k + j is token t's j-th choice.
//   pairs [N] int64: the pair each expert-input row carries, in the experts' order; -1 marks a
//                    padding row (--moe-pad-expert-input-to-capacity)
//   slots [T k] int64: the row carrying each pair, -1 for pairs not dispatched here (their
//                    expert is on another rank, or the pair was dropped)
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/ops.h"

namespace megatron::kernels {

// rows [N, h] = tokens[pairs / k] from tokens [T, h] (padding rows zero).
// Backward: d tokens[t] = sum over j of d rows[slots[t k + j]].
at::Tensor moe_permute(const at::Tensor& tokens, const at::Tensor& pairs, const at::Tensor& slots, int64_t topk,
                       Impl impl = Impl::Auto);

// out [T, h] = sum over j of probs[t, j] * rows[slots[t k + j]], accumulated in fp32 and rounded
// once to rows' dtype; probs [T, k]. Backward: d rows[r] = probs[pairs[r]] * d out[pairs[r] / k]
// (padding rows 0), d probs[t, j] = <d out[t], rows[slots[t k + j]]>.
at::Tensor moe_unpermute(const at::Tensor& rows, const at::Tensor& probs, const at::Tensor& pairs, const at::Tensor& slots,
                         Impl impl = Impl::Auto);

}  // namespace megatron::kernels
