#include "moe/token_dispatcher.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/moe_ops.h"
#include "moe/counts.h"
#include "tensor_parallel/mappings.h"

namespace megatron::moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::vector<int64_t> to_host(const at::Tensor& t) {
  const at::Tensor cpu = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
}

// x's rows in `order`, a permutation whose inverse is known: backward gathers with the inverse
// instead of index_select's scatter-add.
struct PermuteRows : torch::autograd::Function<PermuteRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& order, const at::Tensor& inverse) {
    ctx->save_for_backward({inverse});
    return x.index_select(0, order);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0].index_select(0, ctx->get_saved_variables()[0]), {}, {}};
  }
};

// slots [num_pairs]: the row carrying each pair (slots[pairs[r]] = r), -1 where none does.
at::Tensor slots_of(const at::Tensor& pairs, int64_t num_pairs) {
  const at::Tensor target = at::where(pairs < 0, at::full({}, num_pairs, pairs.options()), pairs);
  at::Tensor slots = at::full({num_pairs + 1}, -1, pairs.options());
  slots.scatter_(0, target, at::arange(pairs.numel(), pairs.options()));  // padding rows all land in the extra slot
  return slots.narrow(0, 0, num_pairs);
}

// Pairs grouped by expert, in pair order within each, every expert's group padded with -1 to
// `rows` rows: [experts * rows]. expert [P]: each pair's expert, a value outside [0, experts)
// for pairs not placed here. Shapes are static (no host synchronisation); the router's capacity
// keeps every expert's pairs within `rows` (any beyond would be left out, never overwrite).
at::Tensor padded_groups(const at::Tensor& expert, int64_t experts, int64_t rows) {
  const int64_t P = expert.numel();
  const at::Tensor absent = at::full({}, experts, expert.options());
  const at::Tensor key = at::where((expert >= 0) & (expert < experts), expert, absent);  // absent pairs sort last
  const at::Tensor order = std::get<1>(key.sort(std::optional<bool>(true), 0, false));   // [P]
  const at::Tensor sorted = key.index_select(0, order);
  const at::Tensor counts = count_per_value(key, experts + 1);
  const at::Tensor rank = at::arange(P, expert.options()) - (counts.cumsum(0) - counts).index_select(0, sorted);
  const at::Tensor row = at::where((sorted < experts) & (rank < rows), sorted * rows + rank, at::full({}, experts * rows, expert.options()));
  at::Tensor pairs = at::full({experts * rows + 1}, -1, expert.options());
  pairs.scatter_(0, row, order);  // duplicates only in the extra row
  return pairs.narrow(0, 0, experts * rows);
}

}  // namespace

TokenDispatcher::TokenDispatcher(const ModelConfig& c, const dist::Group& ep)
    : ep_(ep),
      alltoall_(c.moe_token_dispatcher_type == "alltoall"),
      num_experts_(c.num_experts),
      topk_(c.moe_router_topk),
      first_(c.num_experts / ep.size() * ep.rank()),
      local_(c.num_experts / ep.size()),
      permute_impl_(c.moe_permute_fusion ? kernels::Impl::Auto : kernels::Impl::Composite) {}

Dispatched TokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing) {
  if (!alltoall_ || ep_.size() == 1) return dispatch_allgather(tokens, routing);
  return routing.padded_capacity > 0 ? dispatch_alltoall_padded(tokens, routing) : dispatch_alltoall(tokens, routing);
}

Dispatched TokenDispatcher::dispatch_allgather(const at::Tensor& tokens, const Routing& routing) {
  at::Tensor x = tokens, probs = routing.probs, indices = routing.indices, kept = routing.kept;  // [T, h], [T, k] x 3
  if (ep_.size() > 1) {
    x = tp::gather_from_sp(x, ep_);  // [ep * T, h]; backward: each rank's gradient summed back to its owner
    probs = tp::gather_from_sp(probs, ep_);
    indices = tp::all_gather_rows(indices, ep_);
    if (kept.defined()) kept = tp::all_gather_rows(kept, ep_);
  }
  probs_ = probs;
  const int64_t num_pairs = x.size(0) * topk_;
  at::Tensor expert = indices.reshape({-1}) - first_;  // [T k] local ids; other ranks' experts fall outside [0, local)
  if (kept.defined()) expert = at::where(kept.reshape({-1}), expert, at::full({}, -1, expert.options()));  // dropped: nowhere
  Dispatched out;
  if (routing.padded_capacity > 0) {
    const int64_t rows = routing.padded_capacity * ep_.size();  // each EP rank's tokens bring `capacity` rows per expert
    pairs_ = padded_groups(expert, local_, rows);
    out.counts = at::full({local_}, rows, expert.options());
  } else if (local_ == num_experts_ && !kept.defined()) {  // every pair is here: no host synchronisation
    pairs_ = std::get<1>(expert.sort(std::optional<bool>(true), 0, false));  // by expert, token order within
    out.counts = count_per_value(expert, local_);
  } else {
    const at::Tensor mine = at::nonzero((expert >= 0) & (expert < local_)).reshape({-1});
    const at::Tensor local_expert = expert.index_select(0, mine);
    pairs_ = mine.index_select(0, std::get<1>(local_expert.sort(std::optional<bool>(true), 0, false)));
    out.counts = count_per_value(local_expert, local_);
  }
  slots_ = slots_of(pairs_, num_pairs);
  out.rows = kernels::moe_permute(x, pairs_, slots_, topk_, permute_impl_);  // [N, h]
  return out;
}

