#include "context_parallel/block_results.h"

#include <ATen/ATen.h>

#include <utility>

namespace megatron::cp {

// As many as the combine kernel takes in one pass (four: the own block and up to three groups).
// Each kept block holds its rows in its own dtype until the end (the bf16 blocks of four groups
// take about as much as the fp32 accumulator).
bool blocks_combined_at_end(int blocks) { return blocks >= 1 && blocks <= kernels::kMostCombinedParts; }

void BlockOutputs::add(PartialAttention part, int64_t first_row) {
  if (combine_) {
    parts_.push_back({std::move(part.out), std::move(part.lse), first_row});
  } else if (!acc_.out.defined()) {
    TORCH_CHECK(first_row == 0, "BlockOutputs: the first block starts the accumulator and must cover every row");
    acc_ = accumulator_from(std::move(part));
  } else {
    merge_into(acc_, part, first_row);
  }
}

PartialAttention BlockOutputs::finish(int64_t rows, at::ScalarType dtype) {
  if (!combine_) {
    TORCH_CHECK(acc_.out.defined() && acc_.out.size(2) == rows, "BlockOutputs: the first block covers ",
                acc_.out.defined() ? acc_.out.size(2) : 0, " of ", rows, " rows");
    return {acc_.out.to(dtype), acc_.lse};
  }
  TORCH_CHECK(!parts_.empty(), "BlockOutputs: no blocks");
  const at::Tensor& first = parts_.front().out;
  at::Tensor lse = at::empty({first.size(0), first.size(1), rows}, first.options().dtype(at::kFloat));
  const at::Tensor out = kernels::attention_combine(parts_, rows, lse);
  parts_.clear();
  return {out.to(dtype), lse};
}

void BlockQueryGrads::add(const at::Tensor& dq, int64_t first_row) {
  if (combine_) {
    parts_.push_back({dq, at::Tensor(), first_row});
  } else if (!acc_.defined()) {
    TORCH_CHECK(first_row == 0, "BlockQueryGrads: the first block starts the sum and must cover every row");
    acc_ = at::empty(dq.sizes(), dq.options().dtype(at::kFloat)).copy_(dq);
  } else {
    acc_.narrow(2, first_row, dq.size(2)).add_(dq);
  }
}

at::Tensor BlockQueryGrads::finish(int64_t rows, at::ScalarType dtype) {
  if (!combine_) {
    TORCH_CHECK(acc_.defined() && acc_.size(2) == rows, "BlockQueryGrads: the first block covers ", acc_.defined() ? acc_.size(2) : 0,
                " of ", rows, " rows");
    return acc_.to(dtype);
  }
  TORCH_CHECK(!parts_.empty(), "BlockQueryGrads: no blocks");
  const at::Tensor dq = kernels::attention_combine(parts_, rows, at::Tensor());
  parts_.clear();
  return dq.to(dtype);
}

}  // namespace megatron::cp
