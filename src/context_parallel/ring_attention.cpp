#include "context_parallel/ring_attention.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "context_parallel/block_results.h"
#include "context_parallel/chunks.h"
#include "context_parallel/document_blocks.h"
#include "context_parallel/partial_attention.h"
#include "context_parallel/saved_attention.h"
#include "kernels/attention_ops.h"
#include "tensor_parallel/group_capsule.h"

namespace megatron::cp {

RingBlock ring_block(int step, int rank, int cp, int64_t c) {
  const int owner = (rank - step + cp) % cp;
  if (owner == rank) return {owner, 0, 2 * c, 0, 2 * c, true};
  if (owner < rank) return {owner, 0, 2 * c, 0, c, false};  // its late chunk lies after both of mine
  return {owner, c, c, 0, 2 * c, false};                     // only my late chunk sees its chunks
}

std::vector<RingGroup> ring_groups(int rank, int cp, int64_t c, int steps_per_block) {
  TORCH_CHECK(steps_per_block >= 1, "ring_groups: steps_per_block ", steps_per_block, " (at least 1)");
  std::vector<RingGroup> groups;
  for (int step = 0; step < cp; ++step) {
    const RingBlock blk = ring_block(step, rank, cp, c);
    RingGroup* last = groups.empty() ? nullptr : &groups.back();
    const bool same_kind = last && !last->causal && !blk.causal && last->first_query == blk.first_query &&
                           last->first_key == blk.first_key && last->keys == blk.keys;
    if (same_kind && last->steps < steps_per_block) {
      ++last->steps;
    } else {
      groups.push_back({step, 1, blk.first_query, blk.queries, blk.first_key, blk.keys, blk.causal});
    }
  }
  return groups;
}

int ring_steps_per_block(int64_t c, int cp) {
  constexpr int64_t kBlockKeys = 16384;
  return int(std::clamp<int64_t>((kBlockKeys + c - 1) / c, 1, std::max(cp - 1, 1)));
}

at::Tensor group_rows(const RingGroup& group, const std::vector<at::Tensor>& per_step) {
  TORCH_CHECK(int(per_step.size()) == group.steps, "group_rows: ", per_step.size(), " tensors for ", group.steps, " steps");
  if (group.steps == 1) return per_step[0].narrow(2, group.first_key, group.keys);
  std::vector<at::Tensor> rows;
  for (const at::Tensor& x : per_step) rows.push_back(x.narrow(2, group.first_key, group.keys));
  return at::cat(rows, 2);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The mask's part for a group: this rank's query rows over each step's owner's key rows, side by
// side as group_rows lays the keys.
at::Tensor group_mask(const at::Tensor& mask, const RingGroup& group, int rank, int cp) {
  if (!mask.defined()) return mask;
  std::vector<at::Tensor> per_step;
  for (int step = group.first_step; step < group.first_step + group.steps; ++step) {
    per_step.push_back(rank_rows(mask, 3, cp, (rank - step + cp) % cp).transpose(2, 3));  // keys along dim 2 for group_rows
  }
  return group_rows(group, per_step).transpose(2, 3).narrow(2, group.first_query, group.queries);
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
  int64_t numel() const { return c10::multiply_integers(k_shape) + c10::multiply_integers(v_shape); }
  at::Tensor k(const at::Tensor& flat) const { return flat.narrow(0, 0, c10::multiply_integers(k_shape)).view(k_shape); }
  at::Tensor v(const at::Tensor& flat) const {
    return flat.narrow(0, c10::multiply_integers(k_shape), c10::multiply_integers(v_shape)).view(v_shape);
  }
  // A group's keys and values out of its steps' buffers.
  std::pair<at::Tensor, at::Tensor> of_group(const RingGroup& group, const std::vector<at::Tensor>& held) const {
    std::vector<at::Tensor> ks, vs;
    for (int step = group.first_step; step < group.first_step + group.steps; ++step) {
      ks.push_back(k(held[size_t(step)]));
      vs.push_back(v(held[size_t(step)]));
    }
    return {group_rows(group, ks), group_rows(group, vs)};
  }
};

// A rank's share of one step's key/value gradient: rows [first_key, first_key + rows) of the
// owner's, in the block kernels' dtype (views of a group's gradients).
struct KeyValueShare {
  at::Tensor dk, dv;  // [b, G, rows, d], [b, G, rows, dv]; undefined: no share
  int64_t first_key = 0;
  // Adds itself into `sum`, the owner's packed fp32 k/v gradient (fp32 += its dtype, one pass for
  // both). An undefined `sum` is started: written over where the share covers every row (the own
  // block's does), else zeros first.
  void add_to(at::Tensor& sum, const KeyValues& layout, const at::TensorOptions& fp32) {
    const bool start = !sum.defined(), covers_all = dk.defined() && first_key == 0 && dk.size(2) == layout.k_shape[2];
    if (start) sum = covers_all ? at::empty({layout.numel()}, fp32) : at::zeros({layout.numel()}, fp32);
    if (!dk.defined()) return;
    kernels::add_key_value_grads(layout.k(sum).narrow(2, first_key, dk.size(2)), layout.v(sum).narrow(2, first_key, dv.size(2)), dk, dv,
                                 /*overwrite=*/start && covers_all);
    dk.reset();
    dv.reset();
  }
};

// What the ring takes besides q, k and v. The mask travels in here, not as an argument of its
// own: autograd records every tensor argument's metadata and an undefined one has none.
struct RingSettings {
  at::Tensor mask;
  std::shared_ptr<const std::vector<BlockDocuments>> pieces;  // per step, under packed documents
  double scale;
  dist::Group group;
  int steps_per_block;
};

// The rank's groups; under packed documents (one step each) cut to the rows its documents share
// (none: nothing to compute) and attended piece by piece.
std::vector<RingGroup> groups_of(int rank, int cp, int64_t c, int steps_per_block, const std::vector<BlockDocuments>* pieces) {
  std::vector<RingGroup> groups = ring_groups(rank, cp, c, pieces ? 1 : steps_per_block);
  if (pieces) {
    for (RingGroup& group : groups) group = shared_rows(group, (*pieces)[size_t(group.first_step)]);
  }
  return groups;
}

// How many of the groups compute anything (under packed documents some share no rows).
int computed_groups(const std::vector<RingGroup>& groups) {
  int n = 0;
  for (const RingGroup& group : groups) n += group.queries > 0 ? 1 : 0;
  return n;
}

// The last step of each group: when its keys have all arrived.
std::vector<const RingGroup*> group_ending_at(const std::vector<RingGroup>& groups, int cp) {
  std::vector<const RingGroup*> ending(static_cast<size_t>(cp), nullptr);
  for (const RingGroup& group : groups) ending[size_t(group.first_step + group.steps - 1)] = &group;
  return ending;
}

// Drops a step's keys and values once they are sent on and its group is computed.
void release_sent(std::vector<at::Tensor>& held, const RingGroup& group, int step_now) {
  for (int step = group.first_step; step < group.first_step + group.steps && step < step_now; ++step) held[size_t(step)].reset();
}

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const RingSettings& settings) {
    const at::Tensor& mask = settings.mask;
    const dist::Group& g = settings.group;
    const int cp = g.size(), rank = g.rank();
    const int64_t c = q.size(2) / 2;
    const KeyValues layout{k.sizes().vec(), v.sizes().vec()};
    const std::vector<BlockDocuments>* pieces = settings.pieces.get();
    const std::vector<RingGroup> groups = groups_of(rank, cp, c, settings.steps_per_block, pieces);
    const std::vector<const RingGroup*> ending = group_ending_at(groups, cp);
    BlockOutputs outputs(computed_groups(groups));  // the own block (step 0) covers every row
    std::vector<at::Tensor> held(static_cast<size_t>(cp));  // each step's owner's keys and values, packed, while needed
    held[0] = layout.pack(k, v);
    at::Tensor arriving;
    std::vector<dist::Work> in_flight;
    for (int step = 0; step < cp; ++step) {
      if (step > 0) {
        wait_all(in_flight);
        held[size_t(step)] = arriving;
        if (ending[size_t(step - 1)]) held[size_t(step - 1)].reset();  // sent on, and its group done
      }
      if (step + 1 < cp) {
        arriving = at::empty_like(held[size_t(step)]);
        in_flight = pass_on(g, held[size_t(step)], arriving);
      }
      const RingGroup* group = ending[size_t(step)];
      if (!group) continue;
      if (group->queries > 0) {
        const auto [bk, bv] = layout.of_group(*group, held);
        const at::Tensor bq = q.narrow(2, group->first_query, group->queries);
        PartialAttention part = pieces ? attend_documents(bq, bk, bv, (*pieces)[size_t(step)], group->causal, settings.scale)
                                       : attend_block(bq, bk, bv, group->causal, group_mask(mask, *group, rank, cp), settings.scale);
        outputs.add(std::move(part), group->first_query);
      }
      release_sent(held, *group, step);
    }
    const PartialAttention result = outputs.finish(2 * c, q.scalar_type());  // [b, H, 2c, dv], [b, H, 2c] fp32
    const at::Tensor& out = result.out;
    SavedAttention{q, k, v, out, result.lse, mask, settings.scale, settings.pieces}.save(ctx);
    ctx->saved_data["group"] = tp::to_ivalue(g);
    ctx->saved_data["steps_per_block"] = int64_t(settings.steps_per_block);
    return out;
  }

