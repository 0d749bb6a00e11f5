#include "model/core_attention.h"

#include <ATen/ATen.h>

namespace megatron {

at::Tensor SdpaAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& attention_mask, double dropout) const {
  const int64_t s = q.size(0), b = q.size(1), heads = q.size(2), head_dim = q.size(3);
  // SDPA wants [b, heads, s, d]; permuted views keep d contiguous, which the kernels need.
  at::Tensor out = tp_.random(dropout > 0.0, [&] {
    return at::scaled_dot_product_attention(
        q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}),
        attention_mask.defined() ? std::optional<at::Tensor>(attention_mask) : std::nullopt, dropout,
        /*is_causal=*/!attention_mask.defined(), /*scale=*/std::nullopt, /*enable_gqa=*/k.size(2) != heads);
  });                                                          // [b, H/tp, s, d]
  return out.permute({2, 0, 1, 3}).reshape({s, b, heads * head_dim});  // [s, b, H*d]
}

}  // namespace megatron
