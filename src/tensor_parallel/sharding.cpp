#include "tensor_parallel/sharding.h"

#include <ATen/ATen.h>

namespace megatron::tp {

at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int size) {
  if (spec.replicated() || size == 1) return full;
  if (spec.gated) {
    auto halves = full.chunk(2, 0);
    return at::cat({halves[0].chunk(size, 0)[rank], halves[1].chunk(size, 0)[rank]}, 0);
  }
  TORCH_CHECK(full.size(spec.dim) % size == 0, "dimension ", spec.dim, " of size ", full.size(spec.dim),
              " does not split into ", size, " tensor-parallel parts");
  return full.chunk(size, spec.dim)[rank];
}

at::Tensor unshard(const std::vector<at::Tensor>& parts, const ShardSpec& spec) {
  TORCH_CHECK(!parts.empty(), "unshard: no parts");
  if (spec.replicated() || parts.size() == 1) return parts[0];
  if (spec.gated) {
    std::vector<at::Tensor> gates, ups;
    for (const auto& p : parts) {
      auto halves = p.chunk(2, 0);
      gates.push_back(halves[0]);
      ups.push_back(halves[1]);
    }
    return at::cat({at::cat(gates, 0), at::cat(ups, 0)}, 0);
  }
  return at::cat(parts, spec.dim);
}

at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, const dist::Group& tp) {
  if (spec.replicated() || tp.size() == 1) return local;
  at::Tensor rows = local.movedim(spec.dim, 0).contiguous();  // the split dimension first
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] *= tp.size();
  at::Tensor gathered = at::empty(shape, rows.options());
  tp.all_gather(gathered, rows);
  std::vector<at::Tensor> parts;
  for (const auto& p : gathered.chunk(tp.size(), 0)) parts.push_back(p.movedim(0, spec.dim));
  return unshard(parts, spec).contiguous();
}

std::vector<int64_t> full_shape(at::IntArrayRef local, const ShardSpec& spec, int size) {
  std::vector<int64_t> shape = local.vec();
  if (!spec.replicated()) shape[spec.dim] *= size;
  return shape;
}

}  // namespace megatron::tp
