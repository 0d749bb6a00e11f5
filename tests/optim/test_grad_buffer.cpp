// The gradient buffer is not zero-filled between steps: each parameter's first gradient of a
// step overwrites its main_grad (the fused weight-gradient GEMM with beta 0, or a copy in the
// hook), later ones add, and finish_grad_sync() zeroes the main_grad of a parameter no gradient
// reached. Checked against autograd's own .grad over steps with different inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "distributed/parallel_state.h"
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

// bf16: bf16 parameters with --grad-reduce-in-bf16 (main_grad in bf16), against the fp32
// gradients of the same values within bf16 rounding.
void check_steps(bool gradient_accumulation_fusion, bool bf16 = false) {
  at::manual_seed(11);
  const at::ScalarType dtype = bf16 ? at::kBFloat16 : at::kFloat;
  at::Tensor weight = at::randn({6, 4}).to(dtype).requires_grad_();  // through tp::linear (the fused GEMM when registered)
  at::Tensor scale = at::randn({6}).to(dtype).requires_grad_();      // through the hook, like a norm weight
  at::Tensor unused = at::randn({3}).to(dtype).requires_grad_();     // no gradient in this model
  GradBufferOptions options;
  options.gradient_accumulation_fusion = gradient_accumulation_fusion;
  options.grad_reduce_in_bf16 = bf16;
  ParamAndGradBuffer buffer({{"w.weight", weight}, {"s.weight", scale}, {"u.weight", unused}},
                            dist::ParallelState::single(), options);
  for (int step = 0; step < 3; ++step) {
    buffer.zero_grad();
    if (step == 2) main_grad_of(buffer, "u.weight").fill_(std::numeric_limits<float>::quiet_NaN());
    at::Tensor w_ref = weight.detach().to(at::kFloat).requires_grad_(), s_ref = scale.detach().to(at::kFloat).requires_grad_();
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      const at::Tensor x = at::randn({5, 4}).to(dtype);
      (tp::linear(x, weight) * scale).pow(2).sum().backward();
      (at::linear(x.to(at::kFloat), w_ref) * s_ref).pow(2).sum().backward();
    }
    buffer.finish_grad_sync();
    const double rtol = bf16 ? 2e-2 : 1e-5, atol = bf16 ? 5e-2 : 1e-8;
    for (const char* name : {"w.weight", "s.weight"}) {
      const at::Tensor& got = main_grad_of(buffer, name);
      EXPECT_EQ(got.scalar_type(), bf16 ? at::kBFloat16 : at::kFloat) << name;
      const at::Tensor& want = std::string(name) == "w.weight" ? w_ref.grad() : s_ref.grad();
      EXPECT_TRUE(at::allclose(got.to(at::kFloat), want, rtol, atol)) << name << " step " << step;
    }
    EXPECT_TRUE(at::equal(main_grad_of(buffer, "u.weight").to(at::kFloat), at::zeros({3}))) << "step " << step;
  }
}

TEST(GradBuffer, EachStepStartsFromItsOwnGradientsWithFusion) { check_steps(true); }
TEST(GradBuffer, EachStepStartsFromItsOwnGradientsThroughTheHook) { check_steps(false); }
TEST(GradBuffer, Bf16GradientsWithFusion) { check_steps(true, /*bf16=*/true); }
TEST(GradBuffer, Bf16GradientsThroughTheHook) { check_steps(false, /*bf16=*/true); }

// Dense and expert gradients reduce over different groups, so they live in different buffers:
// a buffer takes only parameters of its own gradient group.
TEST(GradBuffer, EachBufferHoldsOneGradientGroup) {
  tp::ParamInfo expert;
  expert.expert = 3;
  expert.grad_group = tp::GradGroup::ExpertDataParallel;
  const at::Tensor dense_weight = at::randn({4}).requires_grad_(), expert_weight = at::randn({4}).requires_grad_();
  EXPECT_THROW(ParamAndGradBuffer({{"e.weight", expert_weight, 0, expert}}, dist::ParallelState::single(), GradBufferOptions{}),
               c10::Error);
  GradBufferOptions experts;
  experts.grad_group = tp::GradGroup::ExpertDataParallel;
  EXPECT_THROW(ParamAndGradBuffer({{"d.weight", dense_weight}}, dist::ParallelState::single(), experts), c10::Error);
  ParamAndGradBuffer buffer({{"e.weight", expert_weight, 0, expert}}, dist::ParallelState::single(), experts);
  EXPECT_EQ(buffer.reduce_group().size(), 1);
  EXPECT_EQ(buffer.params().at(0).numel, 4);
}

}  // namespace
}  // namespace megatron
