// Packed documents under context parallelism, block by block (Megatron's THD form): each block of
// the ring or of the all-gathered keys (some of a rank's query rows over some key rows) is cut
// into the documents its rows share, and each document's queries attend its keys only. On CUDA
// one FlashAttention-2 variable-length call runs every piece of a block (cu_seqlens per block);
// elsewhere each piece runs the block arithmetic. No mask and no score matrix beyond a piece's,
// so packed data trains at the lengths plain causal attention does.
//
// A block's query rows and key rows are each in increasing sequence position (a rank's rows are
// its early chunk then its late one), so one document's rows are consecutive in both. Pieces
// are the blocks' shape: full (every key before every query) or causal on the diagonal (the
// same positions on both sides).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "context_parallel/partial_attention.h"

namespace megatron::cp {

// A run of consecutive sequence positions.
struct Positions {
  int64_t first, count;
};

// The packed documents of a micro-batch of `samples` x `seq_length` tokens: document boundaries
// over the samples' tokens one sample after another, [docs + 1] (every sample's first token
// starts a document; model/document_attention.h reads them off the mask).
struct PackedDocuments {
  std::vector<int32_t> starts;
  int64_t samples = 0, seq_length = 0;
};

// One block cut into documents: piece i is query rows [query_starts[i], query_starts[i + 1]) over
// key rows [key_starts[i], key_starts[i + 1]) of the block's b·sq query and b·sk key rows, sample
// by sample. Every row lies in one piece; a piece may have no queries (its keys' gradients are
// zero) or no keys (its queries saw nothing here: log-sum-exp -inf).
struct BlockDocuments {
  std::vector<int32_t> query_starts, key_starts;  // [pieces + 1]
  int64_t longest_queries = 0, longest_keys = 0;
  bool queries_without_keys = false;
  at::Tensor device_query_starts, device_key_starts;  // int32 on the block's GPU (cu_seqlens); undefined elsewhere
  // Which of the block's rows (in each sample) the pieces cover: all from block_documents, the
  // shared span from shared_documents (no queries: the block shares no document).
  int64_t first_query = 0, queries = 0, first_key = 0, keys = 0;
};

// queries / keys: the positions of the block's query and key rows, runs in increasing order.
// device: where the block runs; on a GPU the starts are copied there without waiting for it.
BlockDocuments block_documents(const PackedDocuments& documents, const std::vector<Positions>& queries,
                               const std::vector<Positions>& keys, const at::Device& device);

// The block cut down to the rows its documents share: the span of query rows whose document has
// keys in the block and the span of key rows some query's document holds (over all samples), and
// the pieces over those. With short documents most of a ring's far blocks share none (then
// nothing is computed, merged or summed for them) and the near ones only their edges.
BlockDocuments shared_documents(const PackedDocuments& documents, const std::vector<Positions>& queries,
                                const std::vector<Positions>& keys, const at::Device& device);

// `block` (a ring step's or an all-gather block: first_query, queries, first_key, keys) cut down
// to the rows `shared` (its shared_documents) covers; no queries: nothing to compute.
template <typename Block>
Block shared_rows(Block block, const BlockDocuments& shared) {
  block.first_query += shared.first_query;
  block.queries = shared.queries;
  block.first_key += shared.first_key;
  block.keys = shared.keys;
  return block;
}

// Whether attend_documents runs these on FlashAttention-2: attend_block's conditions at q's head
// dim (a narrower value head is padded).
bool documents_take_fused_kernel(const at::Tensor& q, const at::Tensor& v);

// The positions of rows [first, first + count) of rank `rank`'s 2c rows (chunks.h: its chunk
// `rank`, then chunk 2·CP−1−rank).
std::vector<Positions> rank_row_positions(int rank, int cp, int64_t c, int64_t first, int64_t count);

// As attend_block / attend_block_backward (partial_attention.h: layouts, dtypes, merged
// statistics in the backward), each piece of `pieces` on its own. Fused on CUDA where
// attend_block would be (FlashAttention-2's variable-length kernel; a narrower value head, MLA's,
// padded to the query head dim for it), the fp32 arithmetic otherwise.
PartialAttention attend_documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const BlockDocuments& pieces,
                                  bool causal, double scale, BlockKernel kernel = BlockKernel::Auto);
BlockGrads attend_documents_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& out, const at::Tensor& lse, const BlockDocuments& pieces, bool causal,
                                     double scale, BlockKernel kernel = BlockKernel::Auto);

}  // namespace megatron::cp
