// The RMSNorms of a batch-1 decode step inside its GEMVs (run by scripts/gpu/run.sh; without a
// CUDA device these tests report a skip, never a pass): the norm computed by the GEMV after it
// (kernels::gemv_after_norm), and the norm prepared by the GEMV before it (kernels::gemv_into_norm:
// the residual add, the scaled row and the blocks' sums of squares in its epilogue) and finished
// by the GEMV after it (kernels::gemv_after_prepared_norm, and the QKV GEMV with RoPE into the
// cache), each against kernels::add_rms_norm and then the plain GEMV.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention_ops.h"
#include "kernels/gemv_ops.h"
#include "kernels/ops.h"

namespace megatron {
namespace {

double max_gap(const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>(); }

// The norm in the GEMV (kernels::gemv_after_norm: its 1 / rms scaling the dot products) against
// add_rms_norm and then the GEMV: the same residual sum to the bit, the output within the rounding
// of a norm whose sum of squares is added in another order and whose output the GEMV takes
// unrounded; with and without a delta (the first layer's input norm), a
// bias, gated (fc1 with SwiGLU), k of 64 (fewer packs than threads), 2048, 5632 and 8192, bf16 and
// fp16; and what it refuses.
TEST(GenerationCudaKernels, GemvAfterNormEqualsTheNormThenTheGemv) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(7);
  const at::NoGradGuard no_grad;
  const double eps = 1e-6;
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    for (int64_t k : {64, 2048, 5632, 8192}) {
      const at::Tensor base = at::randn({1, 1, k}, o) * 3.0, delta = at::randn({1, 1, k}, o);
      const at::Tensor gamma = at::rand({k}, o) + 0.5;
      for (bool gated : {false, true}) {
        for (bool with_delta : {false, true}) {
          const int64_t n = gated ? 2 * 1030 : 2050;
          const at::Tensor weight = at::randn({n, k}, o) * (1.0 / std::sqrt(double(k)));
          const at::Tensor bias = gated ? at::Tensor() : at::randn({n}, o);
          const at::Tensor d = with_delta ? delta : at::Tensor();
          ASSERT_TRUE(kernels::gemv_after_norm_takes(base, d, gamma, weight, bias, gated));
          const kernels::NormedLinear got = kernels::gemv_after_norm(base, d, gamma, eps, weight, bias, gated);
          const kernels::AddRmsNorm norm =
              with_delta ? kernels::add_rms_norm(base, delta, gamma, eps) : kernels::AddRmsNorm{base, kernels::rms_norm(base, gamma, eps)};
          const at::Tensor want = gated ? kernels::linear_swiglu(norm.normed, weight) : kernels::gemv(norm.normed, weight, bias);
          const std::string what = std::string(c10::toString(dtype)) + " k " + std::to_string(k) + (gated ? " gated" : "") +
                                   (with_delta ? " with delta" : "");
          EXPECT_TRUE(at::equal(got.sum, norm.sum)) << what;
          ASSERT_EQ(got.y.sizes(), want.sizes()) << what;
          const double scale = want.to(at::kFloat).abs().max().item<double>();
          // Gated, the gate and up sums are each rounded before SwiGLU and its product rounded
          // again: the unrounded normed input moves the output by up to two of its rounding steps
          // (measured: 0.0625 at a scale of 6, bf16, k 2048).
          EXPECT_LT((got.y.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>(), (gated ? 2e-2 : 1e-2) * scale) << what;
          if (!gated) {  // the check can tell: the norm without its scale lands far outside it
            const at::Tensor unscaled = kernels::gemv(kernels::rms_norm(norm.sum, at::ones_like(gamma), eps), weight, bias);
            EXPECT_GT((unscaled.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>(), 5e-2 * scale) << what;
          }
        }
      }
    }
    const at::Tensor weight = at::randn({64, 256}, o), gamma = at::ones({256}, o);
    EXPECT_FALSE(kernels::gemv_after_norm_takes(at::randn({2, 1, 256}, o), {}, gamma, weight, {}, false));  // two rows
    EXPECT_FALSE(kernels::gemv_after_norm_takes(at::randn({1, 256}, o), at::randn({1, 264}, o).narrow(1, 4, 256), gamma, weight, {},
                                                false));  // a delta off the 16-byte grid
    EXPECT_FALSE(kernels::gemv_after_norm_takes(at::randn({1, 256}, o), {}, gamma.to(at::kFloat), weight, {}, false));  // fp32 gamma
    EXPECT_FALSE(kernels::gemv_after_norm_takes(at::randn({1, 256}, o), {}, gamma, weight, at::ones({64}, o), true));   // gated with bias
  }
}

// The norm prepared in the epilogue of the GEMV before it (the attention's output projection or
// fc2: kernels::gemv_into_norm) and finished by the GEMV after it: the residual sum to the bit
// (add_rms_norm's), the scaled row to the bit (the sum times gamma, rounded), the blocks' squares
// summing to the sum's, and the output within the rounding of gemv_after_norm's test (the scaled
// row is rounded where add_rms_norm's normed row is); k of 64 (fewer packs than threads), 2048 and
// 4096; producing GEMVs of 256 and 5632 inputs; gated (fc1 with SwiGLU) and with a bias; bf16 and
// fp16; and what it refuses.
TEST(GenerationCudaKernels, GemvIntoNormThenThePreparedNormEqualsTheAddNormThenTheGemv) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(11);
  const at::NoGradGuard no_grad;
  const double eps = 1e-6;
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    for (int64_t k : {64, 2048, 4096}) {
      for (int64_t m : {256, 5632}) {
        const at::Tensor x = at::randn({1, 1, m}, o), residual = at::randn({1, 1, k}, o) * 3.0;
        const at::Tensor producer = at::randn({k, m}, o) * (1.0 / std::sqrt(double(m)));
        const at::Tensor gamma = at::rand({k}, o) + 0.5;
        ASSERT_TRUE(kernels::gemv_into_norm_takes(x, producer, residual, gamma));
        const kernels::PreparedNorm prepared = kernels::gemv_into_norm(x, producer, residual, gamma, eps);
        const kernels::AddRmsNorm norm = kernels::add_rms_norm(residual, kernels::gemv(x, producer, {}), gamma, eps);
        const std::string what = std::string(c10::toString(dtype)) + " k " + std::to_string(k) + " m " + std::to_string(m);
        EXPECT_TRUE(at::equal(prepared.sum, norm.sum)) << what;
        EXPECT_TRUE(at::equal(prepared.scaled, (norm.sum.to(at::kFloat) * gamma.to(at::kFloat)).to(dtype))) << what;
        ASSERT_EQ(prepared.squares.numel(), k / 4) << what;
        const double squares = norm.sum.to(at::kFloat).pow(2).sum().item<double>();
        EXPECT_NEAR(prepared.squares.sum().item<double>(), squares, 1e-5 * squares) << what;
        for (bool gated : {false, true}) {
          const int64_t n = gated ? 2 * 1030 : 2050;
          const at::Tensor weight = at::randn({n, k}, o) * (1.0 / std::sqrt(double(k)));
          const at::Tensor bias = gated ? at::Tensor() : at::randn({n}, o);
          ASSERT_TRUE(kernels::gemv_after_prepared_norm_takes(prepared, weight, bias, gated)) << what;
          const at::Tensor got = kernels::gemv_after_prepared_norm(prepared, weight, bias, gated);
          const at::Tensor want = gated ? kernels::linear_swiglu(norm.normed, weight) : kernels::gemv(norm.normed, weight, bias);
          ASSERT_EQ(got.sizes(), want.sizes()) << what;
          const double scale = want.to(at::kFloat).abs().max().item<double>();
          EXPECT_LT(max_gap(got, want), (gated ? 2e-2 : 1e-2) * scale) << what << (gated ? " gated" : "");
          if (!gated) {  // the check can tell: the scaled row without the norm's 1 / rms lands far outside it
            EXPECT_GT(max_gap(kernels::gemv(prepared.scaled, weight, bias), want), 5e-2 * scale) << what;
          }
        }
      }
    }
    const at::Tensor x = at::randn({1, 1, 256}, o), gamma = at::ones({64}, o), residual = at::randn({1, 1, 64}, o);
    const at::Tensor producer = at::randn({64, 256}, o);
    EXPECT_FALSE(kernels::gemv_into_norm_takes(x, producer.narrow(0, 0, 62), residual.narrow(2, 0, 62), gamma.narrow(0, 0, 62)));  // n % 4
    EXPECT_FALSE(kernels::gemv_into_norm_takes(x, producer, at::randn({1, 1, 60}, o), gamma));          // residual of another width
    EXPECT_FALSE(kernels::gemv_into_norm_takes(x, producer, residual, gamma.to(at::kFloat)));           // fp32 gamma
    EXPECT_FALSE(kernels::gemv_into_norm_takes(at::randn({2, 1, 256}, o), producer, residual, gamma));  // two rows
    kernels::PreparedNorm p = kernels::gemv_into_norm(x, producer, residual, gamma, eps);
    EXPECT_TRUE(kernels::gemv_after_prepared_norm_takes(p, at::randn({8, 64}, o), {}, false));
    p.squares = p.squares.to(at::kDouble);
    EXPECT_FALSE(kernels::gemv_after_prepared_norm_takes(p, at::randn({8, 64}, o), {}, false));  // squares not fp32
  }
}

