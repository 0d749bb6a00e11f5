// AdamW over the gradient buffer (fp32 masters, clipping folded into the fused kernel's
// grad_scale) against LibTorch's own torch::optim::AdamW on explicitly clipped gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "distributed/parallel_state.h"
#include "optim/adamw.h"

namespace megatron {
namespace {

void check_steps(double clip_grad, double gradient_size) {
  at::manual_seed(9);
  std::vector<at::Tensor> params = {at::randn({6, 5}).requires_grad_(), at::randn({5}).requires_grad_(),
                                    at::randn({3, 6}).requires_grad_()};
  std::vector<NamedTensor> named = {{"a.weight", params[0]}, {"a.bias", params[1]}, {"b.weight", params[2]}};
  std::vector<at::Tensor> reference;
  for (auto& p : params) reference.push_back(p.detach().clone().requires_grad_(true));
  // Megatron's AdamW decays matrices only.
  torch::optim::AdamW matrices({reference[0], reference[2]}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW vectors({reference[1]}, torch::optim::AdamWOptions(1e-2).weight_decay(0.0));

  ParamAndGradBuffer buffer(named, dist::ParallelState::single(), GradBufferOptions{});
  TrainConfig config;
  config.clip_grad = clip_grad;
  config.weight_decay = 0.1;
  AdamW adamw(buffer, config);
  for (int step = 0; step < 3; ++step) {
    buffer.zero_grad();
    std::vector<at::Tensor> grads;
    // Sizes that change from step to step: Adam is nearly blind to one constant scale, not to
    // the ratio between steps, so a clip applied wrongly (or not at all) shows in the moments.
    const double scale = std::vector<double>{1.0, 30.0, 3.0}[step];
    for (auto& p : params) grads.push_back(gradient_size * scale * at::randn(p.sizes()));
    for (const BufferedParam& p : buffer.params()) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (p.name == named[i].name) p.main_grad.copy_(grads[i]);
      }
    }
    const at::Tensor norm_on_device = adamw.grad_norm();
    const double norm = norm_on_device.item<double>();
    double expected_squared = 0;
    for (auto& g : grads) expected_squared += g.pow(2).sum().item<double>();
    EXPECT_NEAR(norm, std::sqrt(expected_squared), 1e-5 * norm);
    adamw.set_learning_rate(1e-2);
    EXPECT_TRUE(adamw.step(norm_on_device).item<bool>());

    // Megatron's clip: scale by clip / (norm + 1e-6) when that is below 1.
    const double coeff = clip_grad > 0 ? std::min(1.0, clip_grad / (norm + 1e-6)) : 1.0;
    for (size_t i = 0; i < params.size(); ++i) reference[i].mutable_grad() = grads[i] * coeff;
    matrices.step();
    vectors.step();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LE((params[i].detach() - reference[i].detach()).abs().max().item<double>(), 1e-6) << named[i].name << " step " << step;
    }
  }
}

