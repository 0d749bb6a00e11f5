// Attention computed block by block over keys all held here: each block is some query rows over
// some key rows (full, or causal on the diagonal), merged by log-sum-exp (partial_attention.h), so
// that on CUDA every block runs flash attention's kernels with no mask and no score matrix: what
// all-gather context parallelism needs once the keys are gathered (a rank's chunk i sees keys
// 0 .. i·c fully and chunk i causally).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "context_parallel/document_blocks.h"

namespace megatron::cp {

struct KeyBlock {
  int64_t first_query, queries;
  int64_t first_key, keys;
  bool causal;  // square, on the diagonal
};

// q [b, H, sq, d], k [b, G, sk, d], v [b, G, sk, dv]; mask [b, 1, sq, sk] bool (true = may attend)
// or undefined. pieces: each block's shared rows cut into packed documents (shared_documents in
// document_blocks.h; the mask then undefined). Query rows no block covers get zeros. -> [b, H, sq, dv] in q's dtype;
// differentiable in q, k and v.
at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<KeyBlock>& blocks,
                               const at::Tensor& mask, double scale,
                               std::shared_ptr<const std::vector<BlockDocuments>> pieces = nullptr);

}  // namespace megatron::cp
