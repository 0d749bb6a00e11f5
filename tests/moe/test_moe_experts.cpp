// The experts' pieces that generation relies on, on the CPU: packing each linear's expert weights
// into one tensor (the grouped GEMM then reads them in place) keeps every parameter's identity and
// value and the model's output; and counting tokens per expert on the device (a scatter-add, not
// at::bincount, which reads its input's range back to the host on CUDA) counts as bincount does.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "model/transformer_layer.h"
#include "moe/counts.h"
#include "moe/moe_layer.h"
#include "support/model_configs.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {
namespace {

ModelConfig two_moe_layers() {
  ModelConfig c = test::one_moe_layer(/*hidden=*/32, /*experts=*/4, /*expert_ffn=*/16);
  c.num_layers = 2;
  c.moe_layers = {1, 1};
  c.num_attention_heads = c.num_query_groups = 4;
  c.kv_channels = 8;
  c.seq_length = c.max_position_embeddings = 16;
  c.vocab_size = c.padded_vocab_size = 64;
  c.normalization = "RMSNorm";
  c.position_embedding_type = "rope";
  c.add_bias_linear = false;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

std::vector<moe::MoELayer*> moe_layers_of(const GPTModel& model) {
  std::vector<moe::MoELayer*> out;
  for (const auto& layer : model.layers) {
    if (auto* moe = dynamic_cast<moe::MoELayer*>(layer->mlp.get())) out.push_back(moe);
  }
  return out;
}

TEST(MoeExperts, PackedWeightsAreViewsOfOneTensorAndChangeNothing) {
  const at::NoGradGuard no_grad;
  GPTModel model(two_moe_layers());
  model.initialize(5);
  model.eval();
  const at::Tensor tokens = at::randint(0, 64, {2, 16}, at::kLong);
  const Batch batch{tokens, at::roll(tokens, -1, 1), at::ones({2, 16})};
  const at::Tensor before = model.loss(batch);
  std::map<std::string, at::Tensor> values;
  for (const auto& p : model.named_parameters()) values[p.key()] = p.value().clone();
  const auto layers = moe_layers_of(model);
  ASSERT_EQ(layers.size(), 2u);
  for (moe::MoELayer* layer : layers) {
    // Each weight allocated on its own: not adjacent, so the grouped GEMM would stack a copy.
    EXPECT_FALSE(tp::stacked_in_place(layer->experts->fc1).defined());
  }
  const at::TensorImpl* first = layers[0]->experts->fc1[0].unsafeGetTensorImpl();
  model.pack_experts();
  for (moe::MoELayer* layer : layers) {
    for (const auto* weights : {&layer->experts->fc1, &layer->experts->fc2}) {
      const at::Tensor stacked = tp::stacked_in_place(*weights);  // [E, out, in] over the parameters' own storage
      ASSERT_TRUE(stacked.defined());
      EXPECT_EQ(stacked.size(0), 4);
      EXPECT_EQ(stacked.data_ptr(), (*weights)[0].data_ptr());
    }
  }
  EXPECT_EQ(layers[0]->experts->fc1[0].unsafeGetTensorImpl(), first) << "the parameter itself, its storage replaced";
  size_t seen = 0;
  for (const auto& p : model.named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), values.at(p.key()))) << p.key();
    ++seen;
  }
  EXPECT_EQ(seen, values.size());
  EXPECT_TRUE(at::equal(model.loss(batch), before));
  model.pack_experts();  // packed already: nothing moves
  EXPECT_EQ(tp::stacked_in_place(layers[0]->experts->fc1).data_ptr(), layers[0]->experts->fc1[0].data_ptr());
}

TEST(MoeExperts, CountsPerValueAreBincounts) {
  const at::Tensor values = at::randint(0, 6, {200}, at::kLong);  // bins 6 and 7 stay empty
  EXPECT_TRUE(at::equal(moe::count_per_value(values, 8), at::bincount(values, {}, 8)));
  EXPECT_TRUE(at::equal(moe::count_per_value(values.view({20, 10}), 8), at::bincount(values, {}, 8))) << "any shape, flattened";
  EXPECT_TRUE(at::equal(moe::count_per_value(at::zeros({0}, at::kLong), 3), at::zeros({3}, at::kLong)));
}

}  // namespace
}  // namespace megatron
