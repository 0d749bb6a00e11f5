// The whole model's gradients against central finite differences on a tiny fp64 model:
// backward through embedding, every layer, the tied output layer and the cross entropy.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/gpt_model.h"

namespace megatron {
namespace {

ModelConfig tiny(bool tied, const std::string& norm, bool swiglu, const std::string& pos) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 24;
  c.seq_length = 6;
  c.max_position_embeddings = 8;
  c.vocab_size = c.padded_vocab_size = 20;
  c.normalization = norm;
  c.swiglu = swiglu;
  c.add_bias_linear = !swiglu;
  c.position_embedding_type = pos;
  c.untie_embeddings_and_output_weights = !tied;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

void check_gradients(const ModelConfig& c) {
  GPTModel model(c);
  model.initialize(3);
  model.to(at::kDouble);
  {
    at::NoGradGuard g;  // non-trivial norms and biases so their gradients are exercised
    for (auto& p : model.parameters()) {
      if (p.dim() == 1) p.add_(at::randn_like(p) * 0.1);
    }
  }
  at::manual_seed(5);
  Batch batch{at::randint(0, c.vocab_size, {2, c.seq_length}), at::randint(0, c.vocab_size, {2, c.seq_length}),
              at::ones({2, c.seq_length}, at::kDouble)};
  batch.loss_mask[0][1].fill_(0);  // masked tokens must not contribute
  model.loss(batch).backward();

  at::NoGradGuard no_grad;
  const double eps = 1e-6;
  int checked = 0;
  for (auto& item : model.named_parameters()) {
    at::Tensor p = item.value();
    at::Tensor flat = p.view({-1});
    at::Tensor grad = p.grad().view({-1});
    // A few entries of every parameter, spread over it.
    for (int64_t k : {int64_t(0), flat.numel() / 2, flat.numel() - 1}) {
      const double saved = flat[k].item<double>();
      flat[k].fill_(saved + eps);
      const double up = model.loss(batch).item<double>();
      flat[k].fill_(saved - eps);
      const double down = model.loss(batch).item<double>();
      flat[k].fill_(saved);
      const double numeric = (up - down) / (2 * eps);
      const double analytic = grad[k].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << item.key() << "[" << k << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

TEST(ModelFiniteDifferences, LlamaStyleUntied) { check_gradients(tiny(false, "RMSNorm", true, "rope")); }
TEST(ModelFiniteDifferences, GptStyleTiedLayerNormGeluLearnedPositions) {
  check_gradients(tiny(true, "LayerNorm", false, "learned_absolute"));
}

}  // namespace
}  // namespace megatron
