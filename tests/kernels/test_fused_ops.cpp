// The fused operations' autograd functions against the plain ATen code they replace, on CPU
// (where they run their composite fallback): forward values and every input gradient. The CUDA
// kernels are checked against these same fallbacks in test_fused_kernels_cuda.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "kernels/ops.h"
#include "model/gpt_model.h"
#include "model/rope.h"
#include "support/model_configs.h"
#include "tensor_parallel/cross_entropy.h"

namespace megatron {
namespace {

ModelConfig rope_config(double rotary_percent) {
  ModelConfig c;
  c.kv_channels = 16;
  c.rotary_percent = rotary_percent;
  c.seq_length = 32;
  return c;
}

double max_difference(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Queries as the attention layer sees them: a strided view into a wider QKV-like tensor.
at::Tensor strided_queries(int64_t s, int64_t b, int64_t n, int64_t d) {
  at::Tensor qkv = at::randn({s, b, n, d + 8}, at::kDouble);
  return qkv.narrow(-1, 0, d);  // [s, b, n, d], last dim contiguous, others strided
}

void check_rope(double rotary_percent, bool per_sample_positions) {
  at::manual_seed(1);
  const ModelConfig c = rope_config(rotary_percent);
  RopeTables tables = make_rope_tables(c, 40, at::kCPU);  // more rows than the sequence
  const int64_t s = 24, b = 3;
  if (per_sample_positions) tables = gather_rope_tables(tables, at::randint(0, 40, {b, s}));
  at::Tensor x_fused = strided_queries(s, b, 4, 16).requires_grad_(true);
  at::Tensor x_plain = x_fused.detach().clone().requires_grad_(true);
  at::Tensor y_fused = kernels::rope(x_fused, tables.cos, tables.sin);
  at::Tensor y_plain = apply_rope(x_plain, {tables.cos.to(at::kDouble), tables.sin.to(at::kDouble)});
  EXPECT_LT(max_difference(y_fused, y_plain), 1e-6);  // fp32 tables vs the same tables in fp64
  at::Tensor grad = at::randn_like(y_plain);
  y_fused.backward(grad);
  y_plain.backward(grad);
  EXPECT_LT(max_difference(x_fused.grad(), x_plain.grad()), 1e-6);
  EXPECT_GT(max_difference(x_fused.grad(), grad), 1e-2);  // the rotation did something
}

TEST(FusedOps, RopeMatchesApplyRope) { check_rope(1.0, false); }

TEST(FusedOps, RopeReadsGroupedQueriesInPlace) {
  // The attention layer's queries: per query group, 3 query heads then k and v, in one QKV row.
  at::manual_seed(2);
  RopeTables tables = make_rope_tables(rope_config(1.0), 32, at::kCPU);
  const int64_t s = 20, b = 2, groups = 2, per_group = 3, d = 16;
  at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * d}, at::kDouble).requires_grad_(true);
  at::Tensor q = qkv.narrow(-1, 0, per_group * d).view({s, b, groups, per_group, d});
  at::Tensor y = kernels::rope(q, tables.cos, tables.sin);
  at::Tensor y_plain = apply_rope(q.reshape({s, b, groups * per_group, d}),
                                  {tables.cos.to(at::kDouble), tables.sin.to(at::kDouble)});
  ASSERT_EQ(y.sizes(), y_plain.sizes());
  EXPECT_LT(max_difference(y, y_plain), 1e-6);
  at::Tensor grad = at::randn_like(y);
  const at::Tensor grad_fused = torch::autograd::grad({y}, {qkv}, {grad})[0];
  const at::Tensor grad_plain = torch::autograd::grad({y_plain}, {qkv}, {grad})[0];
  EXPECT_LT(max_difference(grad_fused, grad_plain), 1e-6);
}
TEST(FusedOps, RopePartialRotaryAndPerSamplePositions) { check_rope(0.5, true); }

// The attention layer's split: q and k rotated, v as it is, each gradient landing in its place
// of the QKV output's gradient (the parts no output reached stay zero).
TEST(FusedOps, SplitQkvRopeMatchesSplitThenApplyRope) {
  at::manual_seed(4);
  RopeTables tables = make_rope_tables(rope_config(1.0), 32, at::kCPU);
  const int64_t s = 20, b = 2, groups = 2, per_group = 3, d = 16;
  at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * d}, at::kDouble).requires_grad_(true);
  const kernels::QkvRope fused = kernels::split_qkv_rope(qkv, per_group, tables.cos, tables.sin);
  const RopeTables fp64{tables.cos.to(at::kDouble), tables.sin.to(at::kDouble)};
  auto parts = qkv.split_with_sizes({per_group * d, d, d}, -1);
  const at::Tensor q = apply_rope(parts[0].reshape({s, b, groups * per_group, d}), fp64);
  const at::Tensor k = apply_rope(parts[1], fp64);
  ASSERT_EQ(fused.q.sizes(), q.sizes());
  ASSERT_EQ(fused.k.sizes(), k.sizes());
  EXPECT_LT(max_difference(fused.q, q), 1e-6);
  EXPECT_LT(max_difference(fused.k, k), 1e-6);
  EXPECT_TRUE(at::equal(fused.v, parts[2]));
  EXPECT_FALSE(fused.v.is_alias_of(qkv)) << "v is copied, so the QKV output is not kept for backward";
  for (int without : {-1, 0, 1, 2}) {  // every gradient, then each one missing in turn
    std::vector<at::Tensor> outputs_fused, outputs_plain, grads;
    const std::vector<at::Tensor> fused_out = {fused.q, fused.k, fused.v}, plain_out = {q, k, parts[2]};
    for (int i = 0; i < 3; ++i) {
      if (i == without) continue;
      outputs_fused.push_back(fused_out[size_t(i)]);
      outputs_plain.push_back(plain_out[size_t(i)]);
      grads.push_back(at::randn_like(plain_out[size_t(i)]));
    }
    const at::Tensor grad_fused = torch::autograd::grad(outputs_fused, {qkv}, grads, /*retain_graph=*/true)[0];
    const at::Tensor grad_plain = torch::autograd::grad(outputs_plain, {qkv}, grads, /*retain_graph=*/true)[0];
    EXPECT_LT(max_difference(grad_fused, grad_plain), 1e-6) << "without output " << without;
  }
}

