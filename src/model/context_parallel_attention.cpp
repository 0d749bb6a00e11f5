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
      a2a_(tp.context_a2a),
      p2p_(tp.context_p2p),
      comm_type_(std::move(comm_type)),
      softmax_scale_(softmax_scale),
      documents_(documents),
      whole_sequence_(tp, softmax_scale, documents) {
  TORCH_CHECK(comm_type_ == "p2p" || comm_type_ == "all_gather" || comm_type_ == "a2a" || comm_type_ == "a2a+p2p", "--cp-comm-type ",
              comm_type_, ": expected p2p, all_gather, a2a or a2a+p2p");
  // Refused with the flags' names in finalize_config; this guards other callers.
  TORCH_CHECK(comm_type_ != "a2a+p2p" || a2a_.size() * p2p_.size() == cp_.size(), "--cp-comm-type a2a+p2p: levels of ", a2a_.size(),
              " x ", p2p_.size(), " ranks for a context-parallel group of ", cp_.size(), " (--hierarchical-context-parallel-sizes)");
}

double ContextParallelAttention::scale_for(const at::Tensor& q) const {
  return softmax_scale_ ? *softmax_scale_ : 1.0 / std::sqrt(double(q.size(-1)));
}

at::Tensor ContextParallelAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& attention_mask, double dropout) const {
  // Refused with the flags' names in finalize_config; this guards other callers.
  TORCH_CHECK(dropout == 0.0, "context-parallel attention has no dropout (--attention-dropout 0)");
  if (comm_type_ == "p2p") return ring(q, k, v, attention_mask, cp_);
  if (comm_type_ == "all_gather") return gathered(q, k, v, attention_mask);
  if (comm_type_ == "a2a+p2p") return hierarchical(q, k, v, attention_mask);
  return ulysses(q, k, v, attention_mask);
}

std::optional<cp::PackedDocuments> ContextParallelAttention::packed_documents(const at::Tensor& mask) const {
  if (!mask.defined()) return std::nullopt;
  const std::optional<Documents> documents = documents_ ? documents_->of(mask) : documents_of(mask);
  if (!documents) return std::nullopt;
  return cp::PackedDocuments{documents->starts, mask.size(0), is_document_ids(mask) ? mask.size(1) : mask.size(2)};
}

at::Tensor ContextParallelAttention::ring(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                          const dist::Group& ring) const {
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  const std::optional<cp::PackedDocuments> documents = packed_documents(mask);
  // Another mask: this rank's rows of it, [b, 1, 2c, S].
  const at::Tensor mine = mask.defined() && !documents ? cp::rank_rows(mask, 2, ring.size(), ring.rank()) : at::Tensor();
  const at::Tensor out = cp::ring_attention(q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}), mine,
                                            scale_for(q), ring, documents ? &*documents : nullptr);  // [b, H/tp, 2c, dv]
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

// [2c, b, n, d] this rank's rows of n heads -> [2c · |cp|, b, n / |cp|, d]: every row the group's
// ranks hold, in sequence order, for this rank's share of the heads (rank j takes heads j·n/|cp|
// ..). Over the whole CP group that is the sequence; over a2a+p2p's first level, its two spans.
at::Tensor heads_for_sequence(const at::Tensor& x, const dist::Group& cp) {
  const int size = cp.size();
  const int64_t rows = x.size(0), b = x.size(1), n = x.size(2), d = x.size(3);
  const at::Tensor by_head_group =
      x.reshape({rows, b, size, n / size, d}).permute({2, 0, 1, 3, 4}).reshape({size * rows, b, n / size, d});
  const at::Tensor by_source = tp::all_to_all(by_head_group.contiguous(), cp);  // [cp (source) x 2c, b, n/cp, d]
  return cp::rows_in_sequence_order(by_source, 0, size);
}

// The inverse: [2c · |cp|, b, n / |cp|, d] -> [2c, b, n, d].
at::Tensor sequence_for_heads(const at::Tensor& x, const dist::Group& cp) {
  const int size = cp.size();
  std::vector<at::Tensor> per_rank;
  for (int r = 0; r < size; ++r) per_rank.push_back(cp::rank_rows(x, 0, size, r));
  const at::Tensor back = tp::all_to_all(at::cat(per_rank, 0).contiguous(), cp);  // [cp (head group) x 2c, b, n/cp, d]
  const int64_t rows = back.size(0) / size, b = x.size(1), share = x.size(2), d = x.size(3);
  return back.view({size, rows, b, share, d}).permute({1, 2, 0, 3, 4}).reshape({rows, b, size * share, d});
}

// k or v [2c, b, G, d] for `heads` query heads traded over `ranks` ranks: as it is when its G
// heads divide over them, else one copy per query head (fewer key/value heads than ranks).
at::Tensor shareable_key_heads(const at::Tensor& x, int64_t heads, int ranks) {
  const int64_t rows = x.size(0), b = x.size(1), groups = x.size(2), d = x.size(3);
  if (groups % ranks == 0) return x;
  return x.unsqueeze(3).expand({rows, b, groups, heads / groups, d}).reshape({rows, b, heads, d});
}

}  // namespace

at::Tensor ContextParallelAttention::ulysses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& mask) const {
  const int cp = cp_.size();
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  const at::Tensor keys = shareable_key_heads(k, heads, cp), values = shareable_key_heads(v, heads, cp);
  const at::Tensor q_all = heads_for_sequence(q, cp_);                                   // [S, b, H/(tp cp), d]
  const at::Tensor out = whole_sequence_.forward(q_all, heads_for_sequence(keys, cp_), heads_for_sequence(values, cp_), mask,
                                                 0.0);                                      // [S, b, H/(tp cp) * dv]
  return sequence_for_heads(out.view({out.size(0), b, q_all.size(2), value_dim}), cp_).reshape({rows, b, heads * value_dim});
}

// The A ranks of this rank's a2a group hold chunks pA + a and 2CP-1-pA-a of the sequence (p its
// place in the ring): together the contiguous spans pA .. pA+A-1 and 2CP-pA-A .. 2CP-1-pA, i.e.
// chunks p and 2P-1-p of the sequence cut into 2P. Ulysses among them puts those two, in sequence
// order, on each of them for H/A heads: exactly a P-rank ring's layout, with chunks A times longer.
at::Tensor ContextParallelAttention::hierarchical(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const at::Tensor& mask) const {
  const int a2a = a2a_.size();
  const int64_t rows = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  const at::Tensor keys = shareable_key_heads(k, heads, a2a), values = shareable_key_heads(v, heads, a2a);
  const at::Tensor q_span = heads_for_sequence(q, a2a_);  // [2 A c, b, H/(tp A), d]: chunks p and 2P-1-p
  const at::Tensor out = ring(q_span, heads_for_sequence(keys, a2a_), heads_for_sequence(values, a2a_), mask, p2p_);  // [2 A c, b, H/(tp A) * dv]
  return sequence_for_heads(out.view({out.size(0), b, q_span.size(2), value_dim}), a2a_).reshape({rows, b, heads * value_dim});
}

}  // namespace megatron