// The QKV GEMV with RoPE into the cache finishing a prepared norm (its PreparedNorm overload)
// against gemv_after_prepared_norm and then rope_qkv_into_cache: the queries and the key row within
// a rounding step, the value row to the bit.
TEST(GenerationCudaKernels, GemvWithRopeIntoCacheFinishesAPreparedNorm) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(12);
  const at::NoGradGuard no_grad;
  const int64_t k = 512, rows = 12, groups = 2, per_group = 3;
  const at::Device gpu(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(dtype);
    for (int64_t d : {64, 128}) {
      const std::string what = std::string(c10::toString(dtype)) + " d " + std::to_string(d);
      const int64_t n = groups * (per_group + 2) * d;
      const kernels::PreparedNorm prepared = kernels::gemv_into_norm(at::randn({1, 1, 1024}, o), at::randn({k, 1024}, o) * (1.0 / 32.0),
                                                                     at::randn({1, 1, k}, o), at::rand({k}, o) + 0.5, 1e-6);
      const at::Tensor weight = at::randn({n, k}, o) * (1.0 / std::sqrt(double(k)));
      const at::Tensor angles = at::rand({1, 1, 1, d}, o.dtype(at::kFloat)) * 6.0;
      kernels::QkvIntoCache into;
      into.heads_per_group = per_group;
      into.cos = angles.cos(), into.sin = angles.sin();
      into.store_rows = at::tensor(std::vector<int64_t>{5}, at::kLong).to(gpu);
      into.k_store = at::zeros({rows, groups, d}, o), into.v_store = at::zeros({rows, groups, d}, o);
      ASSERT_TRUE(kernels::gemv_rope_into_cache_takes(prepared, weight, {}, into)) << what;
      const at::Tensor q = kernels::gemv_rope_into_cache(prepared, weight, {}, into);  // [1, 1, G P, d]
      const at::Tensor qkv = kernels::gemv_after_prepared_norm(prepared, weight, {}, false);
      const at::Tensor k_store = at::zeros({rows, groups, d}, o), v_store = at::zeros({rows, groups, d}, o);
      const at::Tensor want_q = kernels::qkv_rope_into_cache(qkv.view({1, 1, groups, (per_group + 2) * d}), per_group, into.cos, into.sin,
                                                             k_store, v_store, into.store_rows);
      auto gap = [](const at::Tensor& a, const at::Tensor& b) { return max_gap(a, b) / b.to(at::kFloat).abs().max().item<double>(); };
      EXPECT_LE(gap(q, want_q), 1.0 / 128) << what;
      EXPECT_LE(gap(into.k_store, k_store), 1.0 / 128) << what;
      EXPECT_TRUE(at::equal(into.v_store, v_store)) << what;
      EXPECT_GT(into.v_store[5].abs().sum().item<double>(), 0.0) << what << ": row 5 written";
    }
  }
}

}  // namespace
}  // namespace megatron