  // The keys and values travel as in the forward; the gradient of step s's keys and values, summed
  // over the ranks they visited, follows `lag` steps behind them: a rank's share of it is ready
  // once step s's group is computed, at most steps_per_block - 1 steps after step s. Each sum
  // goes on while the next step's block is computed.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedAttention s = SavedAttention::load(ctx);
    const at::Tensor &q = s.q, &k = s.k, &v = s.v, &out = s.out, &lse = s.lse, &mask = s.mask;
    const dist::Group g = tp::group_of(ctx->saved_data["group"]);
    const int cp = g.size(), rank = g.rank();
    const int64_t c = q.size(2) / 2;
    const at::Tensor dout = grads[0].to(q.scalar_type()).contiguous();
    const KeyValues layout{k.sizes().vec(), v.sizes().vec()};
    const std::vector<BlockDocuments>* pieces = s.pieces.get();
    const std::vector<RingGroup> groups = groups_of(rank, cp, c, int(ctx->saved_data["steps_per_block"].toInt()), pieces);
    const std::vector<const RingGroup*> ending = group_ending_at(groups, cp);
    // The same on every rank (some ranks' groups are all shorter), so that every rank posts its
    // passes in one order and each pairs with its neighbour's.
    const int lag = pieces ? 0 : std::min(int(ctx->saved_data["steps_per_block"].toInt()), std::max(cp - 1, 1)) - 1;
    BlockQueryGrads dq(computed_groups(groups));  // the own block covers every query row
    std::vector<at::Tensor> held(static_cast<size_t>(cp));
    held[0] = layout.pack(k, v);
    const at::TensorOptions fp32 = k.options().dtype(at::kFloat);
    // Per step: this rank's share of the gradient of its owner's keys and values (views of its
    // group's gradients, kept until added into the sum going on), and the sum arriving from the
    // ranks before ([cp]: this rank's own, complete; fp32).
    std::vector<KeyValueShare> share(static_cast<size_t>(cp));
    std::vector<at::Tensor> sum(static_cast<size_t>(cp + 1));
    at::Tensor arriving;
    std::vector<dist::Work> in_flight, grad_flight;
    for (int step = 0; step < cp + lag; ++step) {
      if (step > 0 && step < cp) {
        wait_all(in_flight);
        held[size_t(step)] = arriving;
        if (ending[size_t(step - 1)]) held[size_t(step - 1)].reset();
      }
      if (step + 1 < cp) {
        arriving = at::empty_like(held[size_t(step)]);
        in_flight = pass_on(g, held[size_t(step)], arriving);
      }
      const RingGroup* group = step < cp ? ending[size_t(step)] : nullptr;
      if (group && group->queries > 0) {
        const auto [bk, bv] = layout.of_group(*group, held);
        const at::Tensor bdout = dout.narrow(2, group->first_query, group->queries), bq = q.narrow(2, group->first_query, group->queries),
                         bout = out.narrow(2, group->first_query, group->queries), blse = lse.narrow(2, group->first_query, group->queries);
        const BlockGrads part =
            pieces ? attend_documents_backward(bdout, bq, bk, bv, bout, blse, (*pieces)[size_t(step)], group->causal, s.scale)
                   : attend_block_backward(bdout, bq, bk, bv, bout, blse, group->causal, group_mask(mask, *group, rank, cp), s.scale);
        dq.add(part.dq, group->first_query);
        for (int i = 0; i < group->steps; ++i) {
          share[size_t(group->first_step + i)] = {part.dk.narrow(2, i * group->keys, group->keys),
                                                  part.dv.narrow(2, i * group->keys, group->keys), group->first_key};
        }
      }
      if (group) release_sent(held, *group, step);
      const int sending = step - lag;  // the step whose keys' gradient goes on now
      if (cp > 1 && sending >= 0) {
        wait_all(grad_flight);
        if (sending > 0) sum[size_t(sending - 1)].reset();  // its pass is complete
        at::Tensor& total = sum[size_t(sending)];  // undefined at step 0: this rank's share starts it
        share[size_t(sending)].add_to(total, layout, fp32);
        sum[size_t(sending + 1)] = at::empty_like(total);
        grad_flight = pass_on(g, total, sum[size_t(sending + 1)]);
      }
    }
    at::Tensor own;  // [k, v] gradient of this rank's rows, fp32
    if (cp > 1) {
      wait_all(grad_flight);
      own = sum[size_t(cp)];
    } else {
      share[0].add_to(own, layout, fp32);
    }
    return {dq.finish(2 * c, q.scalar_type()), layout.k(own).to(k.scalar_type()), layout.v(own).to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                          double scale, const dist::Group& cp, const PackedDocuments* documents, int steps_per_block) {
  const int64_t c = q.size(2) / 2;
  if (steps_per_block == 0) steps_per_block = ring_steps_per_block(c, cp.size());
  TORCH_CHECK(steps_per_block >= 1, "ring_attention: steps_per_block ", steps_per_block, " (0 for the default, else at least 1)");
  if (!documents) return RingAttention::apply(q, k, v, RingSettings{mask, nullptr, scale, cp, steps_per_block});
  TORCH_CHECK(!mask.defined(), "ring_attention: packed documents or a mask, not both");
  // Each step's shared rows and their pieces, computed (and on a GPU copied there) once for the
  // forward and backward.
  auto pieces = std::make_shared<std::vector<BlockDocuments>>();
  for (int step = 0; step < cp.size(); ++step) {
    const RingBlock blk = ring_block(step, cp.rank(), cp.size(), c);
    pieces->push_back(shared_documents(*documents, rank_row_positions(cp.rank(), cp.size(), c, blk.first_query, blk.queries),
                                       rank_row_positions(blk.owner, cp.size(), c, blk.first_key, blk.keys), q.device()));
  }
  // Every token sees itself: the own block shares all its rows, and starts the accumulator.
  TORCH_CHECK(pieces->front().first_query == 0 && pieces->front().queries == 2 * c, "ring_attention: the own block's documents cover ",
              pieces->front().queries, " of its ", 2 * c, " rows");
  return RingAttention::apply(q, k, v, RingSettings{at::Tensor(), std::move(pieces), scale, cp, 1});
}

}  // namespace megatron::cp
