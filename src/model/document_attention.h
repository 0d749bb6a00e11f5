// Attention over packed documents (--reset-attention-mask, packed SFT data): causal within each
// document of each sample, nothing across. The batch carries it in the attention mask's compact
// form, each token's document ([b, s] int32, as HF's 2-D masks say per token what the 4-D ones
// spell out), not as the dense [b, 1, s, s] mask (S² bytes a sample: 1 GiB at 32k, 16 GiB at
// 128k). A masked kernel would compute every query against every key and throw most away, and
// on the GPU SDPA takes only its memory-efficient kernel under a mask. Here attention runs
// document by document: FlashAttention-2's variable-length kernel on CUDA (one call for all
// documents, forward and backward), the causal SDPA of each document elsewhere. The work is then
// that of the documents alone. A dense mask that is exactly this one is read as documents too.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace megatron {

struct Documents {
  std::vector<int32_t> starts;  // cumulative document boundaries over the b * s tokens, sample-major: [docs + 1]
  int64_t longest = 0;          // the longest document's tokens
  at::Tensor device_starts;     // `starts` as int32 on the mask's GPU (the kernel's cu_seqlens); undefined on the CPU
};

// Whether `mask` is the compact form: [b, s] integers, each token's document within its sample
// (a document is a run of equal ids; causal attention within it).
bool is_document_ids(const at::Tensor& mask);

// The dense form of document ids: [b, s] -> [b, 1, s, s] bool, true = may attend (for kernels that
// take only a mask: attention dropout, fp32 on a GPU, a CUDA graph being captured).
at::Tensor dense_document_mask(const at::Tensor& document_ids);

// The documents of `mask`: of document ids always; of a dense [b, 1, s, s] bool mask (true = may
// attend) when it is exactly causal attention within runs of tokens, nullopt for any other mask,
// which then goes to SDPA as it is. On a GPU this reads the document boundaries to the host: one
// synchronisation. A dense mask is checked a band of query rows at a time, each band's
// temporaries about `band_elements` bytes (tests make it small to check several bands).
std::optional<Documents> documents_of(const at::Tensor& mask, int64_t band_elements = int64_t(1) << 28);

// The documents of the mask that one model's layers share (a micro-batch's): read off it once,
// not once a layer (on a GPU each read waits for the device). Keeps the mask it read alive, so a
// new mask cannot come at its address and be taken for it; a mask written in place since is read
// again.
class DocumentsMemo {
 public:
  std::optional<Documents> of(const at::Tensor& mask);

 private:
  std::mutex mutex_;  // the backward's recomputation may read it from autograd's device thread
  at::Tensor mask_;
  uint32_t version_ = 0;
  std::optional<Documents> documents_;
};

// Whether document_attention takes these on the GPU kernel (CUDA, compute capability 8.0+, bf16
// or fp16, q and k head dims a multiple of 8 up to 256, the value head dim at most theirs: a
// narrower one, multi-latent attention's, is padded); the per-document SDPA otherwise.
bool documents_take_flash_kernel(const at::Tensor& q, const at::Tensor& v);

// q [s, b, H, d], k [s, b, G, d], v [s, b, G, dv] (G key/value heads shared by H / G query heads
// each) -> [s, b, H * dv]: causal attention within each document. Differentiable in q, k and v.
at::Tensor document_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Documents& documents,
                              double scale);

}  // namespace megatron
