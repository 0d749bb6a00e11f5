#include "context_parallel/blockwise_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "context_parallel/partial_attention.h"
#include "context_parallel/saved_attention.h"

namespace megatron::cp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Besides q, k and v (autograd records every tensor argument's metadata; an undefined mask has none).
struct BlockSettings {
  std::vector<KeyBlock> blocks;
  at::Tensor mask;
  double scale;
  std::shared_ptr<const std::vector<BlockDocuments>> pieces;  // per block, under packed documents
};

// Under packed documents only the rows the block's documents share (none: nothing to compute).
KeyBlock block_at(const KeyBlock& blk, const std::vector<BlockDocuments>* pieces, size_t i) {
  return pieces ? shared_rows(blk, (*pieces)[i]) : blk;
}

at::Tensor block_mask(const at::Tensor& mask, const KeyBlock& blk) {
  return mask.defined() ? mask.narrow(2, blk.first_query, blk.queries).narrow(3, blk.first_key, blk.keys) : mask;
}

struct BlockwiseAttention : torch::autograd::Function<BlockwiseAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const BlockSettings& s) {
    PartialAttention acc = empty_partial(q.size(0), q.size(1), q.size(2), v.size(3), q.options());
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      const KeyBlock blk = block_at(s.blocks[i], s.pieces.get(), i);
      if (blk.queries == 0) continue;
      const at::Tensor bq = q.narrow(2, blk.first_query, blk.queries), bk = k.narrow(2, blk.first_key, blk.keys),
                       bv = v.narrow(2, blk.first_key, blk.keys);
      merge_into(acc,
                 s.pieces ? attend_documents(bq, bk, bv, (*s.pieces)[i], blk.causal, s.scale)
                          : attend_block(bq, bk, bv, blk.causal, block_mask(s.mask, blk), s.scale),
                 blk.first_query);
    }
    const at::Tensor out = acc.out.to(q.scalar_type());
    SavedAttention{q, k, v, out, acc.lse, s.mask, s.scale, s.pieces}.save(ctx);
    std::vector<int64_t> flat;  // five numbers a block
    for (const KeyBlock& blk : s.blocks) flat.insert(flat.end(), {blk.first_query, blk.queries, blk.first_key, blk.keys, blk.causal});
    ctx->saved_data["blocks"] = flat;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedAttention s = SavedAttention::load(ctx);
    const at::Tensor &q = s.q, &k = s.k, &v = s.v, &out = s.out, &lse = s.lse, &mask = s.mask;
    const double scale = s.scale;
    const std::vector<int64_t> flat = ctx->saved_data["blocks"].toIntVector();
    const at::Tensor dout = grads[0].to(q.scalar_type()).contiguous();
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor dk = at::zeros(k.sizes(), k.options().dtype(at::kFloat)), dv = at::zeros(v.sizes(), v.options().dtype(at::kFloat));
    for (size_t i = 0; i + 4 < flat.size(); i += 5) {
      const KeyBlock blk = block_at({flat[i], flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4] != 0}, s.pieces.get(), i / 5);
      if (blk.queries == 0) continue;
      const at::Tensor bdout = dout.narrow(2, blk.first_query, blk.queries), bq = q.narrow(2, blk.first_query, blk.queries),
                       bk = k.narrow(2, blk.first_key, blk.keys), bv = v.narrow(2, blk.first_key, blk.keys),
                       bout = out.narrow(2, blk.first_query, blk.queries), blse = lse.narrow(2, blk.first_query, blk.queries);
      const BlockGrads g = s.pieces ? attend_documents_backward(bdout, bq, bk, bv, bout, blse, (*s.pieces)[i / 5], blk.causal, scale)
                                    : attend_block_backward(bdout, bq, bk, bv, bout, blse, blk.causal, block_mask(mask, blk), scale);
      dq.narrow(2, blk.first_query, blk.queries).add_(g.dq);
      dk.narrow(2, blk.first_key, blk.keys).add_(g.dk);
      dv.narrow(2, blk.first_key, blk.keys).add_(g.dv);
    }
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::vector<KeyBlock>& blocks,
                               const at::Tensor& mask, double scale, std::shared_ptr<const std::vector<BlockDocuments>> pieces) {
  TORCH_CHECK(!pieces || (!mask.defined() && pieces->size() == blocks.size()),
              "blockwise_attention: document pieces for each block, without a mask");
  return BlockwiseAttention::apply(q, k, v, BlockSettings{blocks, mask, scale, std::move(pieces)});
}

}  // namespace megatron::cp
