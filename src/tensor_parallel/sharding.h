// How each parameter of the GPT model is split across tensor-parallel ranks, decided by its
// Megatron-Core name: column-parallel weights split their output rows (dim 0), row-parallel
// weights their input columns (dim 1), everything else is replicated. SwiGLU's linear_fc1 is
// "gated": each rank holds [gate block; up block], not a contiguous block of [gate; up].
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "dist/process_group.h"

namespace megatron::tp {

struct ShardSpec {
  int dim = -1;        // split dimension; -1 = replicated on every TP rank
  bool gated = false;  // dim 0 holds two stacked halves, each split separately
  bool replicated() const { return dim < 0; }
};

ShardSpec shard_spec(const std::string& name, bool swiglu);

// Whether each TP rank's gradient of a replicated parameter is only a partial sum that must
// be all-reduced across TP: norms on sequence shards and biases added after a reduce-scatter
// (sequence parallel), and q/k norms, which each rank applies to its own heads only.
bool grad_is_partial_across_tp(const std::string& name, bool sequence_parallel);

// This rank's part of a full tensor.
at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int size);
// The full tensor from every rank's part, in rank order.
at::Tensor unshard(const std::vector<at::Tensor>& parts, const ShardSpec& spec);
// The full tensor on every rank of `tp` from each rank's part (collective; no autograd).
at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, const dist::Group& tp);
// The full shape of a tensor whose shard has `local` shape.
std::vector<int64_t> full_shape(at::IntArrayRef local, const ShardSpec& spec, int size);

}  // namespace megatron::tp
