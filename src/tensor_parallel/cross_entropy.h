// Cross entropy over vocab-parallel logits without gathering them (Megatron-Core's
// vocab_parallel_cross_entropy): the max, the target logit and the exp-sum are all-reduced
// across TP; each rank's backward touches only its own vocabulary slice. Computed in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include "distributed/process_group.h"

namespace megatron::tp {

// logits [s, b, V/tp] (rank r holds ids [r * V/tp, (r+1) * V/tp)), targets [s, b] int64
// -> per-token loss [s, b] fp32, identical on every TP rank.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const dist::Group& tp);

// The same loss through the fused kernels (--cross-entropy-loss-fusion, kernels/ops.h): the
// logits stay in their dtype (no fp32 copy, no fp32 softmax kept for backward), only per-row
// statistics are fp32, and backward writes the gradient in one pass. Any TP size, 1 included.
at::Tensor fused_vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const dist::Group& tp);

}  // namespace megatron::tp