TEST(AdamW, NonFiniteGradientsOrLossSkipTheStepWithoutCountingIt) {
  at::manual_seed(3);
  at::Tensor weight = at::randn({4, 3}).requires_grad_();
  at::Tensor reference = weight.detach().clone().requires_grad_(true);
  torch::optim::AdamW torch_adamw({reference}, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  ParamAndGradBuffer buffer({{"w.weight", weight}}, dist::ParallelState::single(), GradBufferOptions{});
  TrainConfig config;
  config.weight_decay = 0.1;
  AdamW adamw(buffer, config);
  const at::Tensor start = weight.detach().clone();
  const at::Tensor& main_grad = buffer.params()[0].main_grad;

  main_grad.copy_(at::randn({4, 3}));
  main_grad[1][2] = std::numeric_limits<float>::quiet_NaN();
  adamw.set_learning_rate(1e-2);
  EXPECT_FALSE(adamw.step(adamw.grad_norm()).item<bool>());
  main_grad.fill_(0.5);
  EXPECT_FALSE(adamw.step(adamw.grad_norm(), at::full({}, std::numeric_limits<double>::infinity())).item<bool>());
  EXPECT_TRUE(at::equal(weight.detach(), start)) << "skipped steps must leave the weights as they were";
  EXPECT_EQ(adamw.steps_taken(), 0);

  // The next good step is the first one (bias corrections for step 1), as torch's.
  const at::Tensor grad = at::randn({4, 3});
  main_grad.copy_(grad);
  EXPECT_TRUE(adamw.step(adamw.grad_norm(), at::full({}, 2.5)).item<bool>());
  EXPECT_EQ(adamw.steps_taken(), 1);
  const double coeff = std::min(1.0, config.clip_grad / (grad.norm().item<double>() + 1e-6));
  reference.mutable_grad() = grad * coeff;
  torch_adamw.step();
  EXPECT_LE((weight.detach() - reference.detach()).abs().max().item<double>(), 1e-6);
}

// --grad-reduce-in-bf16: bf16 gradients step the fp32 masters exactly as the same values held
// in fp32 do, and the gradient norm is formed in fp32 all the same.
TEST(AdamW, Bf16GradientsStepAsTheirFp32Values) {
  at::manual_seed(5);
  const at::Tensor init = at::randn({6, 5}).to(at::kBFloat16);
  at::Tensor w16 = init.clone().requires_grad_(), w32 = init.clone().requires_grad_();
  GradBufferOptions bf16_grads;
  bf16_grads.grad_reduce_in_bf16 = true;
  ParamAndGradBuffer b16({{"w.weight", w16}}, dist::ParallelState::single(), bf16_grads);
  ParamAndGradBuffer b32({{"w.weight", w32}}, dist::ParallelState::single(), GradBufferOptions{});
  ASSERT_EQ(b16.grad_data.scalar_type(), at::kBFloat16);
  ASSERT_EQ(b32.grad_data.scalar_type(), at::kFloat);
  TrainConfig config;
  config.clip_grad = 0.0;  // the norms may differ in their last bit; the steps must not depend on them
  AdamW a16(b16, config), a32(b32, config);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor grad = (3.0 * at::randn({6, 5})).to(at::kBFloat16);
    b16.params()[0].main_grad.copy_(grad);
    b32.params()[0].main_grad.copy_(grad.to(at::kFloat));
    const at::Tensor n16 = a16.grad_norm(), n32 = a32.grad_norm();
    EXPECT_EQ(n16.scalar_type(), at::kFloat);
    EXPECT_NEAR(n16.item<double>(), n32.item<double>(), 1e-6 * n32.item<double>());
    a16.set_learning_rate(1e-2 * (step + 1));
    a32.set_learning_rate(1e-2 * (step + 1));
    EXPECT_TRUE(a16.step(n16).item<bool>());
    EXPECT_TRUE(a32.step(n32).item<bool>());
    EXPECT_TRUE(at::equal(a16.params()[0].master, a32.params()[0].master)) << "step " << step;
    EXPECT_TRUE(at::equal(w16.detach(), w32.detach())) << "step " << step;
  }
  EXPECT_FALSE(at::equal(w16.detach(), init)) << "the weights must have moved";
}

