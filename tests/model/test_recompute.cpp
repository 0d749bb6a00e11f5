// Activation recomputation changes what the forward keeps, not what is computed: for every
// --recompute-granularity / --recompute-method the loss, every parameter gradient and the
// generator state afterwards are bitwise those of the run that keeps its activations, with
// dropout on (the backward draws the forward's masks again). The graphs show that the layers'
// activations really are dropped: each recomputed group is one node. For the outputs freed
// until the backward (--recompute-modules layernorm / moe_act) a counting CPU allocator shows
// the bytes the forward leaves behind shrink by exactly those outputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>

#include <c10/core/CPUAllocator.h>

#include "model/gpt_model.h"
#include "support/model_configs.h"

namespace megatron {
namespace {

struct StepResult {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  at::Tensor draw_after;      // the next numbers of the default generators (CPU, then the device's) after the backward
  int64_t graph_nodes = 0;    // autograd nodes reachable from the loss
  int64_t recompute_nodes = 0;
  int64_t live_after_forward = 0;  // CPU bytes the step added by the end of its forward (CountingCpuAllocator)
};

// The CPU allocator, counting the bytes of the blocks it has handed out and not yet had back.
class CountingCpuAllocator final : public at::Allocator {
 public:
  explicit CountingCpuAllocator(at::Allocator* base) : base_(base) {}
  at::DataPtr allocate(size_t n) override {
    at::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    live_ += static_cast<int64_t>(n);
    return {data, new Block{std::move(inner), n, this}, &release, at::Device(at::kCPU)};
  }
  void copy_data(void* dest, const void* src, size_t count) const override { std::memcpy(dest, src, count); }
  int64_t live() const { return live_; }

 private:
  struct Block {
    at::DataPtr inner;
    size_t bytes;
    CountingCpuAllocator* owner;
  };
  static void release(void* context) {
    auto* block = static_cast<Block*>(context);
    block->owner->live_ -= static_cast<int64_t>(block->bytes);
    delete block;
  }
  at::Allocator* base_;
  std::atomic<int64_t> live_{0};
};

// Installs a CountingCpuAllocator for one scope; every CPU tensor made meanwhile is counted.
class CountingScope {
 public:
  CountingScope() : base_(c10::GetCPUAllocator()), counting_(base_) { c10::SetCPUAllocator(&counting_, kPriority); }
  ~CountingScope() { c10::SetCPUAllocator(base_, kPriority); }
  int64_t live() const { return counting_.live(); }

 private:
  static constexpr uint8_t kPriority = 100;  // above the default allocator's
  at::Allocator* base_;
  CountingCpuAllocator counting_;
};

void walk(const std::shared_ptr<torch::autograd::Node>& node, std::set<torch::autograd::Node*>& seen, StepResult& r) {
  if (!node || !seen.insert(node.get()).second) return;
  ++r.graph_nodes;
  if (node->name().find("Recompute") != std::string::npos) ++r.recompute_nodes;
  for (const auto& edge : node->next_edges()) walk(edge.function, seen, r);
}

StepResult train_step(ModelConfig c, const std::string& granularity, const std::string& method = "", int layers = 0,
               at::Device device = at::kCPU, const CountingScope* counting = nullptr) {
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = layers;
  const int64_t live_before = counting ? counting->live() : 0;  // earlier results' tensors stay alive
  GPTModel model(c);
  model.initialize(5);
  model.to(device);
  model.train();
  at::manual_seed(11);
  const at::Tensor text = at::randint(0, c.vocab_size, {2, c.seq_length + 1}).to(device);
  const Batch batch{text.narrow(1, 0, c.seq_length), text.narrow(1, 1, c.seq_length),
                    at::ones({2, c.seq_length}, text.options().dtype(at::kFloat))};
  at::manual_seed(3);  // the dropout masks (CPU and CUDA generators)
  StepResult r;
  r.loss = model.loss(batch);
  if (counting) r.live_after_forward = counting->live() - live_before;
  std::set<torch::autograd::Node*> seen;
  walk(r.loss.grad_fn(), seen, r);
  r.loss.backward();
  for (const auto& p : model.named_parameters()) r.grads[p.key()] = p.value().grad();
  r.draw_after = at::cat({at::rand({4}), at::rand({4}, at::TensorOptions().device(device)).cpu()});
  return r;
}

void expect_same(const StepResult& a, const StepResult& b) {
  EXPECT_TRUE(at::equal(a.loss, b.loss)) << a.loss.item<double>() << " vs " << b.loss.item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, g] : a.grads) {
    ASSERT_TRUE(g.defined()) << name;
    ASSERT_TRUE(b.grads.at(name).defined()) << name;
    EXPECT_TRUE(at::equal(g, b.grads.at(name))) << name << ": max difference "
                                                 << (g - b.grads.at(name)).abs().max().item<double>();
  }
  EXPECT_TRUE(at::equal(a.draw_after, b.draw_after)) << "the generator is not where the plain run left it";
}

