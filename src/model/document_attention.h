// Attention over packed documents (--reset-attention-mask, packed SFT data): causal within each
// document of each sample, nothing across. The batch carries it as a [b, 1, s, s] mask; a masked
// kernel computes every query against every key and throws most away when documents are short,
// and on the GPU SDPA can only take the memory-efficient kernel under a mask. Here the documents
// are read off the mask once and attention runs document by document: FlashAttention-2's
// variable-length kernel on CUDA (one call for all documents, forward and backward), the causal
// SDPA of each document elsewhere. The work is then that of the documents alone.
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

// The documents of `mask` ([b, 1, s, s] bool, true = may attend) when it is exactly causal
// attention within runs of tokens (as make_batch builds it for packed documents); nullopt for any
// other mask, which then goes to SDPA as it is. On a GPU this reads the document boundaries to
// the host: one synchronisation. The check runs a band of query rows at a time, each band's
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
