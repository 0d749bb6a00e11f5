#include "model/document_attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "context_parallel/document_blocks.h"

namespace megatron {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [s, b, n, d] -> [b s, n, d] contiguous: the tokens sample by sample, as the document boundaries
// count them (a view of k or v in the fused QKV output is strided even where reshape needs no copy).
at::Tensor packed(const at::Tensor& x) {
  return x.transpose(0, 1).reshape({x.size(0) * x.size(1), x.size(2), x.size(3)}).contiguous();
}

// FlashAttention-2's variable-length kernel over every document at once: each document one
// sequence of its own, causal. `starts` [docs + 1] int32 on the device.
struct FlashDocuments : torch::autograd::Function<FlashDocuments> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& starts, int64_t longest, double scale) {
    auto [out, lse, rng_state, unused, debug] = at::_flash_attention_forward(q, k, v, starts, starts, longest, longest, /*dropout_p=*/0.0,
                                                                             /*is_causal=*/true, /*return_debug_mask=*/false, scale);
    ctx->save_for_backward({q, k, v, out, lse, starts, rng_state, unused});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    return out;  // [b s, H, d]
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    auto [dq, dk, dv] = at::_flash_attention_backward(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5], s[5], longest, longest,
                                                      /*dropout_p=*/0.0, /*is_causal=*/true, s[6], s[7],
                                                      ctx->saved_data["scale"].toDouble());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool is_document_ids(const at::Tensor& mask) {
  return mask.defined() && mask.dim() == 2 && (mask.scalar_type() == at::kInt || mask.scalar_type() == at::kLong);
}

at::Tensor dense_document_mask(const at::Tensor& document_ids) {
  const int64_t b = document_ids.size(0), s = document_ids.size(1);
  const at::Tensor position = at::arange(s, document_ids.options().dtype(at::kLong));
  const at::Tensor causal = position.view({1, s}) <= position.view({s, 1});  // [s, s]: key <= query
  return document_ids.unsqueeze(2).eq(document_ids.unsqueeze(1)).logical_and_(causal).view({b, 1, s, s});
}

namespace {

// The documents from where each sample's tokens start one ([b, s] bool, the first token always):
// one copy to the host, with `valid` (whether the form checked out) beside them.
std::optional<Documents> documents_from_starts(const at::Tensor& starts, const at::Tensor& valid) {
  const int64_t b = starts.size(0), s = starts.size(1);
  const at::Tensor host = at::cat({starts.reshape({-1}), valid.view({1})}).to(at::kCPU).contiguous();
  const bool* flags = host.data_ptr<bool>();
  if (!flags[b * s]) return std::nullopt;
  Documents d;
  for (int64_t i = 0; i < b * s; ++i) {
    if (flags[i]) d.starts.push_back(static_cast<int32_t>(i));  // every sample's first token starts one
  }
  d.starts.push_back(static_cast<int32_t>(b * s));
  for (size_t i = 0; i + 1 < d.starts.size(); ++i) d.longest = std::max<int64_t>(d.longest, d.starts[i + 1] - d.starts[i]);
  // Once per mask (the memo keeps it), not once a layer.
  if (starts.is_cuda()) d.device_starts = at::tensor(d.starts, at::kInt).to(starts.device(), /*non_blocking=*/true);
  return d;
}

}  // namespace

