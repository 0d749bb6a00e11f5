// The FP8 path on an FP8-capable GPU (scripts/gpu/run.sh fp8 runs these; elsewhere they report a
// skip): the fused cast(-transpose) kernel bit for bit against the ATen composite, and the FP8
// GEMMs of every recipe (cuBLAS through at::_scaled_mm; blockwise scales where this build's
// cuBLAS takes them) against GEMMs of the dequantized operands, and the layer against its CPU run.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "fp8/quantize.h"
#include "fp8/recipe.h"
#include "kernels/ops.h"
#include "tensor_parallel/fp8_linear.h"

namespace megatron {
namespace {

#define REQUIRE_FP8_GPU()                                                                             \
  if (!at::hasCUDA() || !kernels::built_with_kernels())                                              \
  GTEST_SKIP() << "needs an FP8-capable CUDA device and a MEGATRON_CUDA build; scripts/gpu/run.sh fp8 runs this there"

const at::Device kGpu(at::kCUDA, 0);

double largest(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST(Fp8Cuda, CastKernelEqualsTheCompositeBitForBit) {
  REQUIRE_FP8_GPU();
  at::manual_seed(0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat, at::kHalf}) {
    for (at::ScalarType fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{333, 517}, {256, 1024}, {1, 8}}) {
        // Magnitudes over many binades, some beyond the format's range after scaling, and a NaN.
        at::Tensor x = (at::randn({rows, cols}) * at::exp(at::randn({rows, cols}) * 4)).to(dtype).to(kGpu);
        x.view({-1})[0] = NAN;
        const at::Tensor scale = at::full({}, 3.7f, at::TensorOptions().device(kGpu));
        const fp8::Cast k = fp8::cast_tensorwise(x, scale, fp8, true, true, kernels::Impl::Auto);
        const fp8::Cast c = fp8::cast_tensorwise(x, scale, fp8, true, true, kernels::Impl::Composite);
        EXPECT_TRUE(at::equal(k.rowwise.data.view(at::kByte), c.rowwise.data.view(at::kByte))) << dtype << " " << fp8 << " " << rows;
        EXPECT_TRUE(at::equal(k.transposed.data.view(at::kByte), c.transposed.data.view(at::kByte))) << dtype << " " << fp8 << " " << rows;
        const fp8::Cast t_only = fp8::cast_tensorwise(x, scale, fp8, false, true, kernels::Impl::Auto);
        EXPECT_TRUE(at::equal(t_only.transposed.data.view(at::kByte), c.transposed.data.view(at::kByte)));
      }
    }
  }
}

// The tensorwise recipe's cast (amax kernel, scale computed in the cast) and the delayed recipe's
// amax pooled in the cast's pass, against the ATen composite: values, scale_inv and amax bit for
// bit, including the cases where the scale falls back to 1 (all zeros, a NaN, an amax so small
// that fp8_max / amax overflows).
TEST(Fp8Cuda, CurrentScalingAndPooledAmaxEqualTheCompositeBitForBit) {
  REQUIRE_FP8_GPU();
  at::manual_seed(2);
  const at::TensorOptions f32 = at::TensorOptions().device(kGpu).dtype(at::kFloat);
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    for (at::ScalarType fp8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (int variant = 0; variant < 4; ++variant) {
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{333, 517}, {256, 1024}, {1, 8}, {4096, 77}}) {
          at::Tensor x = (at::randn({rows, cols}) * at::exp(at::randn({rows, cols}) * 3)).to(dtype).to(kGpu);
          if (variant == 1) x.zero_();
          if (variant == 2) x.view({-1})[rows * cols / 2] = NAN;
          if (variant == 3) x = (x.to(at::kFloat) * 1e-42).to(dtype);  // denormal amax (0 in bf16)
          const std::string what = c10::toString(dtype) + std::string(" ") + c10::toString(fp8) + " variant " +
                                   std::to_string(variant) + " rows " + std::to_string(rows);
          const fp8::Cast k = fp8::cast_current_scaling(x, fp8, true, true, kernels::Impl::Auto);
          const fp8::Cast c = fp8::cast_current_scaling(x, fp8, true, true, kernels::Impl::Composite);
          EXPECT_TRUE(at::equal(k.rowwise.data.view(at::kByte), c.rowwise.data.view(at::kByte))) << what;
          EXPECT_TRUE(at::equal(k.transposed.data.view(at::kByte), c.transposed.data.view(at::kByte))) << what;
          EXPECT_TRUE(at::equal(k.rowwise.scale_inv, c.rowwise.scale_inv)) << what << ": " << k.rowwise.scale_inv.item<float>()
                                                                           << " vs " << c.rowwise.scale_inv.item<float>();
          const fp8::Cast rows_only = fp8::cast_current_scaling(x, fp8, true, false, kernels::Impl::Auto);
          EXPECT_TRUE(at::equal(rows_only.rowwise.data.view(at::kByte), c.rowwise.data.view(at::kByte))) << what;

          // Pooled: a slot already holding 0.5 ends at max(0.5, max |x|) on both paths (NaN wins).
          const at::Tensor scale = at::full({}, 2.5f, f32);
          at::Tensor pooled_kernel = at::full({}, 0.5f, f32), pooled_composite = at::full({}, 0.5f, f32);
          for (bool transposed : {false, true}) {
            const fp8::Cast pk = fp8::cast_tensorwise(x, scale, fp8, true, transposed, kernels::Impl::Auto, pooled_kernel);
            const fp8::Cast pc = fp8::cast_tensorwise(x, scale, fp8, true, transposed, kernels::Impl::Composite, pooled_composite);
            EXPECT_TRUE(at::equal(pk.rowwise.data.view(at::kByte), pc.rowwise.data.view(at::kByte))) << what;
            EXPECT_TRUE(at::equal(pk.rowwise.scale_inv, pc.rowwise.scale_inv)) << what;
          }
          EXPECT_TRUE(at::equal(pooled_kernel, pooled_composite) ||
                      (pooled_kernel.isnan().item<bool>() && pooled_composite.isnan().item<bool>()))
              << what << ": " << pooled_kernel.item<float>() << " vs " << pooled_composite.item<float>();
        }
      }
    }
  }
}

