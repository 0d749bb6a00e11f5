#include "model/context_parallel_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "context_parallel/blockwise_attention.h"
#include "context_parallel/chunks.h"
#include "context_parallel/ring_attention.h"
#include "model/document_attention.h"
#include "tensor_parallel/mappings.h"

namespace megatron {

ContextParallelAttention::ContextParallelAttention(const tp::TensorParallel& tp, std::string comm_type,
                                                   std::optional<double> softmax_scale, std::shared_ptr<DocumentsMemo> documents)
    : cp_(tp.context),
      comm_type_(std::move(comm_type)),
      softmax_scale_(softmax_scale),
      documents_(documents),
      whole_sequence_(tp, softmax_scale, documents) {
  TORCH_CHECK(comm_type_ == "p2p" || comm_type_ == "all_gather" || comm_type_ == "a2a", "--cp-comm-type ", comm_type_,
              ": expected p2p, all_gather or a2a");
}

double ContextParallelAttention::scale_for(const at::Tensor& q) const {
  return softmax_scale_ ? *softmax_scale_ : 1.0 / std::sqrt(double(q.size(-1)));
}

at::Tensor ContextParallelAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& attention_mask, double dropout) const {
  // Refused with the flags' names in finalize_config; this guards other callers.
  TORCH_CHECK(dropout == 0.0, "context-parallel attention has no dropout (--attention-dropout 0)");
  if (comm_type_ == "p2p") return ring(q, k, v, attention_mask);
  if (comm_type_ == "all_gather") return gathered(q, k, v, attention_mask);
  return ulysses(q, k, v, attention_mask);
}

std::optional<cp::PackedDocuments> ContextParallelAttention::packed_documents(const at::Tensor& mask) const {
  if (!mask.defined()) return std::nullopt;
  const std::optional<Documents> documents = documents_ ? documents_->of(mask) : documents_of(mask);
  if (!documents) return std::nullopt;
  return cp::PackedDocuments{documents->starts, mask.size(0), is_document_ids(mask) ? mask.size(1) : mask.size(2)};
}

at::Tensor ContextParallelAttention::ring(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& mask) const {
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  const std::optional<cp::PackedDocuments> documents = packed_documents(mask);
  // Another mask: this rank's rows of it, [b, 1, 2c, S].
  const at::Tensor mine = mask.defined() && !documents ? cp::rank_rows(mask, 2, cp_.size(), cp_.rank()) : at::Tensor();
  const at::Tensor out = cp::ring_attention(q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}), mine,
                                            scale_for(q), cp_, documents ? &*documents : nullptr);  // [b, H/tp, 2c, dv]
  return out.permute({2, 0, 1, 3}).reshape({rows, b, heads * value_dim});
}

at::Tensor ContextParallelAttention::gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                              const at::Tensor& mask) const {
  const int cp = cp_.size();
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  // [S, b, G/tp, d] in sequence order; backward: each rank's rows' gradients summed back to it.
  const at::Tensor all_k = cp::rows_in_sequence_order(tp::gather_from_sp(k.contiguous(), cp_), 0, cp);
  const at::Tensor all_v = cp::rows_in_sequence_order(tp::gather_from_sp(v.contiguous(), cp_), 0, cp);
  // Causal by true position, block by block: each of this rank's chunks sees the keys before it
  // fully and its own chunk causally (no mask: flash kernels on CUDA).
  const int64_t c = rows / 2;
  std::vector<cp::KeyBlock> blocks;
  for (const int64_t chunk : {int64_t(cp_.rank()), int64_t(2 * cp - 1 - cp_.rank())}) {
    const int64_t first_query = chunk == cp_.rank() ? 0 : c;
    if (chunk > 0) blocks.push_back({first_query, c, 0, chunk * c, false});
    blocks.push_back({first_query, c, chunk * c, c, true});
  }
  const std::optional<cp::PackedDocuments> documents = packed_documents(mask);
  std::shared_ptr<std::vector<cp::BlockDocuments>> pieces;
  if (documents) {
    pieces = std::make_shared<std::vector<cp::BlockDocuments>>();
    for (const cp::KeyBlock& blk : blocks) {
      pieces->push_back(cp::shared_documents(*documents, cp::rank_row_positions(cp_.rank(), cp, c, blk.first_query, blk.queries),
                                             {{blk.first_key, blk.keys}}, q.device()));
    }
  }
  // Another mask: this rank's rows of it, [b, 1, 2c, S].
  const at::Tensor mine = mask.defined() && !documents ? cp::rank_rows(mask, 2, cp, cp_.rank()) : at::Tensor();
  const at::Tensor out = cp::blockwise_attention(q.permute({1, 2, 0, 3}), all_k.permute({1, 2, 0, 3}), all_v.permute({1, 2, 0, 3}),
                                                 blocks, mine, scale_for(q), pieces);  // [b, H/tp, 2c, dv]
  return out.permute({2, 0, 1, 3}).reshape({rows, b, heads * value_dim});
}

