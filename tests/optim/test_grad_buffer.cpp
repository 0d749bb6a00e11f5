// The gradient buffer is not zero-filled between steps: each parameter's first gradient of a
// step overwrites its main_grad (the fused weight-gradient GEMM with beta 0, or a copy in the
// hook), later ones add, and finish_grad_sync() zeroes the main_grad of a parameter no gradient
// reached. Checked against autograd's own .grad over steps with different inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "dist/parallel_state.h"
#include "optim/grad_buffer.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

const at::Tensor& main_grad_of(const ParamAndGradBuffer& buffer, const std::string& name) {
  for (const BufferedParam& p : buffer.params()) {
    if (p.name == name) return p.main_grad;
  }
  throw std::runtime_error("no parameter " + name);
}

void check_steps(bool gradient_accumulation_fusion) {
  at::manual_seed(11);
  at::Tensor weight = at::randn({6, 4}).requires_grad_();  // through tp::linear (the fused GEMM when registered)
  at::Tensor scale = at::randn({6}).requires_grad_();      // through the hook, like a norm weight
  at::Tensor unused = at::randn({3}).requires_grad_();     // no gradient in this model
  GradBufferOptions options;
  options.gradient_accumulation_fusion = gradient_accumulation_fusion;
  ParamAndGradBuffer buffer({{"w.weight", weight}, {"s.weight", scale}, {"u.weight", unused}},
                            dist::ParallelState::single(), /*swiglu=*/false, options);
  for (int step = 0; step < 3; ++step) {
    buffer.zero_grad();
    if (step == 2) main_grad_of(buffer, "u.weight").fill_(std::numeric_limits<float>::quiet_NaN());
    at::Tensor w_ref = weight.detach().clone().requires_grad_(), s_ref = scale.detach().clone().requires_grad_();
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      const at::Tensor x = at::randn({5, 4});
      (tp::linear(x, weight) * scale).pow(2).sum().backward();
      (at::linear(x, w_ref) * s_ref).pow(2).sum().backward();
    }
    buffer.finish_grad_sync();
    EXPECT_TRUE(at::allclose(main_grad_of(buffer, "w.weight"), w_ref.grad())) << "step " << step;
    EXPECT_TRUE(at::allclose(main_grad_of(buffer, "s.weight"), s_ref.grad())) << "step " << step;
    EXPECT_TRUE(at::equal(main_grad_of(buffer, "u.weight"), at::zeros({3}))) << "step " << step;
  }
}

TEST(GradBuffer, EachStepStartsFromItsOwnGradientsWithFusion) { check_steps(true); }
TEST(GradBuffer, EachStepStartsFromItsOwnGradientsThroughTheHook) { check_steps(false); }

}  // namespace
}  // namespace megatron