// --overlap-optimizer-step: step() returns while the update stream still runs, and the
// trainer's stream goes on at once: it writes the next learning rate (the updates must read
// their own copy), runs the next backward into main_grad (the first gradient into a bucket must
// wait for that bucket's update, which reads main_grad) and reads the parameters stepped last
// first (wait_for_params must wait, or it reads them stale). Everything it reads must be bitwise
// the serial step's. Buckets of 16M elements (~0.1 ms of AdamW each) leave wide windows for
// those races.
TEST(CudaOverlappedOptimizerStep, WaitedParametersAreBitwiseTheSerialStep) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(13);
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const std::vector<std::string> names = {"embedding.weight", "layer.0.weight", "layer.0.bias", "layer.1.weight", "output.weight"};
  std::vector<at::Tensor> init;
  for (const std::string& name : names) {
    init.push_back(name.find("bias") != std::string::npos ? at::randn({4096}, bf16) : at::randn({4096, 4096}, bf16));
  }
  struct Setup {
    std::vector<at::Tensor> params;
    std::unique_ptr<ParamAndGradBuffer> buffer;
    std::unique_ptr<AdamW> adamw;
  };
  TrainConfig config;
  config.weight_decay = 0.1;
  auto make = [&](bool overlap) {
    Setup s;
    std::vector<NamedTensor> named;
    for (size_t i = 0; i < names.size(); ++i) {
      s.params.push_back(init[i].clone().requires_grad_());
      named.push_back({names[i], s.params.back()});
    }
    GradBufferOptions options;
    options.bucket_size = 4096 * 4096;  // a bucket per matrix
    options.overlap_optimizer_step = overlap;
    s.buffer = std::make_unique<ParamAndGradBuffer>(named, dist::ParallelState::single(), options);
    s.adamw = std::make_unique<AdamW>(*s.buffer, config);
    return s;
  };
  Setup serial = make(false), overlapped = make(true);
  ASSERT_EQ(overlapped.buffer->num_buckets(), 4u);
  ASSERT_TRUE(overlapped.buffer->params_arrive_during_forward());
  auto new_grads = [&] {
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : init) grads.push_back(at::randn(p.sizes(), bf16));
    return grads;
  };
  // Through autograd, as training writes them: the hooks copy .grad into main_grad.
  auto backward = [](Setup& s, const std::vector<at::Tensor>& grads) {
    s.buffer->zero_grad();
    for (size_t i = 0; i < s.params.size(); ++i) (s.params[i] * grads[i]).sum().backward();
  };
  std::vector<at::Tensor> grads = new_grads();
  backward(overlapped, grads);
  for (int step = 0; step < 3; ++step) {
    backward(serial, grads);
    const double lr = 1e-3 * (step + 1);
    serial.adamw->set_learning_rate(lr);
    overlapped.adamw->set_learning_rate(lr);
    EXPECT_TRUE(serial.adamw->step(serial.adamw->grad_norm()).item<bool>());
    overlapped.adamw->step(overlapped.adamw->grad_norm());
    overlapped.adamw->set_learning_rate(-1.0);  // must not reach this step's updates
    grads = new_grads();
    backward(overlapped, grads);
    std::vector<at::Tensor> seen(names.size());
    for (size_t i = names.size(); i-- > 0;) {
      overlapped.buffer->wait_for_params({overlapped.params[i]});
      seen[i] = overlapped.params[i].detach().clone();
    }
    for (size_t i = 0; i < names.size(); ++i) {
      EXPECT_TRUE(at::equal(seen[i], serial.params[i].detach())) << names[i] << ", step " << step;
    }
    overlapped.buffer->finish_param_gather();
    const std::vector<NamedTensor> a = serial.adamw->state(), b = overlapped.adamw->state();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].tensor, b[i].tensor)) << a[i].name << ", step " << step;
  }
  EXPECT_FALSE(at::equal(serial.params[0].detach(), init[0])) << "the weights must have moved";
}

