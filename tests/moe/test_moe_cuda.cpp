// The MoE layer's CUDA paths against its loop of per-expert GEMMs: the experts as one
// at::_grouped_mm (--moe-grouped-gemm), forward and backward, bf16 and fp32, with experts that
// receive no rows; and a whole MoE layer on the GPU against the same layer on the CPU. Run on the
// GPU machine by scripts/gpu/run.sh; without a CUDA device they report a skip, never a pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "model/gpt_model.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"

namespace megatron {
namespace {

#define REQUIRE_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device; scripts/gpu/run.sh runs this there"

double relative(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor a64 = a.to(at::kDouble).cpu(), b64 = b.to(at::kDouble).cpu();
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

ModelConfig moe_config(bool grouped) {
  ModelConfig c;
  c.hidden_size = 256;
  c.ffn_hidden_size = 512;
  c.num_layers = 1;
  c.swiglu = true;
  c.num_experts = 8;
  c.moe_ffn_hidden_size = 128;
  c.moe_router_topk = 2;
  c.moe_layers = {1};
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

INSTANTIATE_TEST_SUITE_P(Dtypes, MoeCuda, ::testing::Values(at::kFloat, at::kBFloat16));

// A whole MoE model (router, grouped experts, shared experts behind the gate) on the GPU in fp32
// gives the CPU's logits and gradients.
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
  c.moe_aux_loss_coeff = 1e-2;
  c.moe_z_loss_coeff = 1e-3;
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
