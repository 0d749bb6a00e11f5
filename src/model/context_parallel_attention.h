// Core attention across context-parallel ranks (--context-parallel-size > 1): each rank holds
// two of the sequence's 2·CP chunks (context_parallel/chunks.h) and attends its queries over the
// keys of the whole sequence, by one of Megatron's --cp-comm-type:
//   p2p         ring attention: key/value blocks passed rank to rank, overlapped with the
//               partial attention, merged by log-sum-exp (context_parallel/ring_attention.h)
//   all_gather  keys and values gathered from every rank first (as Llama 3 trained), then the
//               local queries' attention block by block: each chunk over the keys before it, and
//               its own chunk causally (context_parallel/blockwise_attention.h)
//   a2a         Ulysses: an all-to-all trades the heads for the sequence (each rank attends the
//               whole sequence over H / CP heads), and another trades them back
//   a2a+p2p     both (--hierarchical-context-parallel-sizes A P): Ulysses among A adjacent CP
//               ranks, whose chunks together make two chunks of a P-rank split; the ring over
//               those among the P ranks at the same place in their groups (H / A heads each)
// Under packed documents (document ids, or their dense mask) each rank's queries see only their
// document's keys: p2p and all_gather cut each block into the documents it holds
// (context_parallel/document_blocks.h), a2a attends document by document over the whole
// sequence; any other mask is read as it is.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "context_parallel/document_blocks.h"
#include "model/core_attention.h"
#include "model/layer_spec.h"

namespace megatron {

class ContextParallelAttention : public CoreAttention {
 public:
  // softmax_scale: the scores' factor; unset: 1 / sqrt(the query head dim). documents: the
  // model's memo of its masks' packed documents (null: read at every call).
  ContextParallelAttention(const tp::TensorParallel& tp, std::string comm_type, std::optional<double> softmax_scale = std::nullopt,
                           std::shared_ptr<DocumentsMemo> documents = nullptr);
  // q [2c, b, H/tp, d], k [2c, b, G/tp, d], v [2c, b, G/tp, dv]: this rank's rows. attention_mask:
  // [b, S] document ids or [b, 1, S, S] over the whole sequence, or undefined (causal).
  // -> [2c, b, H/tp * dv].
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask,
                     double dropout) const override;

 private:
  // The ring among `ring`'s ranks (cp_, or a2a+p2p's second level), each holding two chunks of its split.
  at::Tensor ring(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, const dist::Group& ring) const;
  at::Tensor gathered(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
  at::Tensor ulysses(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
  at::Tensor hierarchical(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) const;
  double scale_for(const at::Tensor& q) const;
  // The packed documents of `mask` ([b, 1, S, S]), if it is their mask.
  std::optional<cp::PackedDocuments> packed_documents(const at::Tensor& mask) const;

  dist::Group cp_;
  dist::Group a2a_, p2p_;  // a2a+p2p's levels of cp_
  std::string comm_type_;
  std::optional<double> softmax_scale_;
  std::shared_ptr<DocumentsMemo> documents_;
  SdpaAttention whole_sequence_;  // a2a: each rank's heads over the whole sequence
};

}  // namespace megatron
