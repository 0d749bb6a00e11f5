#include "context_parallel/ring_attention.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include <memory>
#include <utility>
#include <vector>

#include "context_parallel/chunks.h"
#include "context_parallel/document_blocks.h"
#include "context_parallel/partial_attention.h"
#include "context_parallel/saved_attention.h"
#include "tensor_parallel/group_capsule.h"

namespace megatron::cp {

RingBlock ring_block(int step, int rank, int cp, int64_t c) {
  const int owner = (rank - step + cp) % cp;
  if (owner == rank) return {owner, 0, 2 * c, 0, 2 * c, true};
  if (owner < rank) return {owner, 0, 2 * c, 0, c, false};  // its late chunk lies after both of mine
  return {owner, c, c, 0, 2 * c, false};                     // only my late chunk sees its chunks
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The mask's part for a block: this rank's query rows over the owner's key rows.
at::Tensor block_mask(const at::Tensor& mask, const RingBlock& blk, int cp) {
  if (!mask.defined()) return mask;
  return rank_rows(mask, 3, cp, blk.owner).narrow(2, blk.first_query, blk.queries).narrow(3, blk.first_key, blk.keys);
}

// Sends `out` to the next rank and receives `in` from the previous one, posted in an order that
// pairs up around the ring (even ranks send first): no deadlock on NCCL, where with two ranks
// both directions share one peer.
std::vector<dist::Work> pass_on(const dist::Group& g, const at::Tensor& out, at::Tensor& in) {
  const int next = (g.rank() + 1) % g.size(), prev = (g.rank() - 1 + g.size()) % g.size();
  std::vector<dist::Work> works;
  if (g.rank() % 2 == 0) {
    works.push_back(g.send_async(out, next));
    works.push_back(g.recv_async(in, prev));
  } else {
    works.push_back(g.recv_async(in, prev));
    works.push_back(g.send_async(out, next));
  }
  return works;
}

void wait_all(std::vector<dist::Work>& works) {
  for (auto& w : works) w.wait();
  works.clear();
}

// k and v of one rank in one flat buffer, so one message carries both.
struct KeyValues {
  std::vector<int64_t> k_shape, v_shape;
  at::Tensor pack(const at::Tensor& k, const at::Tensor& v) const { return at::cat({k.reshape(-1), v.reshape(-1)}); }
  at::Tensor k(const at::Tensor& flat) const { return flat.narrow(0, 0, c10::multiply_integers(k_shape)).view(k_shape); }
  at::Tensor v(const at::Tensor& flat) const {
    return flat.narrow(0, c10::multiply_integers(k_shape), c10::multiply_integers(v_shape)).view(v_shape);
  }
};

// What the ring takes besides q, k and v. The mask travels in here, not as an argument of its
// own: autograd records every tensor argument's metadata and an undefined one has none.
struct RingSettings {
  at::Tensor mask;
  std::shared_ptr<const std::vector<BlockDocuments>> pieces;  // per step, under packed documents
  double scale;
  dist::Group group;
};

// Step `step`'s block; under packed documents only the rows its documents share (none: nothing
// to compute) and their pieces.
RingBlock block_at(int step, int rank, int cp, int64_t c, const std::vector<BlockDocuments>* pieces) {
  const RingBlock blk = ring_block(step, rank, cp, c);
  return pieces ? shared_rows(blk, (*pieces)[size_t(step)]) : blk;
}

// A block's attention: under packed documents piece by piece, else under the mask's rows or causal.
PartialAttention attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const RingBlock& blk, int step,
                        const std::vector<BlockDocuments>* pieces, const at::Tensor& mask, int cp, double scale) {
  if (pieces) return attend_documents(q, k, v, (*pieces)[size_t(step)], blk.causal, scale);
  return attend_block(q, k, v, blk.causal, block_mask(mask, blk, cp), scale);
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const RingSettings& settings) {
    const at::Tensor& mask = settings.mask;
    const double scale = settings.scale;
    const dist::Group& g = settings.group;
    const int cp = g.size(), rank = g.rank();
    const int64_t c = q.size(2) / 2;
    const KeyValues layout{k.sizes().vec(), v.sizes().vec()};
    PartialAttention acc;  // [b, H, 2c, dv] fp32: step 0's block (this rank's own) covers every row
    at::Tensor held = layout.pack(k, v), arriving;
    std::vector<dist::Work> in_flight;
    for (int step = 0; step < cp; ++step) {
      if (step + 1 < cp) {
        arriving = at::empty_like(held);
        in_flight = pass_on(g, held, arriving);
      }
      const RingBlock blk = block_at(step, rank, cp, c, settings.pieces.get());
      if (blk.queries > 0) {
        PartialAttention part = attend(q.narrow(2, blk.first_query, blk.queries), layout.k(held).narrow(2, blk.first_key, blk.keys),
                                       layout.v(held).narrow(2, blk.first_key, blk.keys), blk, step, settings.pieces.get(), mask, cp,
                                       scale);
        if (step == 0) {
          acc = accumulator_from(std::move(part));
        } else {
          merge_into(acc, part, blk.first_query);
        }
      }
      if (step + 1 < cp) {
        wait_all(in_flight);
        held = arriving;
      }
    }
    const at::Tensor out = acc.out.to(q.scalar_type());
    SavedAttention{q, k, v, out, acc.lse, mask, scale, settings.pieces}.save(ctx);
    ctx->saved_data["group"] = tp::to_ivalue(g);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedAttention s = SavedAttention::load(ctx);
    const at::Tensor &q = s.q, &k = s.k, &v = s.v, &out = s.out, &lse = s.lse, &mask = s.mask;
    const double scale = s.scale;
    const dist::Group g = tp::group_of(ctx->saved_data["group"]);
    const int cp = g.size(), rank = g.rank();
    const int64_t c = q.size(2) / 2;
    const at::Tensor dout = grads[0].to(q.scalar_type()).contiguous();
    const KeyValues layout{k.sizes().vec(), v.sizes().vec()};
    at::Tensor dq;  // [b, H, 2c, d] fp32: step 0's block covers every query row
    at::Tensor held = layout.pack(k, v), arriving;
    // The key/value gradient of the block held, summed over the ranks it has visited (fp32).
    at::Tensor held_grad = at::zeros({held.numel()}, held.options().dtype(at::kFloat)), arriving_grad;
    std::vector<dist::Work> in_flight, grad_flight;
    for (int step = 0; step < cp; ++step) {
      if (step + 1 < cp) {
        arriving = at::empty_like(held);
        in_flight = pass_on(g, held, arriving);
      }
      const RingBlock blk = block_at(step, rank, cp, c, s.pieces.get());
      if (blk.queries > 0) {
        const at::Tensor bdout = dout.narrow(2, blk.first_query, blk.queries), bq = q.narrow(2, blk.first_query, blk.queries),
                         bk = layout.k(held).narrow(2, blk.first_key, blk.keys), bv = layout.v(held).narrow(2, blk.first_key, blk.keys),
                         bout = out.narrow(2, blk.first_query, blk.queries), blse = lse.narrow(2, blk.first_query, blk.queries);
        const BlockGrads part =
            s.pieces ? attend_documents_backward(bdout, bq, bk, bv, bout, blse, (*s.pieces)[size_t(step)], blk.causal, scale)
                     : attend_block_backward(bdout, bq, bk, bv, bout, blse, blk.causal, block_mask(mask, blk, cp), scale);
        if (step == 0) {
          dq = at::empty(q.sizes(), q.options().dtype(at::kFloat)).copy_(part.dq);
        } else {
          dq.narrow(2, blk.first_query, blk.queries).add_(part.dq);
        }
        layout.k(held_grad).narrow(2, blk.first_key, blk.keys).add_(part.dk);
        layout.v(held_grad).narrow(2, blk.first_key, blk.keys).add_(part.dv);
      }
      if (cp > 1) {
        // On to the next rank, which holds this block next step; from the previous rank, the
        // gradient of the block arriving (after the last step: of this rank's own block).
        arriving_grad = at::empty_like(held_grad);
        grad_flight = pass_on(g, held_grad, arriving_grad);
        wait_all(grad_flight);
        held_grad = arriving_grad;
      }
      if (step + 1 < cp) {
        wait_all(in_flight);
        held = arriving;
      }
    }
    return {dq.to(q.scalar_type()), layout.k(held_grad).to(k.scalar_type()), layout.v(held_grad).to(v.scalar_type()),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          double scale, const dist::Group& cp, const PackedDocuments* documents) {
  if (!documents) return RingAttention::apply(q, k, v, RingSettings{mask, nullptr, scale, cp});
  TORCH_CHECK(!mask.defined(), "ring_attention: packed documents or a mask, not both");
  // Each step's shared rows and their pieces, computed (and on a GPU copied there) once for the
  // forward and backward.
  auto pieces = std::make_shared<std::vector<BlockDocuments>>();
  const int64_t c = q.size(2) / 2;
  for (int step = 0; step < cp.size(); ++step) {
    const RingBlock blk = ring_block(step, cp.rank(), cp.size(), c);
    pieces->push_back(shared_documents(*documents, rank_row_positions(cp.rank(), cp.size(), c, blk.first_query, blk.queries),
                                       rank_row_positions(blk.owner, cp.size(), c, blk.first_key, blk.keys), q.device()));
  }
  // Every token sees itself: the own block shares all its rows, and starts the accumulator.
  TORCH_CHECK(pieces->front().first_query == 0 && pieces->front().queries == 2 * c, "ring_attention: the own block's documents cover ",
              pieces->front().queries, " of its ", 2 * c, " rows");
  return RingAttention::apply(q, k, v, RingSettings{at::Tensor(), std::move(pieces), scale, cp});
}

}  // namespace megatron::cp
