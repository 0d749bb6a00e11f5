// The FP8 path on an FP8-capable GPU (scripts/gpu/run.sh fp8 runs these; elsewhere they report a
// skip): the fused cast(-transpose) kernel bit for bit against the ATen composite, and the FP8
// GEMMs of every recipe (cuBLAS through at::_scaled_mm; blockwise scales where this build's
// cuBLAS takes them) against GEMMs of the dequantized operands, and the layer against its CPU run;
// the MoE experts' grouped FP8 GEMMs (at::_scaled_grouped_mm) and casts against their CPU path.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>

#include "fp8/grouped.h"
#include "fp8/quantize.h"
#include "fp8/recipe.h"
#include "kernels/ops.h"
#include "moe/experts.h"
#include "support/model_configs.h"
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

// The experts' operands: the same bytes and scales on both devices (power-of-two scales: the
// products are exact, one rounding in the cast), and torch's grouped FP8 GEMM against the GEMMs of
// the dequantized operands that the CPU runs, with experts of 0, 1 and unaligned row counts.
TEST(Fp8Cuda, GroupedCastsAndGemmsEqualTheCpuPath) {
  REQUIRE_FP8_GPU();
  at::manual_seed(5);
  const std::vector<int64_t> sizes = {37, 0, 128, 5, 1, 64, 0, 300};
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  const int64_t groups = int64_t(sizes.size()), in = 256, out = 384;
  const at::Tensor counts = at::tensor(sizes, at::kLong), ends = counts.cumsum(0).to(at::kInt);
  const at::Tensor x = at::randn({n, in}).to(at::kBFloat16), w = (at::randn({groups, out, in}) * 0.05).to(at::kBFloat16);
  const at::Tensor dy = at::randn({n, out}).to(at::kBFloat16);
  auto same = [](const fp8::Quantized& a, const fp8::Quantized& b, const char* what) {
    EXPECT_TRUE(at::equal(a.data.cpu().view(at::kByte), b.data.cpu().view(at::kByte))) << what;
    EXPECT_TRUE(at::equal(a.scale_inv.cpu(), b.scale_inv.cpu())) << what;
  };
  const fp8::Quantized qx = fp8::cast_rows(x), qw = fp8::cast_rows(w);
  same(fp8::cast_rows(x.to(kGpu)), qx, "rows of x");
  same(fp8::cast_rows(w.to(kGpu)), qw, "rows of the weights");
  {  // the kernel's element-wise path (20 columns), a row of zeros, a row at 448 / amax just below 256
    at::Tensor odd = at::randn({3, 20});
    odd[1].zero_();
    odd[2].fill_(std::nextafter(1.75f, 2.0f));
    same(fp8::cast_rows(odd.to(kGpu)), fp8::cast_rows(odd), "rows of 20 fp32 values");
    EXPECT_EQ(fp8::cast_rows(odd.to(kGpu)).scale_inv[2].item<float>(), 1.0f / 128);
  }
  const fp8::GroupColumns cx = fp8::cast_group_columns(x, counts), cdy = fp8::cast_group_columns(dy, counts);
  const fp8::GroupColumns gx = fp8::cast_group_columns(x.to(kGpu), counts.to(kGpu));
  same(gx.q, cx.q, "columns of x per expert");
  EXPECT_TRUE(at::equal(gx.ends.cpu(), cx.ends));
  auto to_gpu = [](const fp8::Quantized& q) { return fp8::Quantized{q.data.to(kGpu), q.scale_inv.to(kGpu)}; };
  auto columns_to_gpu = [&](const fp8::GroupColumns& g) { return fp8::GroupColumns{to_gpu(g.q), g.ends.to(kGpu)}; };
  const at::Tensor y_cpu = fp8::grouped_mm_rows(qx, qw, ends, true);
  const at::Tensor y_gpu = fp8::grouped_mm_rows(to_gpu(qx), to_gpu(qw), ends.to(kGpu), true).cpu();
  EXPECT_LE(largest(y_gpu.to(at::kFloat) - y_cpu.to(at::kFloat)), 1e-2 * largest(y_cpu.to(at::kFloat))) << "forward";
  const at::Tensor dw_cpu = fp8::grouped_mm_groups(cdy, cx);
  const at::Tensor dw_gpu = fp8::grouped_mm_groups(columns_to_gpu(cdy), columns_to_gpu(cx)).cpu();
  for (int64_t e = 0; e < groups; ++e) {
    const at::Tensor a = dw_gpu[e].to(at::kFloat), b = dw_cpu[e].to(at::kFloat);
    if (sizes[size_t(e)] == 0) {
      EXPECT_TRUE(at::equal(a, at::zeros_like(a))) << "expert " << e << " has no rows";
    } else {
      EXPECT_LE(largest(a - b), 1e-2 * largest(b)) << "weight gradient of expert " << e;
    }
  }
}

TEST(Fp8Cuda, Fp8ExpertsOnTheGpuMatchTheirCpuRun) {
  REQUIRE_FP8_GPU();
  ModelConfig c = test::one_moe_layer(/*hidden=*/256, /*experts=*/8, /*expert_ffn=*/128);
  c.fp8 = "hybrid";
  const tp::TensorParallel tp;
  const std::vector<int64_t> sizes = {37, 0, 128, 5, 0, 64, 1, 300};
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  at::manual_seed(6);
  const at::Tensor x = at::randn({n, 256}).to(at::kBFloat16), dy = at::randn({n, 256}).to(at::kBFloat16);
  auto run = [&](const at::Device& device) {
    moe::GroupedExperts experts(PartContext{c, tp, device, false, 0, std::make_shared<fp8::Fp8Context>(fp8::options_for(c))}, 0,
                                c.num_experts);
    at::manual_seed(7);
    {
      at::NoGradGuard no_grad;
      for (size_t e = 0; e < experts.fc1.size(); ++e) {
        experts.fc1[e].copy_(at::randn(experts.fc1[e].sizes()) * 0.05), experts.fc2[e].copy_(at::randn(experts.fc2[e].sizes()) * 0.05);
      }
    }
    experts.to(at::kBFloat16);
    const at::Tensor in = x.to(device).detach().requires_grad_(true);  // a leaf on either device
    const at::Tensor y = experts.forward(in, at::tensor(sizes, at::kLong).to(device));
    y.backward(dy.to(device));
    std::vector<at::Tensor> r = {y.detach().cpu().to(at::kFloat), in.grad().cpu().to(at::kFloat)};
    for (size_t e = 0; e < experts.fc1.size(); ++e) {
      r.push_back(experts.fc1[e].grad().cpu().to(at::kFloat));
      r.push_back(experts.fc2[e].grad().cpu().to(at::kFloat));
    }
    return r;
  };
  const auto cpu = run(at::kCPU), gpu = run(kGpu);
  for (size_t i = 0; i < cpu.size(); ++i) {
    // Summation order, fast accumulation and bf16 outputs differ, and fc1's output is cast to FP8
    // again: an element one e4m3 step (6%) apart there moves what follows by as much (an H200 saw
    // single elements 2-6% of the largest apart). A wrong kernel or layout would be ~100% off.
    const double error = ((gpu[i] - cpu[i]).norm() / cpu[i].norm().clamp_min(1e-30)).item<double>();
    EXPECT_LE(error, 0.05) << "result " << i;
  }
}

}  // namespace
}  // namespace megatron
