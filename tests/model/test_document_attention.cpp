// Attention over packed documents (model/document_attention.h): the documents read off the mask
// make_batch builds, and attention computed document by document equal to SDPA under that mask,
// forward and backward, with grouped key/value heads and a value head dim of its own; any other
// mask is left to SDPA. On a GPU (skipped without one) FlashAttention-2's variable-length kernel
// against masked SDPA in bf16.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <vector>

#include "core/cuda_device.h"
#include "model/core_attention.h"
#include "model/document_attention.h"

namespace megatron {
namespace {

// [b, 1, s, s]: causal within the documents starting at `starts` of each sample (as make_batch).
at::Tensor document_mask(const std::vector<std::vector<int64_t>>& starts, int64_t s) {
  at::Tensor mask = at::zeros({int64_t(starts.size()), 1, s, s}, at::kBool);
  for (size_t i = 0; i < starts.size(); ++i) {
    std::vector<int64_t> ends(starts[i].begin() + 1, starts[i].end());
    ends.push_back(s);
    for (size_t d = 0; d < ends.size(); ++d) {
      for (int64_t q = starts[i][d]; q < ends[d]; ++q) mask[int64_t(i)][0][q].narrow(0, starts[i][d], q - starts[i][d] + 1).fill_(true);
    }
  }
  return mask;
}

// SDPA under the mask, laid out as the core attention takes and gives ([s, b, heads, d] in, [s, b, H*dv] out).
at::Tensor masked_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, double scale) {
  const at::Tensor out = at::scaled_dot_product_attention(q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}), mask,
                                                          0.0, false, scale, /*enable_gqa=*/true);  // [b, H, s, dv]
  return out.permute({2, 0, 1, 3}).reshape({q.size(0), q.size(1), -1});
}

TEST(DocumentAttention, DocumentsAreReadOffTheMaskItDescribes) {
  const at::Tensor mask = document_mask({{0, 3, 4}, {0}, {0, 1, 2, 7}}, 8);
  const std::optional<Documents> d = documents_of(mask);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->starts, (std::vector<int32_t>{0, 3, 4, 8, 16, 17, 18, 23, 24}));
  EXPECT_EQ(d->longest, 8);
  // Not attention within documents: a plain causal mask with one extra key, or one hole.
  at::Tensor extra = mask.clone();
  extra[0][0][5][1] = true;
  EXPECT_FALSE(documents_of(extra).has_value());
  at::Tensor hole = mask.clone();
  hole[2][0][6][4] = false;
  EXPECT_FALSE(documents_of(hole).has_value());
  // Checked a band of rows at a time: the same answers with bands of 3 x 8 and 1 x 8 elements.
  for (int64_t band_elements : {3 * 3 * 8, 3 * 8}) {
    EXPECT_EQ(documents_of(mask, band_elements)->starts, d->starts) << band_elements;
    EXPECT_FALSE(documents_of(extra, band_elements).has_value()) << band_elements;
    EXPECT_FALSE(documents_of(hole, band_elements).has_value()) << band_elements;
  }
  EXPECT_FALSE(documents_of(mask.narrow(3, 0, 7)).has_value());  // not square: a cache's mask
  EXPECT_FALSE(documents_of(at::Tensor()).has_value());
}

// The mask's compact form, each token's document: the same documents as the dense mask it stands
// for, that mask when spelt out, and the same attention.
TEST(DocumentAttention, DocumentIdsAreTheMasksCompactForm) {
  const at::Tensor dense = document_mask({{0, 3, 4}, {0}, {0, 1, 2, 7}}, 8);
  const at::Tensor ids = at::tensor({0, 0, 0, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 5, 0, 1, 2, 2, 2, 2, 2, 3}, at::kInt).view({3, 8});
  ASSERT_TRUE(is_document_ids(ids));
  EXPECT_FALSE(is_document_ids(dense));
  EXPECT_TRUE(at::equal(dense_document_mask(ids), dense));
  const std::optional<Documents> from_ids = documents_of(ids);
  ASSERT_TRUE(from_ids.has_value());
  EXPECT_EQ(from_ids->starts, documents_of(dense)->starts);
  EXPECT_EQ(from_ids->longest, 8);
  at::manual_seed(4);
  const at::Tensor q = at::randn({8, 3, 4, 8}), k = at::randn({8, 3, 2, 8}), v = at::randn({8, 3, 2, 8});
  tp::TensorParallel alone;
  EXPECT_TRUE(at::allclose(SdpaAttention(alone).forward(q, k, v, ids, 0.0), masked_sdpa(q, k, v, dense, 1.0 / std::sqrt(8.0)), 1e-5, 1e-6));
}