namespace {

// [2c, b, n, d] this rank's rows of n heads -> [S, b, n / cp, d]: every row of the sequence for
// this rank's share of the heads (rank j takes heads j·n/cp ..).
at::Tensor heads_for_sequence(const at::Tensor& x, const dist::Group& cp) {
  const int size = cp.size();
  const int64_t rows = x.size(0), b = x.size(1), n = x.size(2), d = x.size(3);
  const at::Tensor by_head_group =
      x.reshape({rows, b, size, n / size, d}).permute({2, 0, 1, 3, 4}).reshape({size * rows, b, n / size, d});
  const at::Tensor by_source = tp::all_to_all(by_head_group.contiguous(), cp);  // [cp (source) x 2c, b, n/cp, d]
  return cp::rows_in_sequence_order(by_source, 0, size);
}

// The inverse: [S, b, n / cp, d] -> [2c, b, n, d].
at::Tensor sequence_for_heads(const at::Tensor& x, const dist::Group& cp) {
  const int size = cp.size();
  std::vector<at::Tensor> per_rank;
  for (int r = 0; r < size; ++r) per_rank.push_back(cp::rank_rows(x, 0, size, r));
  const at::Tensor back = tp::all_to_all(at::cat(per_rank, 0).contiguous(), cp);  // [cp (head group) x 2c, b, n/cp, d]
  const int64_t rows = back.size(0) / size, b = x.size(1), share = x.size(2), d = x.size(3);
  return back.view({size, rows, b, share, d}).permute({1, 2, 0, 3, 4}).reshape({rows, b, size * share, d});
}

}  // namespace

at::Tensor ContextParallelAttention::ulysses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& mask) const {
  const int cp = cp_.size();
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), groups = k.size(2), value_dim = v.size(3);
  at::Tensor keys = k, values = v;
  if (groups % cp != 0) {
    // Fewer key/value heads than ranks to share them: each query head gets its own copy.
    const int64_t per_group = heads / groups;
    keys = k.unsqueeze(3).expand({rows, b, groups, per_group, k.size(3)}).reshape({rows, b, heads, k.size(3)});
    values = v.unsqueeze(3).expand({rows, b, groups, per_group, value_dim}).reshape({rows, b, heads, value_dim});
  }
  const at::Tensor q_all = heads_for_sequence(q, cp_);                                   // [S, b, H/(tp cp), d]
  const at::Tensor out = whole_sequence_.forward(q_all, heads_for_sequence(keys, cp_), heads_for_sequence(values, cp_), mask,
                                                 0.0);                                      // [S, b, H/(tp cp) * dv]
  return sequence_for_heads(out.view({out.size(0), b, q_all.size(2), value_dim}), cp_).reshape({rows, b, heads * value_dim});
}

}  // namespace megatron