Dispatched TokenDispatcher::dispatch_alltoall(const at::Tensor& tokens, const Routing& routing) {
  const int ep = ep_.size();
  probs_ = routing.probs;
  const int64_t num_pairs = tokens.size(0) * topk_;
  at::Tensor expert = routing.indices.reshape({-1});  // [T k]
  if (routing.kept.defined()) {
    // Dropped pairs sort past every expert (as expert E) and are not sent.
    expert = at::where(routing.kept.reshape({-1}), expert, at::full({}, int64_t(num_experts_), expert.options()));
  }
  pairs_ = std::get<1>(expert.sort(std::optional<bool>(true), 0, false));  // by expert, token order within
  if (routing.kept.defined()) pairs_ = pairs_.narrow(0, 0, routing.kept.sum().item<int64_t>());
  slots_ = slots_of(pairs_, num_pairs);
  const at::Tensor rows = kernels::moe_permute(tokens, pairs_, slots_, topk_, permute_impl_);  // [kept pairs, h] by expert
  // How many rows every rank sends each expert: [ep, E] on the host.
  const at::Tensor counts = count_per_value(expert, num_experts_ + 1).narrow(0, 0, num_experts_);  // dropped: bin E
  const std::vector<int64_t> all = to_host(tp::all_gather_rows(counts.unsqueeze(0), ep_));
  auto sent = [&](int from, int expert_id) { return all[size_t(from) * num_experts_ + expert_id]; };
  in_splits_.assign(size_t(ep), 0);
  out_splits_.assign(size_t(ep), 0);
  for (int r = 0; r < ep; ++r) {
    for (int e = r * local_; e < (r + 1) * local_; ++e) in_splits_[size_t(r)] += sent(ep_.rank(), e);
    for (int e = first_; e < first_ + local_; ++e) out_splits_[size_t(r)] += sent(r, e);
  }
  const at::Tensor received = tp::all_to_all(rows, ep_, out_splits_, in_splits_);  // by source rank, then expert
  // Regroup by local expert (then source rank), as the experts take them.
  std::vector<int64_t> start(size_t(ep) * local_);  // where (rank r, expert e) begins in `received`
  int64_t at = 0;
  for (int r = 0; r < ep; ++r) {
    for (int e = 0; e < local_; ++e) {
      start[size_t(r) * local_ + e] = at;
      at += sent(r, first_ + e);
    }
  }
  std::vector<int64_t> regroup;
  regroup.reserve(size_t(at));
  std::vector<int64_t> local_counts(size_t(local_), 0);
  for (int e = 0; e < local_; ++e) {
    for (int r = 0; r < ep; ++r) {
      const int64_t n = sent(r, first_ + e);
      for (int64_t i = 0; i < n; ++i) regroup.push_back(start[size_t(r) * local_ + e] + i);
      local_counts[size_t(e)] += n;
    }
  }
  std::vector<int64_t> inverse(regroup.size());
  for (size_t i = 0; i < regroup.size(); ++i) inverse[size_t(regroup[i])] = int64_t(i);
  const at::TensorOptions index = at::TensorOptions().dtype(at::kLong);
  regroup_ = at::tensor(regroup, index).to(tokens.device());
  regroup_inverse_ = at::tensor(inverse, index).to(tokens.device());
  Dispatched out;
  out.rows = PermuteRows::apply(received, regroup_, regroup_inverse_);
  out.counts = at::tensor(local_counts, index).to(tokens.device());
  return out;
}

Dispatched TokenDispatcher::dispatch_alltoall_padded(const at::Tensor& tokens, const Routing& routing) {
  // Every rank sends every expert exactly `capacity` rows: the splits and counts are known
  // without exchanging any (no host synchronisation).
  const int ep = ep_.size();
  const int64_t capacity = routing.padded_capacity, h = tokens.size(1);
  probs_ = routing.probs;
  at::Tensor expert = routing.indices.reshape({-1});  // [T k]
  if (routing.kept.defined()) expert = at::where(routing.kept.reshape({-1}), expert, at::full({}, -1, expert.options()));
  pairs_ = padded_groups(expert, num_experts_, capacity);  // [E capacity] by expert
  slots_ = slots_of(pairs_, tokens.size(0) * topk_);
  const at::Tensor rows = kernels::moe_permute(tokens, pairs_, slots_, topk_, permute_impl_);
  padded_rows_ = capacity;
  in_splits_.assign(size_t(ep), local_ * capacity);
  out_splits_ = in_splits_;
  const at::Tensor received = tp::all_to_all(rows, ep_, out_splits_, in_splits_);  // [ep, local, capacity, h] by source rank
  Dispatched out;
  out.rows = received.view({ep, local_, capacity, h}).transpose(0, 1).reshape({-1, h});  // by local expert, then source
  out.counts = at::full({local_}, ep * capacity, expert.options());
  return out;
}

at::Tensor TokenDispatcher::combine(const at::Tensor& expert_output) {
  at::Tensor y = expert_output;  // [N, h]
  const int ep = ep_.size();
  if (alltoall_ && ep > 1) {
    const int64_t h = y.size(1);
    if (padded_rows_ > 0) {
      y = y.view({local_, ep, padded_rows_, h}).transpose(0, 1).reshape({-1, h});  // back to the order received
    } else {
      y = PermuteRows::apply(y, regroup_inverse_, regroup_);
    }
    y = tp::all_to_all(y, ep_, in_splits_, out_splits_);  // [rows sent, h], as sent
  }
  at::Tensor out = kernels::moe_unpermute(y, probs_, pairs_, slots_, permute_impl_);  // [T, h]
  if (!alltoall_ && ep > 1) out = tp::reduce_scatter_to_sp(out, ep_);                 // this rank's tokens, summed over EP
  padded_rows_ = 0;
  return out;
}

}  // namespace megatron::moe
