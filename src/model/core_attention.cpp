#include "model/core_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "context_parallel/partial_attention.h"
#include "core/cuda_device.h"
#include "kernels/attention_ops.h"
#include "model/document_attention.h"
#include "tensor_parallel/recompute.h"

namespace megatron {

at::Tensor SdpaAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& attention_mask, double dropout) const {
  const int64_t s = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  // Packed documents: attention document by document (model/document_attention.h), where the GPU
  // kernel takes them or off the GPU; not while a CUDA graph captures (reading the documents off
  // the mask waits for the device) nor under dropout (SDPA's generator offsets). The mask as
  // document ids, or a dense mask of one query row per token.
  const bool document_ids = is_document_ids(attention_mask);
  if (attention_mask.defined() && dropout == 0.0 && attention_mask.size(0) == b &&
      (document_ids ? attention_mask.size(1) == s : attention_mask.dim() == 4 && attention_mask.size(2) == s) &&
      (!q.is_cuda() || documents_take_flash_kernel(q, v)) && !cuda_stream_capturing()) {
    if (const std::optional<Documents> documents = documents_ ? documents_->of(attention_mask) : documents_of(attention_mask)) {
      return document_attention(q, k, v, *documents, softmax_scale_.value_or(1.0 / std::sqrt(double(q.size(3)))));
    }
  }
  const at::Tensor mask = document_ids ? dense_document_mask(attention_mask) : attention_mask;  // [b, 1, s, s] or undefined
  // SDPA wants [b, heads, s, d]; permuted views keep d contiguous, which the kernels need.
  at::Tensor out = tp_.random(dropout > 0.0, [&] {
    return at::scaled_dot_product_attention(
        q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}),
        mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt, dropout,
        /*is_causal=*/!mask.defined(), /*scale=*/softmax_scale_, /*enable_gqa=*/k.size(2) != heads);
  });                                                             // [b, H/tp, s, dv]
  return out.permute({2, 0, 1, 3}).reshape({s, b, heads * value_dim});  // [s, b, H*dv]
}

// The same kernel conditions as the context-parallel blocks' (one definition of what FA2 takes).
bool flash_attention_reads_cache(const at::Tensor& q, const at::Tensor& v) { return cp::fused_kernels_take(q, v); }

bool SdpaAttention::reads_cache_in_place(const at::Tensor& q, const LayerKvCache& cache) const {
  return cache.step->reads_in_place() && flash_attention_reads_cache(q, q);
}

at::Tensor SdpaAttention::forward_over_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const LayerKvCache& cache) const {
  if (!reads_cache_in_place(q, cache) || !flash_attention_reads_cache(q, v)) return {};
  cache.write(0, k);
  cache.write(1, v);
  return forward_over_written_cache(q, cache);
}

bool decode_attention_chosen(const DecodeKernels& kernels, int64_t batch, int64_t keys) {
  // Session 35, one H100, inside CUDA graphs told of the bound (docs/performance.md): at 16
  // sequences the one-launch kernel took 0.57x FA2's time at 128 keys and 0.65x at 512, and lost
  // from 1,024 keys (1.09x); at one sequence FA2 won at every length (1.08-1.17x). Session 39:
  // with the splits merged in a cluster, one sequence at a 256-key bound 0.94x FA2 and at 512
  // 0.90x (at 128 keys still 1.32x). Session 41, the 1.1B shape's batch-1 decode (134-token
  // prompt, 255 steps: bounds 256 and 512): 1.102 ms a step with the kernel at both bounds
  // against 1.118-1.119 with FA2 at 256, two rounds each in one call on an H100. Session 45
  // (one H100, both told of the bound, as every decode graph is since then): the kernel against
  // FA2 at 32 sequences 0.57x at 128 keys, 0.74x at 256, 1.09-1.14x at 400-512; at 64 sequences
  // 0.60x at 128 keys, 1.23x at 256 (session 39: 1.27x at 512). The bound halves as the
  // sequences double.
  constexpr int64_t kMostSequences = 64, kFewestKeysForOne = 129;
  if (kernels.attention) return true;
  if (!kernels.attention_where_faster || batch > kMostSequences) return false;
  const int64_t most_keys = batch <= 16 ? 512 : batch <= 32 ? 256 : 128;
  return keys <= most_keys && (batch > 1 || keys >= kFewestKeysForOne);
}

at::Tensor SdpaAttention::forward_over_written_cache(const at::Tensor& q, const LayerKvCache& cache) const {
  const int64_t s = q.size(0), b = q.size(1), heads = q.size(2), d = q.size(3);
  const at::Tensor k_store = cache.stored(0).flatten(0, 1);  // [slots * capacity, G/tp, d]
  const at::Tensor v_store = cache.stored(1).flatten(0, 1);
  KvCacheStep& step = *cache.step;
  if (s == 1 && decode_attention_chosen(step.decode_kernels(), b, step.longest()) && q.is_contiguous()) {
    // A decode step: one launch that overlaps the kernel before, rather than FA2's two.
    const at::Tensor tokens = q.view({b, heads, d});  // [b, H/tp, d]
    if (kernels::decode_attention_takes(tokens, k_store, v_store)) {
      step.decode_kernels_run().attention = true;
      const at::Tensor& tickets = step.attention_tickets(kernels::decode_attention_tickets(b, k_store.size(1)));
      const double scale = softmax_scale_.value_or(1.0 / std::sqrt(double(d)));
      const at::Tensor out = kernels::decode_attention(tokens, k_store, v_store, step.key_starts(), step.key_counts(), step.longest(), scale,
                                                       tickets);  // [b, H/tp, d]
      return out.view({1, b, heads * d});
    }
  }
  const at::Tensor rows = q.transpose(0, 1).reshape({b * s, heads, d});  // [b s, H/tp, d], sequence-major
  // Causal alignment is bottom-right (the last query sees every key of its sequence): new token i
  // of a sequence holding n rows after the step sees rows 0 ..= n - s + i, as the mask would say.
  const at::Tensor out = std::get<0>(at::_flash_attention_forward(
      rows, k_store, v_store, step.query_starts(), step.key_starts(), s, step.longest(), /*dropout_p=*/0.0,
      /*is_causal=*/true, /*return_debug_mask=*/false, softmax_scale_, std::nullopt, std::nullopt, step.key_counts()));  // [b s, H/tp, d]
  return out.view({b, s, heads * d}).transpose(0, 1).reshape({s, b, heads * d});                                           // [s, b, H/tp * d]
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