TEST(AdamW, ClippedStepsMatchTorchAdamWOnClippedGradients) { check_steps(1.0, 10.0); }
TEST(AdamW, UnclippedStepsMatchTorchAdamW) { check_steps(1.0, 0.001); }
TEST(AdamW, NoClippingWhenClipGradIsZero) { check_steps(0.0, 10.0); }

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {

// The precision-aware optimizer's bf16 parameters keep their fp32 masters as the bf16 weight plus
// an int16 remainder (Megatron's store_param_remainders): the masters it steps are bit for bit
// those of a full fp32 master with the same bf16 moments, the weights the master rounded (half
// away from zero, where the full master's copy rounds to even: they part at exact ties only), the
// checkpoint's "master" the fp32 value, and loading it back restores both halves. 2 bytes a
// parameter instead of 4.
TEST(AdamW, PrecisionAwareMastersAsRemaindersAreTheFp32Masters) {
  at::manual_seed(5);
  const at::Tensor start = at::randn({64, 48}), bias_start = at::randn({48});
  auto model = [&] {
    return std::vector<NamedTensor>{{"a.weight", start.to(at::kBFloat16).requires_grad_()},
                                    {"a.bias", bias_start.to(at::kBFloat16).requires_grad_()}};
  };
  const std::vector<NamedTensor> remainder_model = model(), full_model = model();
  ParamAndGradBuffer remainder_buffer(remainder_model, dist::ParallelState::single(), GradBufferOptions{});
  ParamAndGradBuffer full_buffer(full_model, dist::ParallelState::single(), GradBufferOptions{});
  TrainConfig config;
  config.weight_decay = 0.1;
  config.exp_avg_dtype = config.exp_avg_sq_dtype = "bf16";
  TrainConfig precision_aware = config;
  precision_aware.use_precision_aware_optimizer = true;
  ASSERT_TRUE(stores_param_remainders(precision_aware));
  ASSERT_FALSE(stores_param_remainders(config));
  AdamW with_remainders(remainder_buffer, precision_aware), with_masters(full_buffer, config);
  ASSERT_EQ(with_remainders.params()[0].master.scalar_type(), at::kShort);
  ASSERT_EQ(with_masters.params()[0].master.scalar_type(), at::kFloat);
  for (int step = 0; step < 6; ++step) {
    for (size_t i = 0; i < 2; ++i) {
      const at::Tensor grad = 0.1 * at::randn(remainder_buffer.params()[i].main_grad.sizes());
      remainder_buffer.params()[i].main_grad.copy_(grad);
      full_buffer.params()[i].main_grad.copy_(grad);
    }
    with_remainders.set_learning_rate(1e-2);
    with_masters.set_learning_rate(1e-2);
    with_remainders.step(with_remainders.grad_norm());
    with_masters.step(with_masters.grad_norm());
    for (size_t i = 0; i < 2; ++i) {
      const OptimizerParam &r = with_remainders.params()[i], &f = with_masters.params()[i];
      EXPECT_TRUE(at::equal(r.master_fp32(), f.master)) << r.name << " step " << step;
      EXPECT_TRUE(at::equal(r.exp_avg, f.exp_avg)) << r.name << " step " << step;
      const double parted = r.model_slice.ne(f.model_slice).to(at::kDouble).mean().item<double>();
      EXPECT_LE(parted, 1e-3) << r.name << " step " << step;
    }
  }
  EXPECT_FALSE(at::equal(remainder_model[0].tensor, start.to(at::kBFloat16))) << "it moved";
  // The checkpoint holds fp32 masters; loaded into a fresh optimizer (weights scrambled first),
  // they come back whole: the same masters and weights.
  const std::vector<NamedTensor> saved = with_remainders.state();
  for (const NamedTensor& t : saved) {
    if (t.name.find(".master") != std::string::npos) EXPECT_EQ(t.tensor.scalar_type(), at::kFloat) << t.name;
  }
  const std::vector<NamedTensor> other_model = model();
  ParamAndGradBuffer other_buffer(other_model, dist::ParallelState::single(), GradBufferOptions{});
  AdamW restored(other_buffer, precision_aware);
  restored.load_state(saved, /*load_moments=*/true);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal(restored.params()[i].master_fp32(), with_remainders.params()[i].master_fp32()));
    EXPECT_TRUE(at::equal(other_model[i].tensor, remainder_model[i].tensor)) << other_model[i].name;
  }
}

}  // namespace
}  // namespace megatron