// Off the GPU argmax_rows is ATen's argmax (ties to the lower index); rows of no values are refused.
TEST(FusedOps, ArgmaxRowsIsAtenArgmaxOffTheGpu) {
  const at::Tensor x = at::tensor({1.0f, 3.0f, 3.0f, -2.0f, 0.5f, 0.5f}).view({2, 3});
  EXPECT_TRUE(at::equal(kernels::argmax_rows(x), at::tensor({1, 1}, at::kLong)));
  EXPECT_THROW(kernels::argmax_rows(at::zeros({2, 0})), c10::Error);
  EXPECT_THROW(kernels::argmax_rows(at::zeros({6})), c10::Error);
}

TEST(FusedOps, SwigluMatchesSiluTimesUp) {
  at::manual_seed(2);
  at::Tensor h_fused = at::randn({5, 3, 2 * 12}, at::kDouble).requires_grad_(true);
  at::Tensor h_plain = h_fused.detach().clone().requires_grad_(true);
  at::Tensor y_fused = kernels::swiglu(h_fused);
  auto gate_up = h_plain.chunk(2, -1);
  at::Tensor y_plain = at::silu(gate_up[0]) * gate_up[1];
  EXPECT_LT(max_difference(y_fused, y_plain), 1e-12);
  at::Tensor grad = at::randn_like(y_plain);
  y_fused.backward(grad);
  y_plain.backward(grad);
  EXPECT_LT(max_difference(h_fused.grad(), h_plain.grad()), 1e-12);
}

