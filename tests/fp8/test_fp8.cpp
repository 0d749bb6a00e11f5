// FP8 casts, scaled GEMMs, the delayed recipe's bookkeeping and the FP8 linear layer, on the CPU
// (at::_scaled_mm runs FP8 GEMMs there with tensor-wise scales): every result is compared with a
// reference built from the dequantized FP8 values, which is what an FP8 GEMM computes up to its
// summation order.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "fp8/quantize.h"
#include "fp8/recipe.h"
#include "tensor_parallel/fp8_linear.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

double largest(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST(Fp8Cast, TensorwiseSaturatesRoundsAndCarriesTheInverseScale) {
  const at::Tensor x = at::tensor({0.0f, 1.0f, -2.5f, 1000.0f, -1e6f, 3.0f}).reshape({2, 3});
  const at::Tensor scale = at::full({}, 2.0f);
  const fp8::Cast c = fp8::cast_tensorwise(x, scale, at::kFloat8_e4m3fn, true, true);
  const at::Tensor v = c.rowwise.data.to(at::kFloat);
  // x * 2, saturated at e4m3's 448 (not inf: "fn" has no infinity), rounded to e4m3's grid.
  EXPECT_TRUE(at::equal(v, at::tensor({0.0f, 2.0f, -5.0f, 448.0f, -448.0f, 6.0f}).reshape({2, 3}))) << v;
  EXPECT_FLOAT_EQ(c.rowwise.scale_inv.item<float>(), 0.5f);
  EXPECT_TRUE(at::equal(c.transposed.data.to(at::kFloat), v.t())) << "the transposed copy holds the same values";
  EXPECT_EQ(fp8::max_finite(at::kFloat8_e5m2), 57344.0);
  // e5m2 keeps 2 mantissa bits: 2.5 * 2 = 5 is on its grid, 3 * 2 = 6 too, 1.1 * 2 = 2.2 rounds to 2.
  const fp8::Cast e5 = fp8::cast_tensorwise(at::tensor({1.1f, 3.0f}).reshape({1, 2}), scale, at::kFloat8_e5m2, true, false);
  EXPECT_TRUE(at::equal(e5.rowwise.data.to(at::kFloat), at::tensor({2.0f, 6.0f}).reshape({1, 2})));
}

TEST(Fp8Cast, ScalesFromAmaxKeepTheFallbackWhereTheAmaxIsUnusable) {
  const at::Tensor amax = at::tensor({4.0f, 0.0f, INFINITY, NAN});
  const at::Tensor previous = at::full({4}, 7.0f);
  const at::Tensor s = fp8::scale_from_amax(amax, 448.0, /*margin=*/1, previous);
  EXPECT_FLOAT_EQ(s[0].item<float>(), 448.0f / 2.0f / 4.0f);
  EXPECT_FLOAT_EQ(s[1].item<float>(), 7.0f);
  EXPECT_FLOAT_EQ(s[2].item<float>(), 7.0f);
  EXPECT_FLOAT_EQ(s[3].item<float>(), 7.0f);
  EXPECT_FLOAT_EQ(fp8::scale_from_amax(at::zeros({}), 448.0).item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(fp8::amax(at::tensor({-3.0f, 2.0f})).item<float>(), 3.0f);
}

TEST(Fp8Cast, BlockwiseTilesHavePowerOfTwoScalesAndUseTheRange) {
  at::manual_seed(0);
  // Rows of very different magnitudes: each 1 x 128 tile gets its own scale.
  const at::Tensor x = at::randn({4, 256}) * at::tensor({1e-3f, 1.0f, 30.0f, 1e4f}).unsqueeze(1);
  const fp8::Quantized q = fp8::cast_blockwise(x, at::kFloat8_e4m3fn, 1);
  ASSERT_EQ(q.scale_inv.sizes(), at::IntArrayRef({4, 2}));
  const at::Tensor exponent = at::log2(q.scale_inv);
  EXPECT_TRUE(at::equal(exponent, at::round(exponent))) << "powers of two: " << q.scale_inv;
  const at::Tensor tile_max = q.data.to(at::kFloat).abs().reshape({4, 2, 128}).amax(-1);
  EXPECT_TRUE((tile_max <= 448).all().item<bool>());
  EXPECT_TRUE((tile_max > 224).all().item<bool>()) << "the largest power of two that fits: " << tile_max;
  const at::Tensor back = fp8::dequantize(q);
  EXPECT_LE(largest((back - x) / x.abs().amax(1, true)), 1.0 / 16) << "e4m3's relative spacing, per tile";
  // 128 x 128 tiles: one scale per tile of a [256, 256] weight.
  const fp8::Quantized w = fp8::cast_blockwise(at::randn({256, 256}), at::kFloat8_e4m3fn, 128);
  EXPECT_EQ(w.scale_inv.sizes(), at::IntArrayRef({2, 2}));
  EXPECT_THROW(fp8::cast_blockwise(at::randn({4, 100}), at::kFloat8_e4m3fn, 1), c10::Error);
}

TEST(Fp8Gemm, ScaledMatmulsEqualTheMatmulOfTheDequantizedValues) {
  at::manual_seed(1);
  const at::Tensor a = at::randn({32, 256}), b = at::randn({48, 256});
  // Tensor-wise scales: at::_scaled_mm itself.
  const auto qa = fp8::cast_tensorwise(a, fp8::scale_from_amax(fp8::amax(a), 448.0), at::kFloat8_e4m3fn, true, false).rowwise;
  const auto qb = fp8::cast_tensorwise(b, fp8::scale_from_amax(fp8::amax(b), 57344.0), at::kFloat8_e5m2, true, false).rowwise;
  const at::Tensor reference = at::mm(fp8::dequantize(qa).to(at::kDouble), fp8::dequantize(qb).to(at::kDouble).t());
  const at::Tensor out = fp8::scaled_mm(qa, qb, at::kFloat);
  EXPECT_LE(largest(out.to(at::kDouble) - reference), 1e-4 * largest(reference));
  // ATen's own FP8 GEMM (a reference loop on the CPU) computes the same.
  const at::Tensor aten = at::_scaled_mm(qa.data, qb.data.t(), qa.scale_inv, qb.scale_inv, std::nullopt, std::nullopt, at::kFloat);
  EXPECT_LE(largest(aten - out), 1e-5 * largest(out));
  // ... and into a given output.
  const at::Tensor into = at::empty({32, 48});
  fp8::scaled_mm(qa, qb, at::kFloat, false, into);
  EXPECT_TRUE(at::equal(into, out));
  // Blockwise: 1 x 128 by 128 x 128 tiles.
  const fp8::Quantized ba = fp8::cast_blockwise(a, at::kFloat8_e4m3fn, 1);
  const fp8::Quantized bb = fp8::cast_blockwise(at::randn({128, 256}), at::kFloat8_e4m3fn, 128);
  const at::Tensor block_ref = at::mm(fp8::dequantize(ba).to(at::kDouble), fp8::dequantize(bb).to(at::kDouble).t());
  EXPECT_LE(largest(fp8::scaled_mm(ba, bb, at::kFloat).to(at::kDouble) - block_ref), 1e-4 * largest(block_ref));
  // The FP8 product is close to the exact one: e4m3 x e4m3 over K = 256.
  const at::Tensor exact = at::mm(a, b.t());
  EXPECT_LE(largest(out - exact), 0.1 * largest(exact));
}

// Transformer Engine's bookkeeping, step by step: a history of 3 rows, row 0 the current step's,
// the scale from the history's max, the history rolled after each update.
TEST(Fp8Delayed, ScalesFollowTheAmaxHistoryAsTransformerEngine) {
  fp8::DelayedScaling d(/*history_len=*/3, /*history_max=*/true, /*margin=*/0);
  const int col = d.add(448.0);
  const at::Device cpu(at::kCPU);
  EXPECT_FLOAT_EQ(d.scale(col, cpu).item<float>(), 1.0f) << "scales start at 1";
  // A cast with the column's scale pools max |x| into the column's current slot.
  auto cast = [](fp8::DelayedScaling& s, int c, float amax) {
    const at::Tensor x = at::tensor({-amax, amax / 4}).reshape({1, 2});
    const at::Tensor scale = s.scale(c, at::kCPU);  // first: the state is made at the first use
    fp8::cast_tensorwise(x, scale, at::kFloat8_e4m3fn, true, false, kernels::Impl::Auto, s.current_amax(c));
  };
  std::vector<float> scales;
  for (float amax : {2.0f, 8.0f, 1.0f, 0.5f, 0.25f}) {
    cast(d, col, amax);
    cast(d, col, amax / 2);  // a second micro-batch: pooled by max
    d.update([](at::Tensor&) {});
    scales.push_back(d.scale(col, cpu).item<float>());
  }
  // Window of the last 3 steps' amaxes (the current row cleared after each update): max(2)=2,
  // max(2,8)=8, max(2,8,1)=8, max(8,1,0.5)=8, max(1,0.5,0.25)=1.
  const std::vector<float> expected = {224.0f, 56.0f, 56.0f, 56.0f, 448.0f};
  EXPECT_EQ(scales, expected);

  fp8::DelayedScaling recent(3, /*history_max=*/false, /*margin=*/2);
  const int c = recent.add(57344.0);
  cast(recent, c, 4.0f);
  recent.update([](at::Tensor& t) { t.mul_(2); });  // the reduction's result is what counts: amax 8
  EXPECT_FLOAT_EQ(recent.scale(c, cpu).item<float>(), 57344.0f / 4.0f / 8.0f);
  recent.update([](at::Tensor&) {});  // no amax this step: the scale stays
  EXPECT_FLOAT_EQ(recent.scale(c, cpu).item<float>(), 57344.0f / 4.0f / 8.0f);
  // A checkpoint's column, back.
  auto [history, scale] = recent.column(c);
  fp8::DelayedScaling restored(3, false, 2);
  const int rc = restored.add(57344.0);
  restored.set_column(rc, history, scale, cpu);
  EXPECT_TRUE(at::equal(restored.column(rc).first, history));
  EXPECT_FLOAT_EQ(restored.scale(rc, cpu).item<float>(), scale.item<float>());
}

struct Recipe {
  const char* name;
  std::string recipe, format;
};

// The layer's forward and backward against GEMMs of the dequantized FP8 operands, for each recipe:
// y = X W^T, dx = dY W, dW = dY^T X with X, W, dY as the recipe casts them.
class Fp8LinearRecipes : public testing::TestWithParam<Recipe> {};

TEST_P(Fp8LinearRecipes, ForwardAndBackwardAreTheGemmsOfTheCastOperands) {
  ModelConfig c;
  c.fp8 = GetParam().format;
  c.fp8_recipe = GetParam().recipe;
  auto context = std::make_shared<fp8::Fp8Context>(fp8::options_for(c));
  tp::Fp8Linear layer(context, "test layer");
  at::manual_seed(2);
  const at::Tensor x = at::randn({2, 64, 128}).requires_grad_(true);  // [s, b, in]: 128 tokens
  const at::Tensor w = (at::randn({256, 128}) * 0.05).requires_grad_(true);
  const at::Tensor dy = at::randn({2, 64, 256}) * 1e-3;
  at::Tensor y = layer.forward(x, w);
  y.backward(dy);
  const bool blockwise = c.fp8_recipe == "blockwise";
  const bool hybrid = c.fp8 == "hybrid";
  // The reference casts: for the delayed recipe the first step's scales are 1.
  auto cast = [&](const at::Tensor& t, bool gradient, int64_t tile_rows) {
    const at::ScalarType type = gradient && hybrid ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
    if (blockwise) return fp8::dequantize(fp8::cast_blockwise(t, type, tile_rows)).to(at::kDouble);
    const at::Tensor scale = c.fp8_recipe == "delayed" ? at::ones({}) : fp8::scale_from_amax(fp8::amax(t), fp8::max_finite(type));
    return fp8::dequantize(fp8::cast_tensorwise(t, scale, type, true, false).rowwise).to(at::kDouble);
  };
  const at::Tensor x2 = x.detach().reshape({-1, 128}), dy2 = dy.reshape({-1, 256});
  const at::Tensor X = cast(x2, false, 1), W = cast(w.detach(), false, 128), dY = cast(dy2, true, 1);
  // The weight gradient's operands are cast along the tokens (blockwise: tiles of the transposes).
  const at::Tensor Xt = blockwise ? cast(x2.t(), false, 1) : X.t(), dYt = blockwise ? cast(dy2.t(), true, 1) : dY.t();
  auto close = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
    EXPECT_LE(largest(got.to(at::kDouble) - want), 1e-4 * largest(want) + 1e-12) << what;
  };
  close(y.detach().reshape({-1, 256}), at::mm(X, W.t()), "y");
  close(x.grad().reshape({-1, 128}), at::mm(dY, W), "dx");
  close(w.grad(), at::mm(dYt, Xt.t()), "dW");
  // And FP8 is an approximation of the high-precision layer, not something else.
  EXPECT_LE(largest(y.detach() - at::matmul(x.detach(), w.detach().t())), 0.15 * largest(y.detach()));
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8LinearRecipes,
                         testing::Values(Recipe{"TensorwiseE4m3", "tensorwise", "e4m3"}, Recipe{"TensorwiseHybrid", "tensorwise", "hybrid"},
                                         Recipe{"DelayedHybrid", "delayed", "hybrid"}, Recipe{"BlockwiseE4m3", "blockwise", "e4m3"}),
                         [](const testing::TestParamInfo<Recipe>& info) { return info.param.name; });

TEST(Fp8Linear, WeightsAreCastOncePerStepAndGradientsLandInMainGrad) {
  ModelConfig c;
  c.fp8 = "e4m3";
  c.fp8_recipe = "tensorwise";
  auto context = std::make_shared<fp8::Fp8Context>(fp8::options_for(c));
  tp::Fp8Linear layer(context, "test layer");
  at::manual_seed(3);
  const at::Tensor x = at::randn({32, 64});
  const at::Tensor w = at::randn({32, 64}).requires_grad_(true);
  const at::Tensor y1 = layer.forward(x, w).detach();
  {
    at::NoGradGuard no_grad;
    w.mul_(2);  // as an optimizer step changes the weight in place
  }
  EXPECT_TRUE(at::equal(layer.forward(x, w).detach(), y1)) << "the step's cast weight is reused";
  context->next_step();
  EXPECT_FALSE(at::equal(layer.forward(x, w).detach(), y1)) << "the next step casts the new weight";

  // With a registered main_grad the weight gradient is written there (first add), then added.
  const at::Tensor main_grad = at::full({32, 64}, 123.0f);
  int adds = 0;
  bool first = true;
  tp::register_main_grad(w, {main_grad, [&] { const bool f = first; first = false; return f; }, [&] { ++adds; }});
  const at::Tensor dy = at::randn({32, 32});
  layer.forward(x, w).backward(dy);
  EXPECT_FALSE(w.grad().defined()) << "no .grad: the gradient went to main_grad";
  const at::Tensor once = main_grad.clone();
  EXPECT_LE(largest(once - at::mm(dy.t(), x)), 0.1 * largest(once)) << "overwritten, not added to 123";
  layer.forward(x, w).backward(dy);
  EXPECT_TRUE(at::allclose(main_grad, 2 * once, 1e-5, 1e-5)) << "the second micro-batch adds";
  EXPECT_EQ(adds, 2);
  tp::unregister_main_grad(w);
}

}  // namespace
}  // namespace megatron
