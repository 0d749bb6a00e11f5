// Moves each token to the ranks holding its experts and the experts' outputs back (Megatron-
// Core's token dispatchers), for this rank's local experts [first, first + count):
//
//   allgather  every expert-parallel rank gathers all EP ranks' tokens, runs its own experts on
//              the tokens routed to them and reduce-scatters the weighted sums back
//   alltoall   each rank sends every (token, expert) pair to the rank holding the expert and
//              gets the results back (two all-to-alls; the row counts cross to the host once,
//              or never with --moe-pad-expert-input-to-capacity, where every count is the capacity)
//
// Rows reach the experts grouped by local expert, in token order within each expert (padding
// rows, if any, last); the combine weights each row by its routing probability and sums a
// token's k results. The permutations are kernels::moe_permute / moe_unpermute (gathers both
// ways, fused CUDA kernels with --moe-permute-fusion), so backward is deterministic.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "core/config.h"
#include "distributed/process_group.h"
#include "kernels/ops.h"
#include "moe/router.h"

namespace megatron::moe {

struct Dispatched {
  at::Tensor rows;    // [N, h] grouped by local expert
  at::Tensor counts;  // [E_local] int64 on the rows' device: rows of each local expert
};

class TokenDispatcher {
 public:
  TokenDispatcher(const ModelConfig& config, const dist::Group& ep);
  int first_expert() const { return first_; }
  int local_experts() const { return local_; }

  // tokens [T, h] with their routing -> the rows of this rank's experts. Keeps what combine needs.
  Dispatched dispatch(const at::Tensor& tokens, const Routing& routing);
  // The experts' output [N, h] (rows as dispatched) -> [T, h]: each token's weighted sum.
  at::Tensor combine(const at::Tensor& expert_output);

 private:
  Dispatched dispatch_allgather(const at::Tensor& tokens, const Routing& routing);
  Dispatched dispatch_alltoall(const at::Tensor& tokens, const Routing& routing);
  Dispatched dispatch_alltoall_padded(const at::Tensor& tokens, const Routing& routing);

  dist::Group ep_;
  bool alltoall_;
  int num_experts_, topk_, first_, local_;
  kernels::Impl permute_impl_;  // the fused kernels with --moe-permute-fusion

  // Between dispatch and combine:
  at::Tensor probs_;           // [T, k] the routing probabilities of the combined tokens
  at::Tensor pairs_;           // [rows] the pair t k + j each row carries (in dispatch order), -1: padding
  at::Tensor slots_;           // [T k] the row carrying each pair, -1: none here
  at::Tensor regroup_;         // alltoall: received order -> expert-grouped order
  at::Tensor regroup_inverse_; // ... and back
  int64_t padded_rows_ = 0;    // alltoall with padding: rows each (rank, expert) exchanges
  std::vector<int64_t> in_splits_, out_splits_;
};

}  // namespace megatron::moe
