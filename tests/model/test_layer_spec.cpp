// Layer specs and self-describing parameters: a feed-forward of the test's own (a non-gated GELU
// MLP with its own widths and init rules) plugs into the model through a spec, and everything
// that shards, initialises, buffers or reshards parameters learns what they are from the
// descriptions its parts registered, not from their names; the spec's choice of where the norms
// live changes the names only, not the numbers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model/mlp.h"
#include "optim/grad_buffer.h"
#include "support/model_configs.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace {

// A non-gated GELU MLP h -> 3h -> h whose two weights are bare parameters with descriptions
// written by hand (no tensor-parallel layer in between), under names that match nothing the
// rest of the system knows (`mlp.expand.weight3`, `mlp.expand.weight4`).
// tests/custom_family/main.cpp builds the same shape from the TP layers, for parallel runs.
class HandDescribedMlp : public FeedForward {
 public:
  explicit HandDescribedMlp(const PartContext& ctx) {
    const int64_t h = ctx.config.hidden_size;
    norm_ = register_module("norm", std::make_shared<NormModule>(ctx.config, ctx.tp, ctx.device));
    expand = register_module("expand", std::make_shared<tp::DescribedModule>());
    tp::ParamInfo column;
    column.split = {0, false};
    w1 = expand->add_parameter("weight3", at::empty({3 * h / ctx.tp.size(), h}, at::TensorOptions().device(ctx.device)), column);
    tp::ParamInfo row;
    row.split = {1, false};
    row.init = tp::Init::ScaledNormal;
    w2 = expand->add_parameter("weight4", at::empty({h, 3 * h / ctx.tp.size()}, at::TensorOptions().device(ctx.device)), row);
  }
  std::optional<NormParams> fused_norm() const override { return norm_->params(); }
  at::Tensor forward(const at::Tensor& normed) override { return at::linear(at::gelu(at::linear(normed, w1)), w2); }

  std::shared_ptr<tp::DescribedModule> expand;
  at::Tensor w1, w2;  // [3h, h], [h, 3h]

 private:
  std::shared_ptr<NormModule> norm_;  // the pre-MLP norm lives in this part
};

LayerSpec wide_mlp_spec(const ModelConfig& c) {
  LayerSpec spec = gpt_layer_spec(c);
  spec.feed_forward = [](const PartContext& ctx) { return std::make_shared<HandDescribedMlp>(ctx); };
  return spec;
}

ModelConfig config() {
  ModelConfig c = test::small_llama({.hidden = 32, .heads = 4, .groups = 2, .ffn = 64, .seq = 8, .vocab = 64});
  c.num_layers = 3;
  return c;
}

TEST(LayerSpec, CustomFeedForwardIsDescribedInitialisedAndTrained) {
  const ModelConfig c = config();
  GPTModel model(c, {}, std::nullopt, wide_mlp_spec(c));
  const tp::ParamTable& table = model.parameter_table();
  const std::string w1 = "decoder.layers.1.mlp.expand.weight3", w2 = "decoder.layers.1.mlp.expand.weight4";
  ASSERT_TRUE(table.contains(w1));
  EXPECT_EQ(table.at(w1).split.dim, 0);
  EXPECT_EQ(table.at(w2).split.dim, 1);
  EXPECT_EQ(table.at("decoder.layers.1.mlp.norm.weight").init, tp::Init::Ones);
  EXPECT_FALSE(table.contains("decoder.layers.1.mlp.linear_fc1.weight"));

  model.initialize(5);
  auto* mlp = dynamic_cast<HandDescribedMlp*>(model.layers[1]->mlp.get());
  ASSERT_NE(mlp, nullptr);
  // Each weight drawn with the std its part declared: 0.02, and 0.02 / sqrt(2 * 3) into the stream.
  EXPECT_NEAR(mlp->w1.std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(mlp->w2.std().item<double>(), 0.02 / std::sqrt(6.0), 0.0008);
  EXPECT_TRUE(at::equal(model.layers[1]->pre_mlp_norm().weight, at::ones({c.hidden_size})));
  EXPECT_EQ(model.num_parameters(), [&] {
    int64_t n = 0;
    for (const auto& p : model.parameters()) n += p.numel();
    return n;
  }());

  // Gradients land in the buffer, and a few steps of plain SGD lower the loss.
  std::vector<NamedTensor> named;
  for (const auto& item : model.named_parameters()) named.push_back({item.key(), item.value(), 0, table.at(item.key())});
  ParamAndGradBuffer buffer(named, dist::ParallelState::single(), GradBufferOptions{});
  at::manual_seed(3);
  Batch batch{at::randint(0, 64, {2, 8}), at::randint(0, 64, {2, 8}), at::ones({2, 8}), {}, {}};
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    buffer.zero_grad();
    at::Tensor loss = model.loss(batch);
    loss.backward();
    buffer.finish_grad_sync();
    (step == 0 ? first : last) = loss.item<double>();
    at::NoGradGuard no_grad;
    for (auto& p : buffer.params()) {
      if (p.has_grad) at::Tensor(p.param).sub_(p.main_grad.to(p.param.scalar_type()) * 0.5);
    }
  }
  EXPECT_LT(last, first);
  const BufferedParam* expand = nullptr;
  for (const auto& p : buffer.params()) if (p.name == w1) expand = &p;
  ASSERT_NE(expand, nullptr);
  EXPECT_FALSE(expand->tp_duplicate);  // split over TP: counted on every rank in the grad norm
}

