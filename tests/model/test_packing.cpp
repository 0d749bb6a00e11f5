// Sequence packing is exact: two samples packed into one row, with positions restarting per
// sample and a block-diagonal causal mask, get the same per-token losses (and the same gradient
// contributions) as each sample run alone.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "support/model_configs.h"

namespace megatron {
namespace {

ModelConfig tiny_llama() {
  ModelConfig c = test::small_llama({32, 4, 2, 48, 16, 50});
  c.untie_embeddings_and_output_weights = false;  // tied, as before
  return c;
}

TEST(Packing, PackedLossesEqualSeparateLosses) {
  const ModelConfig c = tiny_llama();
  GPTModel model(c);
  model.initialize(21);
  const int64_t la = 9, lb = 7, s = la + lb;
  at::manual_seed(2);
  at::Tensor a = at::randint(0, c.vocab_size, {1, la + 1}), b = at::randint(0, c.vocab_size, {1, lb + 1});

  auto alone = [&](const at::Tensor& text, int64_t len) {
    Batch batch{text.narrow(1, 0, len), text.narrow(1, 1, len), at::ones({1, len})};
    return model.token_losses(batch).view({-1});  // [len]
  };
  at::Tensor loss_a = alone(a, la), loss_b = alone(b, lb);

  Batch packed;
  packed.tokens = at::cat({a.narrow(1, 0, la), b.narrow(1, 0, lb)}, 1);   // [1, s]
  packed.labels = at::cat({a.narrow(1, 1, la), b.narrow(1, 1, lb)}, 1);   // [1, s]
  packed.loss_mask = at::ones({1, s});
  packed.position_ids = at::cat({at::arange(la), at::arange(lb)}).view({1, s});
  at::Tensor mask = at::zeros({1, 1, s, s}, at::kBool);
  mask[0][0].narrow(0, 0, la).narrow(1, 0, la).copy_(at::ones({la, la}, at::kBool).tril());
  mask[0][0].narrow(0, la, lb).narrow(1, la, lb).copy_(at::ones({lb, lb}, at::kBool).tril());
  packed.attention_mask = mask;
  at::Tensor loss_packed = model.token_losses(packed).view({-1});          // [s]

  EXPECT_LE((loss_packed.narrow(0, 0, la) - loss_a).abs().max().item<double>(), 1e-5);
  EXPECT_LE((loss_packed.narrow(0, la, lb) - loss_b).abs().max().item<double>(), 1e-5);

  // The documents as each token's document id, the form make_batch gives: the same losses.
  packed.attention_mask = at::cat({at::zeros({la}, at::kInt), at::ones({lb}, at::kInt)}).view({1, s});
  const at::Tensor loss_ids = model.token_losses(packed).view({-1});
  EXPECT_LE((loss_ids - loss_packed).abs().max().item<double>(), 1e-6);

  // Without the mask the second sample would see the first: the test can tell the difference.
  packed.attention_mask = at::Tensor();
  at::Tensor leaky = model.token_losses(packed).view({-1});
  EXPECT_GT((leaky.narrow(0, la, lb) - loss_b).abs().max().item<double>(), 1e-3);
}

}  // namespace
}  // namespace megatron
