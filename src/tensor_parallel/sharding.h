// A tensor's tensor-parallel shards from the whole and back, by its ShardSpec (which the part
// that created the parameter declared: tensor_parallel/parameters.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "tensor_parallel/parameters.h"

namespace megatron::tp {

// This rank's part of a full tensor.
at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int size);
// The full tensor from every rank's part, in rank order.
at::Tensor unshard(const std::vector<at::Tensor>& parts, const ShardSpec& spec);
// The full tensor on every rank of `tp` from each rank's part (collective; no autograd).
at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, const dist::Group& tp);
// The full shape of a tensor whose shard has `local` shape.
std::vector<int64_t> full_shape(at::IntArrayRef local, const ShardSpec& spec, int size);

}  // namespace megatron::tp