ModelConfig four_layers(double hidden_dropout, double attention_dropout) {
  ModelConfig c = test::small_llama({32, 4, 2, 48, 16, 50});
  c.num_layers = 4;
  c.hidden_dropout = hidden_dropout;
  c.attention_dropout = attention_dropout;
  return c;
}

// Hidden dropout off keeps the residual adds fused with the norms (the stream's delta crosses
// the recomputed groups' boundaries); hidden dropout on takes the plain adds.
class Recompute : public ::testing::TestWithParam<double> {};

// Each method's groups, and the recompute nodes they leave in the graph: uniform in groups of
// 1, 3 (then 1) and 4; block on the first 2 layers.
TEST_P(Recompute, FullMatchesKeepingActivations) {
  const ModelConfig c = four_layers(GetParam(), 0.1);
  const StepResult plain = train_step(c, "");
  struct Case {
    const char* method;
    int layers;
    int64_t groups;
  };
  for (const Case& k : {Case{"uniform", 1, 4}, Case{"uniform", 3, 2}, Case{"uniform", 4, 1}, Case{"block", 2, 2}}) {
    SCOPED_TRACE(std::string(k.method) + " " + std::to_string(k.layers));
    const StepResult r = train_step(c, "full", k.method, k.layers);
    expect_same(r, plain);
    EXPECT_EQ(r.recompute_nodes, k.groups);
    EXPECT_LT(r.graph_nodes, plain.graph_nodes);
    // All four layers in one group: their nodes are gone from the graph the forward built.
    if (k.groups == 1) EXPECT_LT(r.graph_nodes * 3, plain.graph_nodes) << r.graph_nodes << " vs " << plain.graph_nodes;
  }
}

TEST_P(Recompute, SelectiveRecomputesCoreAttention) {
  const ModelConfig c = four_layers(GetParam(), 0.1);
  const StepResult plain = train_step(c, "");
  const StepResult selective = train_step(c, "selective");
  expect_same(selective, plain);
  EXPECT_EQ(selective.recompute_nodes, 4);  // one per layer's attention
  EXPECT_EQ(plain.recompute_nodes, 0);
}

// --recompute-modules layernorm: each layer's two norm outputs (what the attention's and the
// MLP's first linear layers keep) are freed after the forward, [s, b, h] fp32 each, and made
// again in the backward: the same loss and gradients bit for bit. Without hidden dropout the
// norms are the fused add + RMSNorm kernels' (recomputed by the plain norm of the kept sum).
TEST_P(Recompute, SelectiveLayernormFreesTheNormOutputsUntilTheBackward) {
  ModelConfig c = four_layers(GetParam(), 0.1);
  CountingScope counting;
  train_step(c, "", "", 0, at::kCPU, &counting);  // first-use caches (RoPE tables, ...) made before measuring
  const StepResult plain = train_step(c, "", "", 0, at::kCPU, &counting);
  c.recompute_modules = {"layernorm"};
  const StepResult freed = train_step(c, "selective", "", 0, at::kCPU, &counting);
  expect_same(freed, plain);
  const int64_t norm_output = int64_t(c.seq_length) * 2 * c.hidden_size * 4;  // [s, b, h] fp32
  EXPECT_EQ(plain.live_after_forward - freed.live_after_forward, 2 * c.num_layers * norm_output);
  // With core attention recomputed too: the same outputs freed, the same numbers.
  c.recompute_modules = {"core_attn", "layernorm"};
  expect_same(train_step(c, "selective"), plain);
}

INSTANTIATE_TEST_SUITE_P(HiddenDropout, Recompute, ::testing::Values(0.0, 0.1));