TEST(FusedOps, CrossEntropyMatchesAten) {
  at::manual_seed(3);
  const int64_t s = 7, b = 3, vocab = 50;
  at::Tensor logits_fused = (4 * at::randn({s, b, vocab})).requires_grad_(true);
  at::Tensor logits_plain = logits_fused.detach().clone().requires_grad_(true);
  at::Tensor targets = at::randint(0, vocab, {s, b});
  at::Tensor loss_fused = tp::fused_vocab_parallel_cross_entropy(logits_fused, targets, dist::Group());  // [s, b]
  at::Tensor loss_plain = at::cross_entropy_loss(logits_plain.view({s * b, vocab}), targets.view({s * b}), {},
                                                 at::Reduction::None).view({s, b});
  EXPECT_LT(max_difference(loss_fused, loss_plain), 1e-5);
  at::Tensor grad = at::rand({s, b});
  loss_fused.backward(grad);
  loss_plain.backward(grad);
  EXPECT_LT(max_difference(logits_fused.grad(), logits_plain.grad()), 1e-6);
}

TEST(FusedOps, CrossEntropyStatsOfAVocabularySlice) {
  // A rank holding ids [100, 150): targets outside the slice contribute no target logit and
  // get no one-hot term in the gradient.
  at::manual_seed(4);
  at::Tensor logits = at::randn({6, 50});
  at::Tensor targets = at::tensor({100L, 149L, 3L, 150L, 120L, 99L});
  kernels::CrossEntropyStats st = kernels::cross_entropy_stats(logits, targets, 100);
  EXPECT_LT(max_difference(st.max, std::get<0>(logits.max(-1))), 1e-7);
  EXPECT_LT(max_difference(st.sum_exp, (logits - st.max.unsqueeze(-1)).exp().sum(-1)), 1e-5);
  at::Tensor expected_target = at::tensor({logits[0][0].item<float>(), logits[1][49].item<float>(), 0.f, 0.f,
                                           logits[4][20].item<float>(), 0.f});
  EXPECT_LT(max_difference(st.target_logit, expected_target), 1e-7);
  at::Tensor grad = kernels::cross_entropy_backward(logits, targets, st.max, st.sum_exp, at::ones({6}), 100);
  at::Tensor softmax = at::softmax(logits, -1);
  EXPECT_NEAR(grad[2].sum().item<double>(), 1.0, 1e-5);  // no target here: the softmax alone
  EXPECT_NEAR(grad[0].sum().item<double>(), 0.0, 1e-5);  // softmax minus the one-hot
  EXPECT_NEAR(grad[4][20].item<double>(), softmax[4][20].item<double>() - 1.0, 1e-6);
}

ModelConfig tiny_llama(bool fused) {
  ModelConfig c = test::small_llama({64, 4, 2, 96, 32, 128});
  c.rotary_percent = 0.5;
  c.apply_rope_fusion = c.bias_swiglu_fusion = c.cross_entropy_loss_fusion = c.bias_dropout_fusion = fused;
  return c;
}

