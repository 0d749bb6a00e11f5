// The MoE layer's CUDA paths against its loop of per-expert GEMMs: the experts as one
// at::_grouped_mm (--moe-grouped-gemm), forward and backward, bf16 and fp32, with experts that
// receive no rows, and its weight gradients added into stacked main_grads in one pass; the
// permutation kernels (--moe-permute-fusion) against their ATen composite; and a whole MoE model
// on the GPU (grouped GEMM, permutation kernels, shared experts overlapped on their own stream)
// against the same model on the CPU. Run on the GPU machine by scripts/gpu/run.sh; without a
// CUDA device they report a skip, never a pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "kernels/moe_ops.h"
#include "model/gpt_model.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"
#include "support/model_configs.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

#define REQUIRE_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device; scripts/gpu/run.sh runs this there"

double relative(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor a64 = a.to(at::kDouble).cpu(), b64 = b.to(at::kDouble).cpu();
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

ModelConfig moe_config(bool grouped) {
  ModelConfig c = test::one_moe_layer(/*hidden=*/256, /*experts=*/8, /*expert_ffn=*/128);
  c.moe_grouped_gemm = grouped;
  return c;
}

class MoeCuda : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(MoeCuda, GroupedGemmMatchesPerExpertGemms) {
  REQUIRE_CUDA();
  const at::ScalarType dtype = GetParam();
  const tp::TensorParallel tp;
  std::vector<std::unique_ptr<moe::GroupedExperts>> experts;
  for (bool grouped : {false, true}) {
    const ModelConfig c = moe_config(grouped);
    const PartContext ctx{c, tp, at::Device(at::kCUDA, 0), false, 0};
    experts.push_back(std::make_unique<moe::GroupedExperts>(ctx, 0, c.num_experts));
  }
  {
    at::NoGradGuard no_grad;
    for (size_t e = 0; e < experts[0]->fc1.size(); ++e) {
      experts[0]->fc1[e].normal_(0, 0.05), experts[0]->fc2[e].normal_(0, 0.05);
      experts[1]->fc1[e].copy_(experts[0]->fc1[e]), experts[1]->fc2[e].copy_(experts[0]->fc2[e]);
    }
  }
  for (auto& m : experts) m->to(dtype);
  {  // the grouped module's weights side by side in one storage, as the gradient buffer lays
     // them out: the grouped GEMM then reads them in place
    at::NoGradGuard no_grad;
    for (std::vector<at::Tensor>* weights : {&experts[1]->fc1, &experts[1]->fc2}) {
      const int64_t n = (*weights)[0].numel();
      at::Tensor storage = at::empty({n * int64_t(weights->size())}, (*weights)[0].options());
      for (size_t e = 0; e < weights->size(); ++e) {
        at::Tensor& w = (*weights)[e];
        storage.narrow(0, int64_t(e) * n, n).copy_(w.reshape({-1}));
        w.set_data(storage.narrow(0, int64_t(e) * n, n).view(w.sizes()));
      }
    }
  }
  const std::vector<int64_t> sizes = {37, 0, 128, 5, 0, 64, 1, 300};  // empty experts too
  const at::Tensor counts = at::tensor(sizes, at::kLong).cuda();
  int64_t rows = 0;
  for (int64_t n : sizes) rows += n;
  const at::Tensor x = at::randn({rows, 256}, at::TensorOptions().device(at::kCUDA).dtype(dtype));
  const at::Tensor grad = at::randn({rows, 256}, x.options());
  std::vector<at::Tensor> outputs, input_grads;
  for (auto& m : experts) {
    at::Tensor in = x.clone().requires_grad_(true);
    at::Tensor y = m->forward(in, counts);
    torch::autograd::backward({y}, {grad});
    outputs.push_back(y.detach());
    input_grads.push_back(in.grad());
  }
  const double tol = dtype == at::kBFloat16 ? 2e-2 : 1e-4;
  EXPECT_LE(relative(outputs[1], outputs[0]), tol);
  EXPECT_LE(relative(input_grads[1], input_grads[0]), tol);
  for (size_t e = 0; e < sizes.size(); ++e) {
    if (sizes[e] == 0) continue;
    EXPECT_LE(relative(experts[1]->fc1[e].grad(), experts[0]->fc1[e].grad()), tol) << "expert " << e;
    EXPECT_LE(relative(experts[1]->fc2[e].grad(), experts[0]->fc2[e].grad()), tol) << "expert " << e;
  }
}

// With gradient-accumulation fusion the grouped GEMM's weight gradients go straight into the
// experts' main_grads, side by side as the gradient buffer lays them out: the step's first
// backward overwrites them, the next adds, and no .grad is left behind.
TEST_P(MoeCuda, GroupedGemmAddsWeightGradientsIntoStackedMainGrads) {
  REQUIRE_CUDA();
  const at::ScalarType dtype = GetParam();
  const ModelConfig c = moe_config(true);
  const tp::TensorParallel tp;
  const PartContext ctx{c, tp, at::Device(at::kCUDA, 0), false, 0};
  moe::GroupedExperts experts(ctx, 0, c.num_experts);
  experts.to(dtype);
  std::vector<at::Tensor> main_grads;
  std::vector<int> adds(size_t(2 * c.num_experts), 0);
  {
    at::NoGradGuard no_grad;
    int slot = 0;
    for (std::vector<at::Tensor>* weights : {&experts.fc1, &experts.fc2}) {
      const int64_t n = (*weights)[0].numel();
      at::Tensor storage = at::empty({n * int64_t(weights->size())}, (*weights)[0].options().dtype(dtype));
      at::Tensor grads = at::full({n * int64_t(weights->size())}, 7.0, storage.options().dtype(at::kFloat));  // stale
      for (size_t e = 0; e < weights->size(); ++e, ++slot) {
        at::Tensor& w = (*weights)[e];
        storage.narrow(0, int64_t(e) * n, n).normal_(0, 0.05);
        w.set_data(storage.narrow(0, int64_t(e) * n, n).view(w.sizes()));
        main_grads.push_back(grads.narrow(0, int64_t(e) * n, n).view(w.sizes()));
        tp::register_main_grad(w, {main_grads.back(), [&adds, slot] { return adds[size_t(slot)] == 0; },
                                   [&adds, slot] { ++adds[size_t(slot)]; }});
      }
    }
  }
  const std::vector<int64_t> sizes = {37, 0, 128, 5, 0, 64, 1, 300};
  int64_t rows = 0;
  for (int64_t n : sizes) rows += n;
  const at::Tensor counts = at::tensor(sizes, at::kLong).cuda();
  const at::Tensor x = at::randn({rows, 256}, at::TensorOptions().device(at::kCUDA).dtype(dtype));
  const at::Tensor grad = at::randn({rows, 256}, x.options());
  // The reference: the same weights as plain leaves, gradients from autograd.
  std::vector<at::Tensor> ref_fc1, ref_fc2;
  for (size_t e = 0; e < experts.fc1.size(); ++e) {
    ref_fc1.push_back(experts.fc1[e].detach().clone().requires_grad_(true));
    ref_fc2.push_back(experts.fc2[e].detach().clone().requires_grad_(true));
  }
  at::Tensor offs = counts.cumsum(0).to(at::kInt);
  {
    std::vector<at::Tensor> outs;
    int64_t begin = 0;
    for (size_t e = 0; e < sizes.size(); ++e) {
      const at::Tensor xe = x.narrow(0, begin, sizes[e]);
      begin += sizes[e];
      const auto gate_up = at::linear(xe, ref_fc1[e]).chunk(2, -1);
      outs.push_back(at::linear(at::silu(gate_up[0]) * gate_up[1], ref_fc2[e]));
    }
    torch::autograd::backward({at::cat(outs)}, {grad});
  }
  const double tol = dtype == at::kBFloat16 ? 2e-2 : 1e-4;
  for (int pass = 1; pass <= 2; ++pass) {  // the second backward adds to the first
    torch::autograd::backward({experts.forward(x, counts)}, {grad});
    for (size_t e = 0; e < sizes.size(); ++e) {
      EXPECT_FALSE(experts.fc1[e].grad().defined()) << "expert " << e << " kept a .grad";
      EXPECT_EQ(adds[e], pass) << "expert " << e;
      if (sizes[e] == 0) {
        EXPECT_EQ(main_grads[e].abs().max().item<double>(), 0.0) << "an expert without rows has zero gradient";
        continue;
      }
      EXPECT_LE(relative(main_grads[e], pass * ref_fc1[e].grad().to(at::kFloat)), tol) << "expert " << e << " pass " << pass;
      EXPECT_LE(relative(main_grads[sizes.size() + e], pass * ref_fc2[e].grad().to(at::kFloat)), tol) << "expert " << e;
    }
  }
  for (auto* weights : {&experts.fc1, &experts.fc2}) {
    for (const auto& w : *weights) tp::unregister_main_grad(w);
  }
}

// The permutation kernels against the ATen composite at the benchmark's size (4096 tokens to
// top-8 of 128 experts, hidden 2048), with pairs held elsewhere and padding rows.
TEST_P(MoeCuda, PermuteKernelsMatchTheComposite) {
  REQUIRE_CUDA();
  if (!kernels::built_with_kernels()) GTEST_SKIP() << "needs the CUDA kernels (a MEGATRON_CUDA build)";
  const at::ScalarType dtype = GetParam();
  const int64_t T = 4096, k = 8, h = 2048;
  const at::TensorOptions gpu = at::TensorOptions().device(at::kCUDA);
  const at::Tensor order = at::randperm(T * k, gpu.dtype(at::kLong));
  const at::Tensor here = order.index_select(0, at::nonzero(order.remainder(5) != 0).reshape({-1}));  // a fifth elsewhere
  const at::Tensor pairs = at::cat({here, at::full({300}, -1, here.options())}).index_select(
      0, at::randperm(here.numel() + 300, here.options()));  // padding rows among them
  at::Tensor slots = at::full({T * k + 1}, -1, pairs.options());
  slots.scatter_(0, at::where(pairs < 0, at::full({}, T * k, pairs.options()), pairs), at::arange(pairs.numel(), pairs.options()));
  slots = slots.narrow(0, 0, T * k).contiguous();
  const at::Tensor tokens = at::randn({T, h}, gpu.dtype(dtype)), rows = at::randn({pairs.numel(), h}, gpu.dtype(dtype));
  const at::Tensor probs = at::rand({T, k}, gpu.dtype(dtype));
  const at::Tensor grad_rows = at::randn_like(rows), grad_out = at::randn_like(tokens);
  std::vector<std::vector<at::Tensor>> results;
  for (kernels::Impl impl : {kernels::Impl::Auto, kernels::Impl::Composite}) {
    const at::Tensor t = tokens.clone().requires_grad_(true), r = rows.clone().requires_grad_(true), p = probs.clone().requires_grad_(true);
    const at::Tensor permuted = kernels::moe_permute(t, pairs, slots, k, impl);
    const at::Tensor combined = kernels::moe_unpermute(r, p, pairs, slots, impl);
    const auto grads = torch::autograd::grad({permuted, combined}, {t, r, p}, {grad_rows, grad_out});
    results.push_back({permuted, combined, grads[0], grads[1], grads[2]});
  }
  const char* names[] = {"permute", "unpermute", "tokens' gradient", "rows' gradient", "probs' gradient"};
  for (size_t i = 0; i < results[0].size(); ++i) {
    // Exact where both copy; sums of up to k products in fp32, rounded once, otherwise.
    EXPECT_LE(relative(results[0][i], results[1][i]), dtype == at::kBFloat16 ? 1e-2 : 1e-5) << names[i];
  }
  EXPECT_TRUE(at::equal(results[0][0], results[1][0])) << "the forward permutation copies rows";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoeCuda, ::testing::Values(at::kFloat, at::kBFloat16));

// A whole MoE model (router, grouped experts, shared experts behind the gate) on the GPU in fp32,
// with the permutation kernels and the shared experts on their own stream, gives the CPU's
// logits and gradients.
TEST(MoeCudaModel, GpuMatchesCpu) {
  REQUIRE_CUDA();
  ModelConfig c = moe_config(true);
  c.num_layers = 2;
  c.moe_layers = {1, 1};
  c.num_attention_heads = 4;
  c.num_query_groups = 4;
  c.kv_channels = 64;
  c.seq_length = 64;
  c.max_position_embeddings = 64;
  c.vocab_size = c.padded_vocab_size = 128;
  c.normalization = "RMSNorm";
  c.position_embedding_type = "rope";
  c.add_bias_linear = false;
  c.hidden_dropout = c.attention_dropout = 0.0;
  c.moe_shared_expert_intermediate_size = 256;
  c.moe_shared_expert_gate = true;
  c.moe_aux_loss_coeff = {1e-2};
  c.moe_z_loss_coeff = 1e-3;
  c.moe_permute_fusion = true;         // kernels on the GPU, the composite on the CPU
  c.moe_shared_expert_overlap = true;  // a side stream on the GPU only
  GPTModel cpu(c), gpu(c);
  cpu.initialize(3);
  gpu.initialize(3);
  gpu.to(at::Device(at::kCUDA, 0));
  const at::Tensor tokens = at::randint(0, 128, {2, 64}, at::kLong);
  const Batch batch{tokens, at::roll(tokens, -1, 1), at::ones({2, 64})};
  const at::Tensor cpu_loss = cpu.loss(batch);
  cpu_loss.backward();
  const Batch on_gpu{batch.tokens.cuda(), batch.labels.cuda(), batch.loss_mask.cuda()};
  const at::Tensor gpu_loss = gpu.loss(on_gpu);
  gpu_loss.backward();
  EXPECT_NEAR(gpu_loss.item<double>(), cpu_loss.item<double>(), 1e-4);
  auto a = cpu.named_parameters(), b = gpu.named_parameters();
  for (const auto& p : a) {
    EXPECT_LE(relative(b[p.key()].grad(), p.value().grad()), 1e-3) << p.key();
  }
}

}  // namespace
}  // namespace megatron