TEST(Fp8Cuda, GemmsOfEveryRecipeEqualTheGemmOfTheDequantizedOperands) {
  REQUIRE_FP8_GPU();
  at::manual_seed(1);
  const at::Tensor a = at::randn({256, 512}, at::TensorOptions().device(kGpu)).to(at::kBFloat16);
  const at::Tensor b = at::randn({384, 512}, at::TensorOptions().device(kGpu)).to(at::kBFloat16);
  auto check = [](const fp8::Quantized& qa, const fp8::Quantized& qb, const char* what) {
    const at::Tensor want = at::mm(fp8::dequantize(qa).to(at::kDouble), fp8::dequantize(qb).to(at::kDouble).t());
    for (bool fast : {false, true}) {
      const at::Tensor got = fp8::scaled_mm(qa, qb, at::kFloat, fast);
      EXPECT_LE(largest(got.to(at::kDouble) - want), 2e-3 * largest(want)) << what << (fast ? " (fast accumulation)" : "");
    }
  };
  auto tensorwise = [](const at::Tensor& t, at::ScalarType type) {
    return fp8::cast_tensorwise(t, fp8::scale_from_amax(fp8::amax(t), fp8::max_finite(type)), type, true, false).rowwise;
  };
  check(tensorwise(a, at::kFloat8_e4m3fn), tensorwise(b, at::kFloat8_e4m3fn), "tensorwise e4m3 x e4m3");
  check(tensorwise(a, at::kFloat8_e5m2), tensorwise(b, at::kFloat8_e4m3fn), "tensorwise e5m2 x e4m3");
  check(fp8::cast_blockwise(a, at::kFloat8_e4m3fn, 1), fp8::cast_blockwise(b, at::kFloat8_e4m3fn, 128), "blockwise 1x128 x 128x128");
  check(fp8::cast_blockwise(a, at::kFloat8_e4m3fn, 1), fp8::cast_blockwise(b, at::kFloat8_e4m3fn, 1), "blockwise 1x128 x 1x128");
}

TEST(Fp8Cuda, LayerOnTheGpuMatchesItsCpuRun) {
  REQUIRE_FP8_GPU();
  for (const char* recipe : {"tensorwise", "delayed", "blockwise"}) {
    ModelConfig c;
    c.fp8 = "hybrid";
    c.fp8_recipe = recipe;
    at::manual_seed(2);
    const at::Tensor x = at::randn({128, 2, 256}), w = at::randn({384, 256}) * 0.05, dy = at::randn({128, 2, 384});
    auto run = [&](const at::Device& device) {
      tp::Fp8Linear layer(std::make_shared<fp8::Fp8Context>(fp8::options_for(c)), "test layer");
      const at::Tensor xd = x.to(device).detach().requires_grad_(true), wd = w.to(device).detach().requires_grad_(true);
      const at::Tensor y = layer.forward(xd, wd);
      y.backward(dy.to(device));
      return std::vector<at::Tensor>{y.detach().cpu(), xd.grad().cpu(), wd.grad().cpu()};
    };
    const auto cpu = run(at::kCPU), gpu = run(kGpu);
    const char* names[] = {"y", "dx", "dW"};
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(largest(gpu[i] - cpu[i]), 2e-3 * largest(cpu[i])) << recipe << " " << names[i];
    }
  }
}

}  // namespace
}  // namespace megatron
