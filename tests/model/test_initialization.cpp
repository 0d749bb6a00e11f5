// Initialisation: every parameter draws from a generator of its own (seeded from the run's seed
// and its name), so a pipeline chunk holding some layers gets exactly the values the whole model
// has for them, without drawing the rest; Megatron's scales; different parameters and seeds
// give different values.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "model/gpt_model.h"
#include "support/model_configs.h"

namespace megatron {
namespace {

std::map<std::string, at::Tensor> parameters(const GPTModel& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value();
  return out;
}

ModelConfig four_layers() {
  ModelConfig c = test::small_llama({64, 4, 2, 96, 16, 128});
  c.num_layers = 4;
  return c;
}

TEST(Initialization, AChunkGetsTheWholeModelsValues) {
  const ModelConfig c = four_layers();
  GPTModel whole(c);
  whole.initialize(9);
  GPTModel last_stage(c, {}, pipeline::ChunkLayers{2, 2, false, true});  // layers 2-3 and the head
  GPTModel first_stage(c, {}, pipeline::ChunkLayers{0, 2, true, false});
  initialize_chunks({&first_stage}, 9);
  initialize_chunks({&last_stage}, 9);
  const auto all = parameters(whole);
  size_t compared = 0;
  for (const GPTModel* stage : {&first_stage, &last_stage}) {
    for (const auto& [name, value] : parameters(*stage)) {
      ASSERT_TRUE(all.count(name)) << name;
      EXPECT_TRUE(at::equal(value, all.at(name))) << name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, all.size());
}

TEST(Initialization, MegatronScalesAndDistinctStreams) {
  ModelConfig c = four_layers();
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.kv_channels = 64;
  c.ffn_hidden_size = 512;
  GPTModel model(c);
  model.initialize(9);
  const auto p = parameters(model);
  const double std = c.init_method_std, residual_std = std / std::sqrt(2.0 * c.num_layers);
  EXPECT_NEAR(p.at("decoder.layers.0.mlp.linear_fc1.weight").std().item<double>(), std, 0.02 * std);
  EXPECT_NEAR(p.at("decoder.layers.0.mlp.linear_fc2.weight").std().item<double>(), residual_std, 0.02 * residual_std);
  EXPECT_NEAR(p.at("decoder.layers.3.self_attention.linear_proj.weight").std().item<double>(), residual_std, 0.03 * residual_std);
  EXPECT_TRUE(at::equal(p.at("decoder.final_layernorm.weight"), at::ones({c.hidden_size})));
  // Same shapes, different names: unrelated draws.
  const at::Tensor a = p.at("decoder.layers.0.mlp.linear_fc1.weight"), b = p.at("decoder.layers.1.mlp.linear_fc1.weight");
  EXPECT_LT(std::abs((a * b).mean().item<double>()) / (std * std), 0.05);
  GPTModel reseeded(c);
  reseeded.initialize(10);
  EXPECT_FALSE(at::equal(parameters(reseeded).at("decoder.layers.0.mlp.linear_fc1.weight"), a));
}

}  // namespace
}  // namespace megatron
