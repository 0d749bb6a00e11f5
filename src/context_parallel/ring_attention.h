// Ring attention (--cp-comm-type p2p): each context-parallel rank keeps its queries and passes its
// keys and values around the ring, attending over every rank's block as it goes by and merging
// the partial results by their log-sum-exp. The next block is in flight while the current one is
// computed. With the load-balanced chunks (chunks.h) each step is one of three blocks:
//   own block (step 0)      all 2c queries over all 2c keys, causal
//   a rank r before mine    all 2c queries over chunk r only (chunk 2·CP−1−r lies in the future)
//   a rank r after mine     the late chunk's c queries over both of r's chunks (the early one sees none)
// so every step costs about the same. The backward walks the ring again: each block's key/value
// gradient travels one step behind it (overlapped with the next block) and arrives back at its
// owner after the last step.
//
// With short chunks a block is too small to keep the GPU busy (at 32k tokens on 8 ranks, 2k-token
// chunks: the blocks' kernels alone 1.12x one fused attention over the sequence), so consecutive
// steps of one kind (earlier ranks', later ranks') run as one block over their keys side by side:
// the keys still travel one rank a step, a group waits for its last step's keys, and the
// gradients travel (steps a group - 1) steps further behind. Grouping leaves the arithmetic as it
// is (the same log-sum-exp merge, over fewer, larger blocks).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

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

// Steps [first_step, first_step + steps) of one kind computed as one block: the same query rows
// over rows [first_key, first_key + keys) of each step's owner, side by side in step order.
struct RingGroup {
  int first_step, steps;
  int64_t first_query, queries;
  int64_t first_key, keys;  // of each step's owner's rows
  bool causal;
};
// Rank `rank`'s steps grouped: the own block alone, then runs of consecutive steps of one kind,
// at most `steps_per_block` steps each.
std::vector<RingGroup> ring_groups(int rank, int cp, int64_t c, int steps_per_block);

// How many steps a block takes with chunks of c tokens: enough for about 16384 keys a block (at
// most CP - 1). On one H100 more steps a block measured faster at every chunk length (32k tokens
// on 8 ranks: 1.29x one fused attention one step a block, 1.16x four, 1.14x all seven;
// docs/performance.md, session 39); the keys' exchange, small beside the blocks with grouped K/V
// heads, still overlaps the own block and the groups before.
int ring_steps_per_block(int64_t c, int cp);

// The rows a group attends of each step's tensor (per_step[i]: step first_step + i's owner's k or
// v, [b, G, 2c, d]): rows [first_key, first_key + keys) of each, side by side along dim 2 (a view
// for a group of one step).
at::Tensor group_rows(const RingGroup& group, const std::vector<at::Tensor>& per_step);

// q [b, H, 2c, d], k [b, G, 2c, d], v [b, G, 2c, dv]: this rank's rows (chunks.h). mask: [b, 1, 2c, S]
// bool (true = may attend; this rank's query rows over every key in sequence order, e.g. packed
// documents) or undefined for causal attention. -> [b, H, 2c, dv] in q's dtype; differentiable
// in q, k and v. documents: the micro-batch's packed documents (the mask then undefined): each
// block attends document by document (document_blocks.h), no mask read, one step a block.
// steps_per_block: 0 for ring_steps_per_block's choice (tests set others).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          double scale, const dist::Group& cp, const PackedDocuments* documents = nullptr,
                          int steps_per_block = 0);

}  // namespace megatron::cp
