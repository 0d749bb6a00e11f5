// The MoE experts' FP8 grouped GEMMs (fp8/grouped.h, moe/fp8_grouped_linear.h) on the CPU, where
// each group's GEMM runs on the dequantized operands: the row-wise and per-expert column casts
// (power-of-two scales, the range used, each expert's rows padded to 16), the grouped GEMMs
// against the unquantized GEMMs of each expert, and the experts' FP8 MLP against the same experts
// in fp32 (forward, input and weight gradients, experts without rows, gradients into stacked
// main_grads, weights cast once per step). tests/fp8/test_fp8_cuda.cpp runs torch's kernel against these.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <vector>

#include "fp8/grouped.h"
#include "moe/experts.h"
#include "support/model_configs.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

double relative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

// ||a - b|| / ||b||: the error of a whole result, where FP8's rounding of single elements averages out.
double norm_relative(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item<double>();
}

bool powers_of_two(const at::Tensor& t) {
  const at::Tensor l = at::log2(t.to(at::kDouble));
  return at::equal(l, at::round(l));
}

TEST(Fp8Grouped, RowCastsArePowerOfTwoScaledAndUseTheRange) {
  at::manual_seed(1);
  at::Tensor x = at::randn({6, 32}) * at::logspace(-3, 3, 6).unsqueeze(1);  // rows of very different size
  x[4].zero_();
  const fp8::Quantized q = fp8::cast_rows(x);
  ASSERT_EQ(q.data.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(q.scale_inv.sizes(), at::IntArrayRef({6}));
  EXPECT_TRUE(powers_of_two(q.scale_inv)) << q.scale_inv;
  EXPECT_EQ(q.scale_inv[4].item<float>(), 1.0f) << "a row of zeros keeps scale 1";
  const at::Tensor values = q.data.to(at::kFloat);
  for (int64_t r = 0; r < 6; ++r) {
    if (r == 4) continue;
    const double top = values[r].abs().max().item<double>();
    EXPECT_GE(top, 224.0) << "row " << r << " uses the upper octave of e4m3";
    EXPECT_LE(top, 448.0);
  }
  // e4m3 keeps 3 mantissa bits: each value within 2^-4 of itself, or one subnormal step (2^-9).
  const at::Tensor dequantized = values * q.scale_inv.unsqueeze(1);
  const at::Tensor bound = x.abs() * 0.0625 + q.scale_inv.unsqueeze(1) * std::ldexp(1.0, -9);
  EXPECT_TRUE(((dequantized - x).abs() <= bound).all().item<bool>());
  // 448 / amax just below a power of two (256 here): log2 of it rounds to 8 in fp32, and a
  // scale of 256 would carry the row's largest value past 448 (NaN in e4m3fn). The scale is 128.
  const float edge = std::nextafter(1.75f, 2.0f);
  const fp8::Quantized e = fp8::cast_rows(at::full({1, 16}, edge));
  EXPECT_EQ(e.scale_inv.item<float>(), 1.0f / 128);
  EXPECT_TRUE(at::isfinite(e.data.to(at::kFloat)).all().item<bool>());
  // Batched: the experts' weights [E, out, in], a scale per (expert, row).
  const fp8::Quantized w = fp8::cast_rows(x.view({2, 3, 32}));
  EXPECT_EQ(w.scale_inv.sizes(), at::IntArrayRef({2, 3}));
  EXPECT_TRUE(at::equal(w.scale_inv.reshape({-1}), q.scale_inv));
}

TEST(Fp8Grouped, GroupColumnsStartEachExpertAtAMultipleOf16) {
  at::manual_seed(2);
  const std::vector<int64_t> sizes = {5, 0, 20, 12};
  const int64_t n = 37, cols = 32;
  const at::Tensor x = at::randn({n, cols}) * at::arange(1, cols + 1).to(at::kFloat);  // columns of different size
  const fp8::GroupColumns g = fp8::cast_group_columns(x, at::tensor(sizes, at::kLong));
  EXPECT_EQ(g.ends.scalar_type(), at::kInt);
  EXPECT_EQ(std::vector<int>(g.ends.data_ptr<int>(), g.ends.data_ptr<int>() + 4), (std::vector<int>{16, 16, 48, 64}));
  ASSERT_EQ(g.q.data.size(0), cols);
  EXPECT_EQ(g.q.data.size(1) % 16, 0) << "the contraction dimension is a multiple of 16";
  EXPECT_GE(g.q.data.size(1), 64);
  EXPECT_EQ(g.q.scale_inv.sizes(), at::IntArrayRef({4 * cols}));
  EXPECT_TRUE(powers_of_two(g.q.scale_inv));
  const at::Tensor values = g.q.data.to(at::kFloat);  // [cols, P]
  const at::Tensor scale_inv = g.q.scale_inv.view({4, cols});
  EXPECT_TRUE(at::equal(scale_inv[1], at::ones({cols}))) << "an expert without rows keeps scale 1";
  int64_t start = 0, padded_start = 0;
  for (size_t e = 0; e < sizes.size(); ++e) {
    const int64_t len = sizes[e], padded = (len + 15) / 16 * 16;
    if (len > 0) {
      const at::Tensor mine = values.narrow(1, padded_start, len);  // [cols, len]
      const at::Tensor expected = x.narrow(0, start, len).t();
      const at::Tensor back = mine * scale_inv[int64_t(e)].unsqueeze(1);
      EXPECT_LE(relative(back, expected), 0.07) << "expert " << e;
      const at::Tensor top = mine.abs().amax(1);  // each column's largest value in the expert's rows
      EXPECT_TRUE((top >= 224).logical_and(top <= 448).all().item<bool>()) << "expert " << e << ": " << top;
    }
    EXPECT_TRUE(at::equal(values.narrow(1, padded_start + len, padded - len), at::zeros({cols, padded - len})))
        << "zeros pad expert " << e;
    start += len;
    padded_start += padded;
  }
  EXPECT_TRUE(at::equal(values.narrow(1, padded_start, values.size(1) - padded_start),
                        at::zeros({cols, values.size(1) - padded_start})));
}

TEST(Fp8Grouped, GemmsFollowEachExpertsUnquantizedGemm) {
  at::manual_seed(3);
  const std::vector<int64_t> sizes = {7, 0, 33, 16, 1};
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  const int64_t groups = int64_t(sizes.size()), in = 48, out = 32;
  const at::Tensor counts = at::tensor(sizes, at::kLong), ends = counts.cumsum(0).to(at::kInt);
  const at::Tensor x = at::randn({n, in}), w = at::randn({groups, out, in}), dy = at::randn({n, out});
  const at::Tensor y = fp8::grouped_mm_rows(fp8::cast_rows(x), fp8::cast_rows(w), ends, true);
  const at::Tensor dw = fp8::grouped_mm_groups(fp8::cast_group_columns(dy, counts), fp8::cast_group_columns(x, counts));
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  ASSERT_EQ(dw.sizes(), at::IntArrayRef({groups, out, in}));
  int64_t start = 0;
  for (int64_t e = 0; e < groups; ++e) {
    const int64_t len = sizes[size_t(e)];
    if (len == 0) {
      EXPECT_TRUE(at::equal(dw[e], at::zeros({out, in}, dw.options()))) << "no rows, no gradient";
      continue;
    }
    const at::Tensor xe = x.narrow(0, start, len), dye = dy.narrow(0, start, len);
    EXPECT_LE(relative(y.narrow(0, start, len), at::mm(xe, w[e].t())), 0.08) << "expert " << e;
    EXPECT_LE(relative(dw[e], at::mm(dye.t(), xe)), 0.08) << "expert " << e;
    start += len;
  }
}

ModelConfig experts_config() {
  ModelConfig c = test::one_moe_layer(/*hidden=*/64, /*experts=*/4, /*expert_ffn=*/32);
  c.fp8 = "hybrid";
  c.fp8_recipe = "delayed";
  return c;
}

// The experts' weights in one storage, each expert's main_grad side by side in another, as the
// gradient buffer lays them out; returns the main_grads' storage.
at::Tensor stack_with_main_grads(std::vector<at::Tensor>& weights, std::vector<int>& adds) {
  at::NoGradGuard no_grad;
  const int64_t n = weights[0].numel(), e = int64_t(weights.size());
  const at::Tensor storage = at::empty({n * e}), grads = at::full({n * e}, 7.0f);  // stale values: the first add overwrites
  adds.assign(weights.size(), 0);
  for (int64_t i = 0; i < e; ++i) {
    at::Tensor& w = weights[size_t(i)];
    storage.narrow(0, i * n, n).copy_(w.reshape({-1}));
    w.set_data(storage.narrow(0, i * n, n).view(w.sizes()));
    tp::register_main_grad(w, {grads.narrow(0, i * n, n).view(w.sizes()), [&adds, i] { return adds[size_t(i)] == 0; },
                               [&adds, i] { ++adds[size_t(i)]; }});
  }
  return grads;
}

TEST(Fp8GroupedExperts, FollowTheFp32ExpertsAndCastWeightsOncePerStep) {
  const tp::TensorParallel tp;
  const ModelConfig c = experts_config();
  ModelConfig plain = c;
  plain.fp8.clear();
  auto context = std::make_shared<fp8::Fp8Context>(fp8::options_for(c));
  moe::GroupedExperts fp8_experts(PartContext{c, tp, at::kCPU, false, 0, context}, 0, c.num_experts);
  moe::GroupedExperts reference(PartContext{plain, tp, at::kCPU, false, 0}, 0, c.num_experts);
  at::manual_seed(4);
  {
    at::NoGradGuard no_grad;
    for (size_t e = 0; e < reference.fc1.size(); ++e) {
      reference.fc1[e].normal_(0, 0.1), reference.fc2[e].normal_(0, 0.1);
      fp8_experts.fc1[e].copy_(reference.fc1[e]), fp8_experts.fc2[e].copy_(reference.fc2[e]);
    }
  }
  std::vector<int> adds1, adds2;
  const at::Tensor grads1 = stack_with_main_grads(fp8_experts.fc1, adds1), grads2 = stack_with_main_grads(fp8_experts.fc2, adds2);
  const std::vector<int64_t> sizes = {9, 0, 40, 3};  // an expert without rows
  const at::Tensor counts = at::tensor(sizes, at::kLong);
  const at::Tensor x = at::randn({52, 64}), dy = at::randn({52, 64});
  at::Tensor in_fp8 = x.clone().requires_grad_(true), in_ref = x.clone().requires_grad_(true);
  const at::Tensor y_fp8 = fp8_experts.forward(in_fp8, counts), y_ref = reference.forward(in_ref, counts);
  torch::autograd::backward({y_fp8}, {dy});
  torch::autograd::backward({y_ref}, {dy});
  // e4m3 rounds each operand by up to 2^-4 (a few % on average): a result about 6% off, as FP8.
  EXPECT_LE(norm_relative(y_fp8, y_ref), 0.1);
  EXPECT_LE(norm_relative(in_fp8.grad(), in_ref.grad()), 0.1);
  for (size_t e = 0; e < sizes.size(); ++e) {
    EXPECT_FALSE(fp8_experts.fc1[e].grad().defined()) << "the gradients went to the main_grads";
    EXPECT_EQ(adds1[e], 1);
    EXPECT_EQ(adds2[e], 1);
    const at::Tensor g1 = grads1.narrow(0, int64_t(e) * 64 * 64, 64 * 64).view({64, 64});
    const at::Tensor g2 = grads2.narrow(0, int64_t(e) * 64 * 32, 64 * 32).view({64, 32});
    if (sizes[e] == 0) {
      EXPECT_TRUE(at::equal(g1, at::zeros_like(g1))) << "expert " << e << ": overwritten with its zero gradient";
      continue;
    }
    EXPECT_LE(norm_relative(g1, reference.fc1[e].grad()), 0.1) << "expert " << e;
    EXPECT_LE(norm_relative(g2, reference.fc2[e].grad()), 0.1) << "expert " << e;
  }
  // The step's cast weights are reused until the step ends.
  at::NoGradGuard no_grad;
  for (at::Tensor& w : fp8_experts.fc2) w.mul_(2);
  EXPECT_TRUE(at::equal(fp8_experts.forward(x, counts), y_fp8.detach())) << "the step's cast weights are reused";
  context->next_step();
  EXPECT_FALSE(at::equal(fp8_experts.forward(x, counts), y_fp8.detach())) << "the next step casts the new weights";
  for (std::vector<at::Tensor>* ws : {&fp8_experts.fc1, &fp8_experts.fc2}) {
    for (const at::Tensor& w : *ws) tp::unregister_main_grad(w);
  }
}

TEST(Fp8GroupedExperts, DimensionsNotDivisibleBy16AreRefusedByFlag) {
  const tp::TensorParallel tp;
  ModelConfig c = experts_config();
  c.moe_ffn_hidden_size = 24;
  auto context = std::make_shared<fp8::Fp8Context>(fp8::options_for(c));
  moe::GroupedExperts experts(PartContext{c, tp, at::kCPU, false, 2, context}, 0, c.num_experts);
  try {
    experts.forward(at::randn({4, 64}), at::tensor(std::vector<int64_t>{1, 1, 1, 1}, at::kLong));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layer 3 experts' linear_fc2: 24 input and 64 output features"), std::string::npos) << what;
    EXPECT_NE(what.find("--moe-ffn-hidden-size"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace megatron
