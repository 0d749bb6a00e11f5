// Ring attention's log-sum-exp merges as LibTorch sees them: the one-pass CUDA kernels of
// attention_merge.cu where the build has them and the tensors live on a CUDA device, ATen's
// composite of the same arithmetic elsewhere (Impl::Composite forces it; the CUDA test compares).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace megatron::kernels {

// Folds a block's rows into the accumulator's, in place:
//   lse' = logaddexp(lse, part_lse), out' = out * exp(lse - lse') + part_out * exp(part_lse - lse'),
// rows where both log-sum-exps are -inf left at zero.
// out [b, H, rows, dv] fp32 and lse [b, H, rows] fp32 (views into the accumulator are fine);
// part_out [b, H, rows, dv] in any float dtype, part_lse [b, H, rows] fp32.
void attention_merge(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse,
                     Impl impl = Impl::Auto);

// A block of rows [first_row, first_row + rows) of a [b, H, R, dv] result: values [b, H, rows, dv]
// (any float dtype, value channels contiguous), lse [b, H, rows] fp32 for attention outputs.
struct AttentionRows {
  at::Tensor values;
  at::Tensor lse;
  int64_t first_row = 0;
};

// At most this many blocks a combine_row_blocks call (the kernel takes them by value).
int64_t max_row_blocks();

// blocks combined into out [b, H, R, dv] (any float dtype; written whole), in fp32, rounded once.
// weighted (every block with its lse): out = sum_i exp(lse_i - lse) * block_i and out_lse [b, H, R]
// fp32 (undefined: not written) = log(sum_i exp(lse_i)): the blocks' attention merged; rows that no
// block saw a key in get 0 and -inf. Else a plain sum (gradients), 0 where no block covers a row.
void combine_row_blocks(const std::vector<AttentionRows>& blocks, const at::Tensor& out, const at::Tensor& out_lse, bool weighted,
                        Impl impl = Impl::Auto);

}  // namespace megatron::kernels