TEST(LayerSpec, DescribingOnTheMetaDeviceAllocatesNothing) {
  const ModelConfig c = config();
  GPTModel meta(c, {}, std::nullopt, wide_mlp_spec(c), at::kMeta);
  for (const auto& p : meta.parameters()) EXPECT_TRUE(p.is_meta());
  GPTModel real(c, {}, std::nullopt, wide_mlp_spec(c));
  EXPECT_EQ(meta.parameter_table().names(), real.parameter_table().names());
  // describe_model: the default spec's parameters in registration order, the embedding first.
  const tp::ParamTable whole = describe_model(c);
  EXPECT_EQ(whole.names().front(), "embedding.word_embeddings.weight");
  EXPECT_TRUE(whole.at("embedding.word_embeddings.weight").vocab_rows);
  EXPECT_TRUE(whole.at("embedding.word_embeddings.weight").word_embedding);
  EXPECT_TRUE(whole.at("decoder.layers.0.mlp.linear_fc1.weight").split.gated);
  EXPECT_EQ(whole.at("decoder.layers.0.self_attention.linear_proj.weight").init, tp::Init::ScaledNormal);
}

TEST(LayerSpec, AParameterWithoutDescriptionIsRefused) {
  tp::DescribedModule m;
  m.register_parameter("undescribed", at::zeros({2}));
  EXPECT_THROW(tp::describe_parameters(m), c10::Error);
}

// The spec that keeps the norms as modules of the layer (input_layernorm, pre_mlp_layernorm)
// computes what the fused-into-linear layout computes; only the names differ.
TEST(LayerSpec, NormsOutsideTheLinearsComputeTheSame) {
  ModelConfig c = config();
  for (const bool fused_add_norm : {true, false}) {
    c.bias_dropout_fusion = fused_add_norm;
    GPTModel fused(c);
    fused.initialize(9);
    LayerSpec separate = gpt_layer_spec(c);
    separate.norms_in_linears = false;
    GPTModel plain(c, {}, std::nullopt, separate);
    auto source = fused.named_parameters();
    at::NoGradGuard no_grad;
    for (auto& item : plain.named_parameters()) {
      std::string name = item.key();
      for (const auto& [from, to] : {std::pair<std::string, std::string>{"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"},
                                     {"pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"}}) {
        const size_t at = name.find(from);
        if (at != std::string::npos) name = name.substr(0, at) + to;
      }
      ASSERT_NE(source.find(name), nullptr) << item.key();
      item.value().copy_(*source.find(name));
    }
    EXPECT_TRUE(plain.parameter_table().contains("decoder.layers.0.input_layernorm.weight"));
    const at::Tensor tokens = at::randint(0, 64, {2, 8});
    EXPECT_TRUE(at::allclose(plain.forward(tokens), fused.forward(tokens), 1e-6, 1e-6)) << "fused add+norm " << fused_add_norm;
  }
}

}  // namespace
}  // namespace megatron
