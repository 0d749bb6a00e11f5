// Ring attention (--cp-comm-type p2p): each context-parallel rank keeps its queries and passes its
// keys and values around the ring, attending over every rank's block as it goes by and merging
// the partial results by their log-sum-exp. The next block is in flight while the current one is
// computed. With the load-balanced chunks (chunks.h) each step is one of three blocks:
//   own block (step 0)      all 2c queries over all 2c keys, causal
//   a rank r before mine    all 2c queries over chunk r only (chunk 2·CP−1−r lies in the future)
//   a rank r after mine     the late chunk's c queries over both of r's chunks (the early one sees none)
// so every step costs about the same. The backward walks the ring again: each block's key/value
// gradient travels with it and arrives back at its owner after the last step.
#pragma once

#include <ATen/core/Tensor.h>

#include "context_parallel/document_blocks.h"
#include "distributed/process_group.h"

namespace megatron::cp {

// What step `step` of rank `rank`'s ring attends, with chunks of c tokens: the owner of the keys
// then held, which of this rank's query rows and which of the owner's key rows.
struct RingBlock {
  int owner;
  int64_t first_query, queries;
  int64_t first_key, keys;
  bool causal;
};
RingBlock ring_block(int step, int rank, int cp, int64_t c);

// q [b, H, 2c, d], k [b, G, 2c, d], v [b, G, 2c, dv]: this rank's rows (chunks.h). mask: [b, 1, 2c, S]
// bool (true = may attend; this rank's query rows over every key in sequence order, e.g. packed
// documents) or undefined for causal attention. -> [b, H, 2c, dv] in q's dtype; differentiable
// in q, k and v. documents: the micro-batch's packed documents (the mask then undefined): each
// block attends document by document (document_blocks.h), no mask read.
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          double scale, const dist::Group& cp, const PackedDocuments* documents = nullptr);

}  // namespace megatron::cp