// The CPU AdamW step (kernels/adamw_cpu.cpp, the CUDA kernel's arithmetic in one pass) against
// ATen's fused AdamW (the Composite path): fp32 and bf16 moments, fp32 masters that are the model
// or write a bf16 / fp16 copy, remainder masters, a clipped step and a skipped one.
TEST(FusedOps, CpuAdamWMatchesAtenFusedAdamW) {
  struct Case {
    at::ScalarType moments, model;
    bool remainder;
  };
  for (const Case& c : {Case{at::kFloat, at::kFloat, false}, Case{at::kBFloat16, at::kBFloat16, false},
                        Case{at::kFloat, at::kHalf, false}, Case{at::kBFloat16, at::kBFloat16, true}}) {
    SCOPED_TRACE(std::string(c10::toString(c.moments)) + " moments, " + c10::toString(c.model) + (c.remainder ? " remainders" : ""));
    const int64_t n = 100003;  // past several threads' ranges, and not a multiple of anything
    at::manual_seed(5);
    const at::Tensor start = at::randn({n});
    struct State {
      at::Tensor master, m, v, model;
    };
    auto make = [&] {
      State s;
      s.model = c.model == at::kFloat ? start.clone() : start.to(c.model);
      s.master = c.model == at::kFloat ? s.model : c.remainder ? at::zeros({n}, at::kShort) : s.model.to(at::kFloat);
      s.m = at::zeros({n}, c.moments);
      s.v = at::zeros({n}, c.moments);
      return s;
    };
    State ours = make(), ref = make();
    at::Tensor step = at::zeros({});
    for (int k = 1; k <= 4; ++k) {
      const at::Tensor grad = at::randn({n});
      const at::Tensor scale = at::full({}, k == 2 ? 7.5 : 1.0);   // step 2 is clipped
      const at::Tensor found_inf = at::full({}, k == 3 ? 1.0 : 0.0);  // step 3 is skipped
      if (k != 3) step.add_(1);
      const at::Tensor lr = at::full({}, 1e-3 * k, at::kDouble);
      const kernels::AdamWStepScalars scalars = kernels::adamw_step_scalars(step, scale, found_inf, lr, 0.9, 0.95);
      const kernels::AdamWHyperparameters h{0.9, 0.95, 1e-8, k == 4 ? 0.0 : 0.1};
      kernels::adamw_step(ours.master, ours.m, ours.v, grad, ours.model, h, scalars);
      kernels::adamw_step(ref.master, ref.m, ref.v, grad, ref.model, h, scalars, kernels::Impl::Composite);
    }
    const at::Tensor got = c.remainder ? kernels::join_master(ours.model, ours.master) : ours.master;
    const at::Tensor want = c.remainder ? kernels::join_master(ref.model, ref.master) : ref.master;
    // bf16 moments: an fp32 moment a bit apart may round to the neighbouring bf16 value, which
    // moves that step by one part in 256 of lr-sized updates.
    EXPECT_LE(max_difference(got, want), c.moments == at::kFloat ? 1e-6 : 1e-4) << "masters";
    EXPECT_GT(max_difference(got, start), 1e-3) << "the steps moved the weights";
    EXPECT_LE(max_difference(ours.m.to(at::kFloat), ref.m.to(at::kFloat)), 1e-2 * ref.m.abs().max().item<double>());
    EXPECT_LE(max_difference(ours.v.to(at::kFloat), ref.v.to(at::kFloat)), 1e-2 * ref.v.abs().max().item<double>());
    EXPECT_LE(max_difference(ours.model.to(at::kFloat), ref.model.to(at::kFloat)), c.model == at::kFloat ? 1e-6 : 1e-2);
  }
}

TEST(FusedOps, ModelWithEveryFusionMatchesTheUnfusedModel) {
  GPTModel fused(tiny_llama(true)), plain(tiny_llama(false));
  fused.initialize(5);
  plain.initialize(5);
  // Norm weights that differ from 1 and from each other, so a fused path reading the wrong norm
  // weight shows.
  at::manual_seed(4);
  auto plain_params = plain.named_parameters();
  for (auto& p : fused.named_parameters()) {
    if (p.key().find("norm") == std::string::npos) continue;
    at::NoGradGuard no_grad;
    p.value().copy_(1 + 0.3 * at::randn(p.value().sizes()));
    plain_params[p.key()].copy_(p.value());
  }
  at::manual_seed(6);
  Batch batch{at::randint(0, 128, {2, 32}), at::randint(0, 128, {2, 32}), at::ones({2, 32})};
  at::Tensor loss_fused = fused.loss(batch), loss_plain = plain.loss(batch);
  EXPECT_NEAR(loss_fused.item<double>(), loss_plain.item<double>(), 1e-5);
  loss_fused.backward();
  loss_plain.backward();
  auto pf = fused.named_parameters(), pp = plain.named_parameters();
  ASSERT_EQ(pf.size(), pp.size());
  for (size_t i = 0; i < pf.size(); ++i) {
    const at::Tensor& a = pf[i].value().grad();
    const at::Tensor& b = pp[i].value().grad();
    EXPECT_LT(max_difference(a, b) / b.abs().max().item<double>(), 1e-4) << pf[i].key();
  }
}

}  // namespace
}  // namespace megatron
