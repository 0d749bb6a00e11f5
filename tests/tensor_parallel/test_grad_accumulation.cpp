// Gradient-accumulation fusion: tp::linear with a registered main_grad writes (first micro-batch)
// or adds dW into it in the GEMM and leaves .grad alone; everything else about the linear is
// unchanged.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <utility>

#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

void check_accumulation(const at::Device& device, at::ScalarType dtype, double tolerance) {
  at::manual_seed(8);
  auto opts = at::TensorOptions(device).dtype(dtype);
  at::Tensor weight = at::randn({24, 16}, opts).requires_grad_(true);
  at::Tensor bias = at::randn({24}, opts).requires_grad_(true);
  // The buffer is not zero-filled between steps: the step's first GEMM overwrites main_grad
  // (beta 0, so even NaN left there is not read), later ones add.
  at::Tensor main_grad = at::full({24, 16}, std::numeric_limits<float>::quiet_NaN(), at::TensorOptions(device).dtype(at::kFloat));
  int added = 0;
  bool has_grad = false;
  tp::register_main_grad(weight, {main_grad, [&] { return !std::exchange(has_grad, true); }, [&] { ++added; }});

  at::Tensor expected = at::zeros_like(main_grad);
  at::Tensor expected_bias_grad = at::zeros({24}, at::TensorOptions(device).dtype(at::kFloat));
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    at::Tensor x = at::randn({5, 3, 16}, opts).requires_grad_(true);
    at::Tensor x_ref = x.detach().clone().requires_grad_(true);
    at::Tensor w_ref = weight.detach().clone().requires_grad_(true);
    at::Tensor b_ref = bias.detach().clone().requires_grad_(true);
    at::Tensor grad = at::randn({5, 3, 24}, opts);
    tp::linear(x, weight, bias).backward(grad);
    at::linear(x_ref, w_ref, b_ref).backward(grad);
    expected += w_ref.grad().to(at::kFloat);
    expected_bias_grad += b_ref.grad().to(at::kFloat);
    EXPECT_LE((x.grad() - x_ref.grad()).abs().max().item<double>(), tolerance);
  }
  EXPECT_EQ(added, 2);
  EXPECT_FALSE(weight.grad().defined());  // the gradient went to main_grad only
  EXPECT_LE((main_grad - expected).abs().max().item<double>(), tolerance * 10);
  EXPECT_LE((bias.grad().to(at::kFloat) - expected_bias_grad).abs().max().item<double>(), tolerance * 10);

  // Without a registration (inference, a model outside the trainer): the ordinary linear.
  tp::unregister_main_grad(weight);
  tp::linear(at::randn({2, 16}, opts), weight, bias).sum().backward();
  EXPECT_TRUE(weight.grad().defined());
  EXPECT_EQ(added, 2);
}

TEST(GradAccumulationFusion, AddsWeightGradientsIntoMainGrad) { check_accumulation(at::kCPU, at::kFloat, 1e-5); }

TEST(GradAccumulationFusion, CudaBf16AccumulatesInFp32) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  // bf16 inputs, fp32 accumulation inside cuBLAS (addmm with an fp32 output): the reference
  // rounds its dW to bf16 first, so they agree to bf16 precision of the product.
  check_accumulation(at::Device(at::kCUDA, 0), at::kBFloat16, 5e-2);
}

}  // namespace
}  // namespace megatron
