// `megatron convert --from megatron` on checkpoints megatron-core itself writes in the test
// (tests/checkpoint/make_megatron_checkpoint.py: a tiny Llama-style GPT on CPU, its norms
// randomised so that a norm read wrongly shows): torch_dist saved at TP=1 and at TP=2 (chunks
// along several axes), and legacy model_optim_rng.pt of one and of two tensor-parallel ranks, of
// two pipeline stages, and of two stages with two virtual chunks each. Each
// converts and gives megatron-core's own
// loss on its batch; `megatron train --load --finetune` on the indexed dataset the fixture writes
// starts from megatron-core's loss on the first batch its GPTDataset draws, and trains on.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/megatron_args.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_fixture.h"
#include "core/errors.h"

namespace megatron {
namespace {

class MegatronConvert : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    reference_ = new nlohmann::json(test::make_megatron_fixture(*dir_ / "mcore", "--format both --tp 2 --pp 2 --data"));
    // 4 layers over 2 stages x 2 virtual chunks: one layer per file's chunk.
    chunked_ = new nlohmann::json(test::make_megatron_fixture(*dir_ / "chunked", "--num-layers 4 --pp 2 --vpp 2"));
  }
  void SetUp() override { ASSERT_NE(chunked_, nullptr) << "megatron-core's fixtures were not written"; }
  static void TearDownTestSuite() {
    delete chunked_;
    delete reference_;
    delete dir_;
  }
  static test::CommandResult convert(const std::string& from, const std::string& to) {
    return test::convert_from_megatron(*dir_ / from, *dir_ / to);
  }
  static test::TempDir* dir_;
  static nlohmann::json* reference_;
  static nlohmann::json* chunked_;
};
test::TempDir* MegatronConvert::dir_ = nullptr;
nlohmann::json* MegatronConvert::reference_ = nullptr;
nlohmann::json* MegatronConvert::chunked_ = nullptr;

TEST_F(MegatronConvert, TorchDistGivesMegatronCoresLossAndTrainsOn) {
  {  // What the reader finds.
    const MegatronCheckpoint checkpoint(*dir_ / "mcore/torch_dist");
    EXPECT_EQ(checkpoint.iteration(), 1);
    EXPECT_EQ(checkpoint.args().at("num_layers").as_int(), 2);
    // Stacked layers come out one per layer.
    EXPECT_TRUE(checkpoint.has("decoder.layers.1.self_attention.linear_qkv.weight"));
    EXPECT_FALSE(checkpoint.has("decoder.layers.self_attention.linear_qkv.weight"));
    EXPECT_EQ(checkpoint.tensor("decoder.layers.1.mlp.linear_fc1.weight").sizes().vec(), (std::vector<int64_t>{256, 64}));
    for (const std::string& name : checkpoint.names()) EXPECT_EQ(name.find("_extra_state"), std::string::npos) << name;
    const ModelConfig m = model_config_from_megatron_args(checkpoint.args(), "test");
    EXPECT_EQ(m.num_query_groups, 2);
    EXPECT_EQ(m.normalization, "RMSNorm");
    EXPECT_TRUE(m.swiglu);
    EXPECT_FALSE(m.add_bias_linear);
    EXPECT_EQ(m.padded_vocab_size, 128);
  }
  auto r = convert("mcore/torch_dist", "native");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(Megatron torch_dist, iteration 1)"), std::string::npos) << r.output;
  const double expected = reference_->at("loss").get<double>();
  EXPECT_NEAR(test::converted_loss(*dir_ / "native", *reference_), expected, 1e-5 * expected);

  // The same flags as the megatron-core run, its indexed dataset, split and seed: the sample
  // order is Megatron's, so the first iteration's loss is the one megatron-core computed on the
  // first batch its GPTDataset drew (NullTokenizer: EOD = vocab size = 127; 128 rows padded).
  const std::vector<std::string> shape = {"--num-layers", "2", "--group-query-attention", "--num-query-groups", "2"};
  std::vector<std::string> finetune = shape;
  finetune.push_back("--finetune");
  const auto trained = test::train_from_converted(*dir_ / "native", *dir_ / "mcore", *dir_ / "trained", finetune, 3);
  ASSERT_EQ(trained.run.status, 0) << trained.run.output;
  EXPECT_NE(trained.run.output.find("loaded weights from"), std::string::npos) << trained.run.output;
  ASSERT_EQ(trained.lm_losses.size(), 3u) << trained.run.output;
  const double first = reference_->at("batch_losses")[0].get<double>();
  EXPECT_NEAR(trained.lm_losses[0], first, 1e-5 * first) << "the first loss is not megatron-core's on its first batch";
  for (double loss : trained.lm_losses) EXPECT_TRUE(std::isfinite(loss)) << trained.run.output;

  // Going on with Megatron's run instead: the checkpoint is its iteration 1, which consumed the
  // first batch; iteration 2 here takes the second batch megatron-core's GPTDataset draws.
  EXPECT_NE(r.output.find("--no-load-optim --no-load-rng goes on from iteration 1 (2 samples consumed"), std::string::npos) << r.output;
  std::vector<std::string> go_on = shape;
  for (const char* flag : {"--no-load-optim", "--no-load-rng"}) go_on.push_back(flag);
  const auto resumed = test::train_from_converted(*dir_ / "native", *dir_ / "mcore", *dir_ / "resumed", go_on, 2);
  ASSERT_EQ(resumed.run.status, 0) << resumed.run.output;
  EXPECT_NE(resumed.run.output.find("(iteration 1)"), std::string::npos) << resumed.run.output;
  ASSERT_EQ(resumed.lm_losses.size(), 1u) << resumed.run.output;
  const double second = reference_->at("batch_losses")[1].get<double>();
  EXPECT_NEAR(resumed.lm_losses[0], second, 1e-5 * second) << "iteration 2 did not take megatron-core's second batch";
}

