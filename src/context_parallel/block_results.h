// A rank's ring blocks folded into the attention over all of them (ring_attention's forward), and
// their query gradients into one (its backward). A few blocks (at most four: the own block and
// the grouped steps of ring_groups) are kept as they come and combined in one pass at the end
// (kernels::attention_combine: each block read once, the result written once in the blocks'
// dtype, summed in fp32); more are folded as they come into an fp32 accumulator that the first
// block, which covers every row, starts (merge_into), and cast at the end.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "context_parallel/partial_attention.h"
#include "kernels/attention_ops.h"

namespace megatron::cp {

// Whether `blocks` blocks are kept and combined at the end rather than accumulated.
bool blocks_combined_at_end(int blocks);

class BlockOutputs {
 public:
  explicit BlockOutputs(int blocks) : combine_(blocks_combined_at_end(blocks)) {}
  // part: rows [first_row, first_row + its rows) of the result.
  void add(PartialAttention part, int64_t first_row);
  // -> out [b, H, rows, dv] in dtype, lse [b, H, rows] fp32.
  PartialAttention finish(int64_t rows, at::ScalarType dtype);

 private:
  bool combine_;
  std::vector<kernels::CombinedPart> parts_;  // kept blocks (combine_)
  PartialAttention acc_;                     // the accumulator (otherwise)
};

class BlockQueryGrads {
 public:
  explicit BlockQueryGrads(int blocks) : combine_(blocks_combined_at_end(blocks)) {}
  // dq [b, H, its rows, d]: rows [first_row, ...) of the result.
  void add(const at::Tensor& dq, int64_t first_row);
  // -> [b, H, rows, d] in dtype.
  at::Tensor finish(int64_t rows, at::ScalarType dtype);

 private:
  bool combine_;
  std::vector<kernels::CombinedPart> parts_;  // kept blocks, no log-sum-exps (combine_)
  at::Tensor acc_;                           // fp32 (otherwise)
};

}  // namespace megatron::cp
