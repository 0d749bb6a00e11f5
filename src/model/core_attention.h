// Core attention through at::scaled_dot_product_attention (cuDNN / flash backends on GPU, the
// flash CPU kernel on CPU): causal, or under an explicit mask; GQA without repeating K/V. In
// generation on the GPU, flash attention's variable-length kernel over the key/value cache as it
// lies (no gather, no mask).
#pragma once

#include <optional>

#include "model/layer_spec.h"

namespace megatron {

class SdpaAttention : public CoreAttention {
 public:
  // softmax_scale: the scores' factor; unset: 1 / sqrt(the query head dim). documents: the
  // model's memo of the packed documents of its masks (null: read at every call).
  explicit SdpaAttention(const tp::TensorParallel& tp, std::optional<double> softmax_scale = std::nullopt,
                         std::shared_ptr<DocumentsMemo> documents = nullptr)
      : tp_(tp), softmax_scale_(softmax_scale), documents_(std::move(documents)) {}
  // v may have another head dim than q and k (multi-latent attention): context [s, b, H/tp * dv].
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& attention_mask,
                     double dropout) const override;
  at::Tensor forward_over_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const LayerKvCache& cache) const override;
  bool reads_cache_in_place(const at::Tensor& q, const LayerKvCache& cache) const override;
  at::Tensor forward_over_written_cache(const at::Tensor& q, const LayerKvCache& cache) const override;

 private:
  tp::TensorParallel tp_;  // dropout inside the TP region draws from its generator
  std::optional<double> softmax_scale_;
  std::shared_ptr<DocumentsMemo> documents_;
};

// Whether flash attention's kernel can read a cache of these queries and values in place: CUDA
// on compute capability 8.0 or newer, fp16 or bf16, one head dim for q and v, a multiple of 8 up
// to 256.
bool flash_attention_reads_cache(const at::Tensor& q, const at::Tensor& v);

// Whether a decode step of `batch` sequences attending to up to `keys` keys runs the one-launch
// decode attention kernel (where it takes the step) rather than FA2: always when asked for
// (--attention-backend decode), where it measured faster under --attention-backend auto.
bool decode_attention_chosen(const DecodeKernels& kernels, int64_t batch, int64_t keys);

// core(q, k, v); with `recompute` (--recompute-granularity selective) its output and softmax
// statistics are not kept: the backward runs it again from q, k and v (saved anyway).
at::Tensor attend(const CoreAttention& core, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& attention_mask, double dropout, bool recompute, const tp::TensorParallel& tp);

}  // namespace megatron