std::optional<Documents> documents_of(const at::Tensor& mask, int64_t band_elements) {
  if (is_document_ids(mask)) {
    const int64_t b = mask.size(0), s = mask.size(1);
    if (b == 0 || s == 0) return std::nullopt;
    at::Tensor starts = at::ones({b, s}, mask.options().dtype(at::kBool));  // [b, s]
    if (s > 1) starts.narrow(1, 1, s - 1).copy_(mask.narrow(1, 1, s - 1).ne(mask.narrow(1, 0, s - 1)));
    return documents_from_starts(starts, at::ones({1}, starts.options()));
  }
  if (!mask.defined() || mask.dim() != 4 || mask.size(1) != 1 || mask.size(2) != mask.size(3) || mask.scalar_type() != at::kBool) {
    return std::nullopt;
  }
  const int64_t b = mask.size(0), s = mask.size(2);
  if (b == 0 || s == 0) return std::nullopt;
  const at::Tensor m = mask.select(1, 0);  // [b, s, s]
  // A document starts at the first token and at every token that may not see the one before it.
  at::Tensor starts = at::ones({b, s}, mask.options());  // [b, s] bool
  if (s > 1) starts.narrow(1, 1, s - 1).copy_(m.diagonal(/*offset=*/-1, /*dim1=*/1, /*dim2=*/2).logical_not());
  const at::Tensor document = starts.to(at::kInt).cumsum(1);  // [b, s]: each token's document
  const at::Tensor position = at::arange(s, mask.options().dtype(at::kLong));
  // Whether the mask is exactly causal attention within those documents, a band of query rows at
  // a time: the comparison's temporaries stay a few hundred MiB at any length (a 64k mask is 4 GiB
  // a sample; whole-mask temporaries would be three times that).
  const int64_t band = std::max<int64_t>(1, band_elements / (b * s));
  at::Tensor exact = at::ones({1}, mask.options());
  for (int64_t first = 0; first < s; first += band) {
    const int64_t rows = std::min(band, s - first);
    const at::Tensor causal = position.view({1, 1, s}) <= position.narrow(0, first, rows).view({1, rows, 1});  // [1, rows, s]
    const at::Tensor expected = document.narrow(1, first, rows).unsqueeze(2).eq(document.unsqueeze(1)).logical_and_(causal);
    exact.logical_and_(expected.eq(m.narrow(1, first, rows)).all().view({1}));
  }
  return documents_from_starts(starts, exact);
}

std::optional<Documents> DocumentsMemo::of(const at::Tensor& mask) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!mask_.defined() || !mask_.is_same(mask) || version_ != mask._version()) {
    documents_ = documents_of(mask);
    mask_ = mask;
    version_ = mask._version();  // the same tensor written in place since counts up
  }
  return documents_;
}

bool documents_take_flash_kernel(const at::Tensor& q, const at::Tensor& v) { return cp::documents_take_fused_kernel(q, v); }

at::Tensor document_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Documents& documents,
                              double scale) {
  const int64_t s = q.size(0), b = q.size(1), heads = q.size(2), value_dim = v.size(3);
  TORCH_CHECK(!documents.starts.empty() && documents.starts.back() == s * b, "document_attention: documents of ",
              documents.starts.empty() ? 0 : documents.starts.back(), " tokens for ", s, " x ", b);
  const at::Tensor qp = packed(q), kp = packed(k), vp = packed(v);  // [b s, H, d], [b s, G, d], [b s, G, dv]
  at::Tensor out;                                                    // [b s, H, dv]
  if (documents_take_flash_kernel(q, v)) {
    const at::Tensor starts = documents.device_starts.defined() ? documents.device_starts
                                                                : at::tensor(documents.starts, at::kInt).to(q.device(), /*non_blocking=*/true);
    // The kernel takes one head dim for q, k and v: a narrower value head (multi-latent
    // attention's) is padded with zeros, whose output columns are zero and dropped.
    const int64_t d = q.size(3);
    const at::Tensor values = value_dim < d ? at::constant_pad_nd(vp, {0, d - value_dim}) : vp;  // [b s, G, d]
    out = FlashDocuments::apply(qp, kp, values, starts, documents.longest, scale);
    if (value_dim < d) out = out.narrow(2, 0, value_dim).contiguous();
  } else {
    // Each document's causal SDPA ([1, heads, tokens, d]), their outputs one after another.
    std::vector<at::Tensor> parts;
    const bool gqa = k.size(2) != heads;
    for (size_t i = 0; i + 1 < documents.starts.size(); ++i) {
      const int64_t first = documents.starts[i], tokens = documents.starts[i + 1] - first;
      auto rows = [&](const at::Tensor& x) { return x.narrow(0, first, tokens).transpose(0, 1).unsqueeze(0); };
      parts.push_back(at::scaled_dot_product_attention(rows(qp), rows(kp), rows(vp), std::nullopt, 0.0, /*is_causal=*/true, scale, gqa)
                          .squeeze(0)
                          .transpose(0, 1));  // [tokens, H, dv]
    }
    out = at::cat(parts, 0);
  }
  return out.view({b, s, heads * value_dim}).transpose(0, 1).contiguous();  // [s, b, H * dv]
}

}  // namespace megatron