TEST_F(MegatronConvert, TorchDistSavedUnderTensorParallelismIsTheSameModel) {
  // The TP=2 checkpoint holds the TP=1 one's weights, resharded by megatron-core: chunks split
  // along rows, columns and SwiGLU's halves.
  auto r = convert("mcore/tp2/torch_dist", "native_tp2");
  ASSERT_EQ(r.status, 0) << r.output;
  const double expected = reference_->at("loss").get<double>();
  EXPECT_NEAR(test::converted_loss(*dir_ / "native_tp2", *reference_), expected, 1e-5 * expected);
}

TEST_F(MegatronConvert, LegacyCheckpointsOfOneAndTwoTensorParallelRanksGiveTheSameLoss) {
  const double expected = reference_->at("loss").get<double>();
  auto r = convert("mcore/torch", "native_legacy");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(Megatron legacy, iteration 1)"), std::string::npos) << r.output;
  EXPECT_NEAR(test::converted_loss(*dir_ / "native_legacy", *reference_), expected, 1e-5 * expected);
  // mp_rank_00 and mp_rank_01, each its shard (SwiGLU's fc1: that rank's [gate; up] halves).
  auto tp2 = convert("mcore/tp2/torch", "native_legacy_tp2");
  ASSERT_EQ(tp2.status, 0) << tp2.output;
  EXPECT_NEAR(test::converted_loss(*dir_ / "native_legacy_tp2", *reference_), expected, 1e-5 * expected);

  // A directory the saved args do not lay out (no pipeline stages, yet mp_rank_TT_PPP).
  const std::string staged = *dir_ / "staged/iter_0000001";
  std::filesystem::create_directories(staged);
  std::filesystem::copy(*dir_ / "mcore/torch/iter_0000001/mp_rank_00", staged + "/mp_rank_00_000", std::filesystem::copy_options::recursive);
  auto refused = convert("staged/iter_0000001", "refused");
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.output.find("mp_rank_00_000 does not fit the saving run's layout (pipeline parallel 1, expert parallel 1 in its args: "
                                "mp_rank_TT)"),
            std::string::npos)
      << refused.output;
  auto missing = convert("mcore/nothing", "refused");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("no such directory"), std::string::npos) << missing.output;
}

TEST_F(MegatronConvert, LegacyPipelineStagesAndVirtualChunksAreOneModel) {
  // mp_rank_00_000 and _001, each stage's layers numbered from 0 (megatron-core resharding its
  // TP=1 checkpoint into two stages).
  auto r = convert("mcore/pp2/torch", "native_pp2");
  ASSERT_EQ(r.status, 0) << r.output;
  const double expected = reference_->at("loss").get<double>();
  EXPECT_NEAR(test::converted_loss(*dir_ / "native_pp2", *reference_), expected, 1e-5 * expected);
  // Two chunks a stage (model0, model1): layers 0 and 2 on stage 0, 1 and 3 on stage 1.
  const MegatronCheckpoint chunked(*dir_ / "chunked/pp2/torch");
  const MegatronCheckpoint whole(*dir_ / "chunked/torch_dist");
  for (int layer = 0; layer < 4; ++layer) {
    const std::string name = "decoder.layers." + std::to_string(layer) + ".self_attention.linear_qkv.weight";
    EXPECT_TRUE(at::equal(chunked.tensor(name), whole.tensor(name))) << name;
  }
  auto c = convert("chunked/pp2/torch", "native_chunked");
  ASSERT_EQ(c.status, 0) << c.output;
  const double chunked_loss = chunked_->at("loss").get<double>();
  EXPECT_NEAR(test::converted_loss(*dir_ / "native_chunked", *chunked_), chunked_loss, 1e-5 * chunked_loss);

  // A stage's file missing: named.
  const std::string partial = *dir_ / "partial/iter_0000001";
  std::filesystem::create_directories(partial);
  std::filesystem::copy(*dir_ / "mcore/pp2/torch/iter_0000001/mp_rank_00_001", partial + "/mp_rank_00_001",
                        std::filesystem::copy_options::recursive);
  auto missing = convert("partial/iter_0000001", "refused_partial");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("1 mp_rank_* directories, but the run saved 1 tensor-parallel ranks x 2 pipeline stages"), std::string::npos)
      << missing.output;
}

}  // namespace
}  // namespace megatron
