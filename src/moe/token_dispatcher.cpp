#include "moe/token_dispatcher.h"

#include <ATen/ATen.h>

#include "tensor_parallel/mappings.h"

namespace megatron::moe {
namespace {

std::vector<int64_t> to_host(const at::Tensor& t) {
  const at::Tensor cpu = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
}

}  // namespace

TokenDispatcher::TokenDispatcher(const ModelConfig& c, const dist::Group& ep)
    : ep_(ep),
      alltoall_(c.moe_token_dispatcher_type == "alltoall"),
      num_experts_(c.num_experts),
      topk_(c.moe_router_topk),
      first_(c.num_experts / ep.size() * ep.rank()),
      local_(c.num_experts / ep.size()) {}

Dispatched TokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing) {
  return alltoall_ && ep_.size() > 1 ? dispatch_alltoall(tokens, routing) : dispatch_allgather(tokens, routing);
}

Dispatched TokenDispatcher::dispatch_allgather(const at::Tensor& tokens, const Routing& routing) {
  at::Tensor x = tokens, probs = routing.probs, indices = routing.indices, kept = routing.kept;  // [T, h], [T, k] x 3
  if (ep_.size() > 1) {
    x = tp::gather_from_sp(x, ep_);  // [ep * T, h]; backward: each rank's gradient summed back to its owner
    probs = tp::gather_from_sp(probs, ep_);
    indices = tp::all_gather_rows(indices, ep_);
    if (kept.defined()) kept = tp::all_gather_rows(kept, ep_);
  }
  tokens_ = x.size(0);
  probs_ = probs;
  const at::Tensor expert = indices.reshape({-1});  // [T k] the expert of each (token, choice)
  at::Tensor local_expert = expert, mine;           // all pairs are local without EP (or dropping)
  if (local_ < num_experts_ || kept.defined()) {
    at::Tensor local = (expert >= first_) & (expert < first_ + local_);
    if (kept.defined()) local = local & kept.reshape({-1});  // dropped pairs go nowhere
    mine = at::nonzero(local).reshape({-1});
    local_expert = expert.index_select(0, mine) - first_;
  }
  const at::Tensor order = std::get<1>(local_expert.sort(std::optional<bool>(true), 0, false));  // by expert, token order within
  pairs_ = mine.defined() ? mine.index_select(0, order) : order;                                // [N] positions in [T k]
  Dispatched out;
  out.rows = choices(x).index_select(0, pairs_);  // [N, h]
  out.counts = at::bincount(local_expert, {}, local_);  // stays on the device
  return out;
}

at::Tensor TokenDispatcher::choices(const at::Tensor& x) const {
  const int64_t T = x.size(0), h = x.size(1);
  // [T k, h]: row t k + j is token t's copy for its j-th choice. Selecting from these (not from
  // the tokens) makes the backward a gather-free sum over each token's k copies, not an
  // atomic scatter-add of k gradients into one row.
  return x.unsqueeze(1).expand({T, topk_, h}).reshape({T * topk_, h});
}

Dispatched TokenDispatcher::dispatch_alltoall(const at::Tensor& tokens, const Routing& routing) {
  const int ep = ep_.size();
  tokens_ = tokens.size(0);
  probs_ = routing.probs;
  at::Tensor expert = routing.indices.reshape({-1});                         // [T k]
  if (routing.kept.defined()) {
    // Dropped pairs sort past every expert (as expert E) and are not sent.
    expert = at::where(routing.kept.reshape({-1}), expert, at::full({}, int64_t(num_experts_), expert.options()));
  }
  pairs_ = std::get<1>(expert.sort(std::optional<bool>(true), 0, false));  // by expert, token order within
  if (routing.kept.defined()) pairs_ = pairs_.narrow(0, 0, routing.kept.sum().item<int64_t>());
  const at::Tensor rows = choices(tokens).index_select(0, pairs_);  // [kept pairs, h] grouped by expert
  // How many rows every rank sends each expert: [ep, E] on the host.
  const at::Tensor counts = at::bincount(expert, {}, num_experts_ + 1).narrow(0, 0, num_experts_);  // dropped: bin E
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
  Dispatched out;
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
  regroup_inverse_ = at::tensor(inverse, index).to(tokens.device());
  out.rows = received.index_select(0, at::tensor(regroup, index).to(tokens.device()));
  out.counts = at::tensor(local_counts, index).to(tokens.device());
  return out;
}

at::Tensor TokenDispatcher::combine(const at::Tensor& expert_output) {
  at::Tensor y = expert_output;  // [N, h]
  if (alltoall_ && ep_.size() > 1) {
    y = tp::all_to_all(y.index_select(0, regroup_inverse_), ep_, in_splits_, out_splits_);  // [T k, h] as sent
  }
  // Back to [T, k, h] (each pair's row at its place; pairs on other EP ranks stay zero), then each
  // token's k results weighted by their routing probabilities and summed.
  const int64_t h = y.size(1);
  const at::Tensor placed = at::zeros({tokens_ * topk_, h}, y.options()).index_copy(0, pairs_, y).view({tokens_, topk_, h});
  at::Tensor out = (placed * probs_.to(y.scalar_type()).unsqueeze(-1)).sum(1);  // [T, h]
  if (!alltoall_ && ep_.size() > 1) out = tp::reduce_scatter_to_sp(out, ep_);  // this rank's tokens, summed over EP
  return out;
}

}  // namespace megatron::moe
