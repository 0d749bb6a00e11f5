#include "tensor_parallel/sharding.h"

#include <ATen/ATen.h>

#include "model/parameter_names.h"

namespace megatron::tp {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ShardSpec shard_spec(const std::string& name, bool swiglu) {
  if (is_vocab_parallel(name)) return {0, false};
  if (ends_with(name, "linear_qkv.weight") || ends_with(name, "linear_qkv.bias")) return {0, false};
  if (ends_with(name, "linear_fc1.weight") || ends_with(name, "linear_fc1.bias")) return {0, swiglu};
  if (ends_with(name, "linear_proj.weight") || ends_with(name, "linear_fc2.weight")) return {1, false};
  return {};
}

bool grad_is_partial_across_tp(const std::string& name, bool sequence_parallel) {
  if (name.find("q_layernorm") != std::string::npos || name.find("k_layernorm") != std::string::npos) return true;
  if (!sequence_parallel) return false;
  return name.find("layer_norm_") != std::string::npos || name.find("final_layernorm") != std::string::npos ||
         ends_with(name, "linear_proj.bias") || ends_with(name, "linear_fc2.bias");
}

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