// --recompute-modules moe_act: the routed experts' SwiGLU outputs (what fc2 keeps) are freed
// after the forward, [tokens x topk, f] fp32 per MoE layer, and made again from fc1's outputs
// in the backward; with layernorm too, both sets are gone. Loss and gradients bit for bit.
TEST(RecomputeModules, MoeActFreesTheExpertActivationsUntilTheBackward) {
  ModelConfig c = four_layers(0.0, 0.0);
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layers = {0, 1, 1, 1};
  c.moe_shared_expert_intermediate_size = 16;
  CountingScope counting;
  train_step(c, "", "", 0, at::kCPU, &counting);  // first-use caches made before measuring
  const StepResult plain = train_step(c, "", "", 0, at::kCPU, &counting);
  c.recompute_modules = {"moe_act"};
  const StepResult freed = train_step(c, "selective", "", 0, at::kCPU, &counting);
  expect_same(freed, plain);
  const int64_t activations = int64_t(c.seq_length) * 2 * c.moe_router_topk * c.moe_ffn_hidden_size * 4;  // per MoE layer
  EXPECT_EQ(plain.live_after_forward - freed.live_after_forward, 3 * activations);
  c.recompute_modules = {"moe_act", "layernorm"};
  const StepResult both = train_step(c, "selective", "", 0, at::kCPU, &counting);
  expect_same(both, plain);
  const int64_t norm_output = int64_t(c.seq_length) * 2 * c.hidden_size * 4;
  EXPECT_EQ(plain.live_after_forward - both.live_after_forward, 3 * activations + 2 * c.num_layers * norm_output);
}

// On CUDA the dropout masks come from the CUDA generator, whose state the recomputation puts
// back too. The attention kernels' backward may accumulate in a different order from run to
// run, so gradients are held to 1e-5 relative; a wrong mask would be off by far more.
TEST(RecomputeCuda, FullAndSelectiveWithDropoutMatchKeepingActivations) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  const ModelConfig c = four_layers(0.1, 0.1);
  const StepResult plain = train_step(c, "", "", 0, at::kCUDA);
  for (const StepResult& r : {train_step(c, "full", "uniform", 1, at::kCUDA), train_step(c, "selective", "", 0, at::kCUDA)}) {
    EXPECT_TRUE(at::equal(r.loss, plain.loss));
    for (const auto& [name, g] : plain.grads) {
      const double scale = std::max(g.abs().max().item<double>(), 1e-12);
      EXPECT_LE((r.grads.at(name) - g).abs().max().item<double>() / scale, 1e-5) << name;
    }
    EXPECT_TRUE(at::equal(r.draw_after, plain.draw_after));
    EXPECT_GT(r.recompute_nodes, 0);
  }
}

// On CUDA: layernorm freed from the fused add + RMSNorm kernels, moe_act from the grouped GEMMs'
// SwiGLU; the losses equal and the gradients as close as the attention backward's own run-to-run
// differences allow (a wrongly restored output would be off by far more).
TEST(RecomputeCuda, LayernormAndMoeActMatchKeepingActivations) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  ModelConfig c = four_layers(0.0, 0.0);
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  c.moe_layers = {0, 1, 1, 1};
  c.moe_grouped_gemm = true;
  const StepResult plain = train_step(c, "", "", 0, at::kCUDA);
  c.recompute_modules = {"layernorm", "moe_act"};
  const StepResult r = train_step(c, "selective", "", 0, at::kCUDA);
  EXPECT_TRUE(at::equal(r.loss, plain.loss));
  for (const auto& [name, g] : plain.grads) {
    const double scale = std::max(g.abs().max().item<double>(), 1e-12);
    EXPECT_LE((r.grads.at(name) - g).abs().max().item<double>() / scale, 1e-5) << name;
  }
}

// Evaluation builds no graph, so nothing is recomputed and the result is the plain forward's.
TEST(RecomputeEval, NoGradForwardIsThePlainForward) {
  ModelConfig c = four_layers(0.0, 0.0);
  GPTModel plain(c);
  c.recompute_granularity = "full";
  c.recompute_method = "uniform";
  c.recompute_num_layers = 2;
  GPTModel recomputed(c);
  plain.initialize(5);
  recomputed.initialize(5);
  const at::Tensor text = at::randint(0, c.vocab_size, {2, c.seq_length + 1});
  const Batch batch{text.narrow(1, 0, c.seq_length), text.narrow(1, 1, c.seq_length), at::ones({2, c.seq_length})};
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(plain.loss(batch), recomputed.loss(batch)));
}

}  // namespace
}  // namespace megatron
