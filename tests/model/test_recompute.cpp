// Activation recomputation changes what the forward keeps, not what is computed: for every
// --recompute-granularity / --recompute-method the loss, every parameter gradient and the
// generator state afterwards are bitwise those of the run that keeps its activations, with
// dropout on (the backward draws the forward's masks again). The graphs show that the layers'
// activations really are dropped: each recomputed group is one node.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <map>
#include <set>

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
};

void walk(const std::shared_ptr<torch::autograd::Node>& node, std::set<torch::autograd::Node*>& seen, StepResult& r) {
  if (!node || !seen.insert(node.get()).second) return;
  ++r.graph_nodes;
  if (node->name().find("Recompute") != std::string::npos) ++r.recompute_nodes;
  for (const auto& edge : node->next_edges()) walk(edge.function, seen, r);
}

StepResult train_step(ModelConfig c, const std::string& granularity, const std::string& method = "", int layers = 0,
               at::Device device = at::kCPU) {
  c.recompute_granularity = granularity;
  c.recompute_method = method;
  c.recompute_num_layers = layers;
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

INSTANTIATE_TEST_SUITE_P(HiddenDropout, Recompute, ::testing::Values(0.0, 0.1));

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