// The model's layers share one reading of a micro-batch's mask; a mask written in place, or
// another mask, is read again.
TEST(DocumentAttention, TheMemoReadsEachMaskOnce) {
  DocumentsMemo memo;
  at::Tensor mask = document_mask({{0, 2}}, 6);
  EXPECT_EQ(memo.of(mask)->starts, (std::vector<int32_t>{0, 2, 6}));
  EXPECT_EQ(memo.of(mask)->starts, (std::vector<int32_t>{0, 2, 6}));
  mask.copy_(document_mask({{0, 4}}, 6));  // in place: its version counts up
  EXPECT_EQ(memo.of(mask)->starts, (std::vector<int32_t>{0, 4, 6}));
  EXPECT_EQ(memo.of(document_mask({{0, 1, 3}}, 6))->starts, (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_FALSE(memo.of(at::ones({1, 1, 6, 6}, at::kBool)).has_value());  // not causal: no documents
}

TEST(DocumentAttention, EqualsSdpaUnderTheMaskForwardAndBackward) {
  at::manual_seed(4);
  const int64_t s = 12, b = 2, heads = 4, groups = 2, d = 8;
  const at::Tensor mask = document_mask({{0, 5, 6}, {0, 9}}, s);
  const Documents documents = *documents_of(mask);
  for (const int64_t value_dim : {d, int64_t(6)}) {  // 6: multi-latent attention's own value head dim
    const at::Tensor q = at::randn({s, b, heads, d}, at::kDouble).requires_grad_(), k = at::randn({s, b, groups, d}, at::kDouble).requires_grad_(),
                     v = at::randn({s, b, groups, value_dim}, at::kDouble).requires_grad_();
    const double scale = 0.3;
    const at::Tensor got = document_attention(q, k, v, documents, scale);
    const at::Tensor want = masked_sdpa(q, k, v, mask, scale);
    ASSERT_EQ(got.sizes(), want.sizes());
    EXPECT_TRUE(at::allclose(got, want, 1e-10, 1e-12)) << "value dim " << value_dim;
    const at::Tensor upstream = at::randn_like(want);
    const auto g = torch::autograd::grad({got}, {q, k, v}, {upstream});
    const auto w = torch::autograd::grad({want}, {q, k, v}, {upstream});
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(g[i], w[i], 1e-10, 1e-12)) << "gradient " << i << ", value dim " << value_dim;
  }
}

// The GPU kernel against masked SDPA: bf16, documents of uneven lengths, grouped heads, k and v
// strided views of one fused QKV output (as the attention block hands them over), one sample
// and two; then multi-latent attention's head dims (values narrower than queries and keys).
TEST(DocumentAttentionCuda, FlashVariableLengthEqualsMaskedSdpa) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(6);
  const int64_t s = 512, heads = 8, groups = 2, d = 64, per_group = heads / groups;
  const std::vector<std::vector<int64_t>> layouts[] = {{{0, 100, 101, 300}, {0, 7, 256}}, {{0, 3, 400}}};
  for (const auto& starts : layouts) {
    const int64_t b = int64_t(starts.size());
    SCOPED_TRACE(std::to_string(b) + " samples");
    const at::Tensor mask = document_mask(starts, s).to(at::kCUDA);
    const std::optional<Documents> documents = documents_of(mask);
    ASSERT_TRUE(documents.has_value());
    const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
    const at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * d}, bf16).requires_grad_();
    auto parts = qkv.split_with_sizes({per_group * d, d, d}, -1);
    const at::Tensor q = parts[0].reshape({s, b, heads, d}), k = parts[1], v = parts[2];  // k, v: strided views
    ASSERT_TRUE(documents_take_flash_kernel(q, v));
    const double scale = 0.125;
    const at::Tensor got = document_attention(q, k, v, *documents, scale);
    const at::Tensor want = masked_sdpa(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), mask, scale);
    auto relative = [](const at::Tensor& a, const at::Tensor& w) { return (a.to(at::kFloat) - w).norm().item<double>() / w.norm().item<double>(); };
    EXPECT_LT(relative(got, want), 1e-2) << b << " samples";
    const at::Tensor upstream = at::randn_like(want);
    const at::Tensor g = torch::autograd::grad({got}, {qkv}, {upstream.to(at::kBFloat16)})[0];
    const at::Tensor w = torch::autograd::grad({want}, {qkv}, {upstream})[0];
    EXPECT_LT(relative(g, w.to(at::kFloat)), 2e-2) << b << " samples";
  }
  // Multi-latent attention's heads: q and k 192 wide (128 + 64 rope), values 128 (padded for the kernel).
  const int64_t b = 2, qk = 192, dv = 128;
  const at::Tensor mask = document_mask(layouts[0], s).to(at::kCUDA);
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({s, b, heads, qk}, bf16).requires_grad_(), k = at::randn({s, b, heads, qk}, bf16).requires_grad_(),
                   v = at::randn({s, b, heads, dv}, bf16).requires_grad_();
  ASSERT_TRUE(documents_take_flash_kernel(q, v));
  const at::Tensor got = document_attention(q, k, v, *documents_of(mask), 0.07);
  const at::Tensor want = masked_sdpa(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), mask, 0.07);
  ASSERT_EQ(got.sizes(), want.sizes());
  auto relative = [](const at::Tensor& a, const at::Tensor& w) { return (a.to(at::kFloat) - w).norm().item<double>() / w.norm().item<double>(); };
  EXPECT_LT(relative(got, want), 1e-2) << "MLA head dims";
  const at::Tensor upstream = at::randn_like(want);
  const auto g = torch::autograd::grad({got}, {q, k, v}, {upstream.to(at::kBFloat16)});
  const auto w = torch::autograd::grad({want}, {q, k, v}, {upstream});
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(relative(g[i], w[i].to(at::kFloat)), 2e-2) << "MLA head dims, gradient " << i;
}

}  // namespace
}  // namespace megatron
