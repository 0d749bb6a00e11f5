#pragma once
// How many times each value occurs, without reading anything back to the host.

#include <ATen/ATen.h>

namespace megatron::moe {

// [bins] int64: how many of `values` (integers in [0, bins)) equal each bin. at::bincount would
// do on the CPU, but on CUDA it reads the values' min and max back to the host first, which
// stalls the host once per call (every MoE layer, forward) and cannot be captured in a CUDA
// graph. A scatter-add of ones is exact for integers in any order.
inline at::Tensor count_per_value(const at::Tensor& values, int64_t bins) {
  const at::Tensor v = values.reshape({-1}).to(at::kLong);
  return at::zeros({bins}, v.options()).scatter_add_(0, v, at::ones_like(v));
}

}  // namespace megatron::moe
