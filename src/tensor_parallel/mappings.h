// Every collective the model uses, each a small autograd function whose backward is the
// conjugate collective (Megatron-Core's tensor_parallel/mappings.py). On a group of one
// process each is the identity. Sequence-parallel splits are along dim 0 ([s, b, h]); tensor-
// parallel splits along the last dim.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "distributed/process_group.h"

namespace megatron::tp {

// fwd identity; bwd all-reduce. Enters a column-parallel region.
at::Tensor copy_to_tp(const at::Tensor& x, const dist::Group& tp);
// fwd all-reduce; bwd identity. Leaves a row-parallel region.
at::Tensor reduce_from_tp(const at::Tensor& x, const dist::Group& tp);
// fwd keep this rank's block of the last dim; bwd all-gather it.
at::Tensor scatter_to_tp(const at::Tensor& x, const dist::Group& tp);
// fwd all-gather the last dim; bwd keep this rank's block.
at::Tensor gather_from_tp(const at::Tensor& x, const dist::Group& tp);

// [s, b, h] -> [s/tp, b, h], this rank's rows; bwd all-gather.
at::Tensor scatter_to_sp(const at::Tensor& x, const dist::Group& tp);
// [s/tp, b, h] -> [s, b, h] all-gather; bwd reduce-scatter (the consumer is column-parallel,
// so each rank's gradient is a partial sum).
at::Tensor gather_from_sp(const at::Tensor& x, const dist::Group& tp);
// [s, b, h] partial sums -> [s/tp, b, h] reduced rows; bwd all-gather.
at::Tensor reduce_scatter_to_sp(const at::Tensor& x, const dist::Group& tp);

// The members' x [n, ...] stacked along dim 0 in group rank order, [size * n, ...]. No
// autograd: for what has no gradient (routing indices, masks, counts).
at::Tensor all_gather_rows(const at::Tensor& x, const dist::Group& group);

// Rows exchanged over `group` (Megatron-Core's all_to_all, the expert-parallel token exchange):
// x [sum(in_splits), ...] holds in_splits[r] rows for member r -> [sum(out_splits), ...] with
// out_splits[r] rows from member r. Empty splits: equal blocks. bwd: the same exchange with
// the splits swapped, so each row's gradient goes back to the rank it came from.
at::Tensor all_to_all(const at::Tensor& x, const dist::Group& group, const std::vector<int64_t>& out_splits = {},
                      const std::vector<int64_t>& in_splits = {});

}  // namespace megatron::tp
