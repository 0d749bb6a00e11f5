#include "model/core_attention.h"

#include <ATen/ATen.h>

#include "tensor_parallel/recompute.h"

namespace megatron {

at::Tensor SdpaAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& attention_mask, double dropout) const {
  const int64_t s = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  // SDPA wants [b, heads, s, d]; permuted views keep d contiguous, which the kernels need.
  at::Tensor out = tp_.random(dropout > 0.0, [&] {
    return at::scaled_dot_product_attention(
        q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}),
        attention_mask.defined() ? std::optional<at::Tensor>(attention_mask) : std::nullopt, dropout,
        /*is_causal=*/!attention_mask.defined(), /*scale=*/softmax_scale_, /*enable_gqa=*/k.size(2) != heads);
  });                                                             // [b, H/tp, s, dv]
  return out.permute({2, 0, 1, 3}).reshape({s, b, heads * value_dim});  // [s, b, H*dv]
}

at::Tensor attend(const CoreAttention& core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& attention_mask, double dropout, bool recompute, const tp::TensorParallel& tp) {
  if (!recompute) return core.forward(q, k, v, attention_mask, dropout);
  auto region = [&core, dropout, attention_mask](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{core.forward(in[0], in[1], in[2], attention_mask, dropout)};
  };
  return tp::recompute_in_backward(region, {q, k, v}, tp, dropout > 0.0)[0];
}

}  // namespace megatron
