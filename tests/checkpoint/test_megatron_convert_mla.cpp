// `megatron convert --from megatron` on a DeepSeek-V3-shaped checkpoint megatron-core itself writes
// (make_megatron_checkpoint.py --moe --mla --mtp: multi-latent attention with a query latent, the
// latents' norms randomised, YaRN stretching the context 4x with mscale_all_dim, the MoE layers of
// test_megatron_convert_moe.cpp, and one multi-token prediction depth): torch_dist and legacy
// convert and give megatron-core's own loss and MTP loss, and training from it starts at
// megatron-core's first-batch loss.
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint/megatron_args.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_fixture.h"

namespace megatron {
namespace {

class MegatronConvertMla : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    reference_ = new nlohmann::json(test::make_megatron_fixture(*dir_ / "mcore", "--moe --mla --mtp --format both --data"));
  }
  void SetUp() override { ASSERT_NE(reference_, nullptr) << "megatron-core's fixture was not written"; }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }
  static test::TempDir* dir_;
  static nlohmann::json* reference_;
};
test::TempDir* MegatronConvertMla::dir_ = nullptr;
nlohmann::json* MegatronConvertMla::reference_ = nullptr;

TEST_F(MegatronConvertMla, TorchDistAndLegacyGiveMegatronCoresLossAndTrainOn) {
  {
    const MegatronCheckpoint checkpoint(*dir_ / "mcore/torch_dist");
    const ModelConfig m = model_config_from_megatron_args(checkpoint.args(), "test");
    EXPECT_TRUE(m.multi_latent_attention);
    EXPECT_EQ(m.q_lora_rank, 32);
    EXPECT_EQ(m.kv_lora_rank, 16);
    EXPECT_EQ(m.qk_head_dim, 16);
    EXPECT_EQ(m.qk_pos_emb_head_dim, 8);
    EXPECT_EQ(m.v_head_dim, 16);
    EXPECT_EQ(m.rope_type, "yarn");
    EXPECT_DOUBLE_EQ(m.rotary_scaling_factor, 4.0);
    EXPECT_DOUBLE_EQ(m.mscale_all_dim, 1.0);
    EXPECT_EQ(m.mtp_num_layers, 1);
    EXPECT_TRUE(checkpoint.has("mtp.layers.0.transformer_layer.mlp.experts.linear_fc1.weight3"));
    // The local spec's latent norms are modules of their own.
    EXPECT_TRUE(checkpoint.has("decoder.layers.0.self_attention.q_layernorm.weight"));
    EXPECT_EQ(megatron_source_name(checkpoint, "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight"),
              "decoder.layers.0.self_attention.kv_layernorm.weight");
  }
  const double expected = reference_->at("loss").get<double>();
  for (const char* format : {"torch_dist", "torch"}) {
    const std::string native = *dir_ / (std::string("native_") + format);
    auto r = test::convert_from_megatron(*dir_ / (std::string("mcore/") + format), native);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NEAR(test::converted_loss(native, *reference_), expected, 1e-5 * expected) << format;
    const double mtp = reference_->at("mtp_loss").get<double>();
    EXPECT_NEAR(test::converted_mtp_loss(native, *reference_), mtp, 1e-5 * mtp) << format;
  }

  std::vector<std::string> flags = {"--finetune", "--num-layers", "3", "--multi-latent-attention", "--qk-layernorm", "--q-lora-rank", "32",
                                    "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16",
                                    "--rope-type", "yarn", "--rotary-scaling-factor", "4", "--mscale", "1", "--mscale-all-dim", "1",
                                    "--mtp-num-layers", "1"};
  for (const std::string& flag : test::fixture_moe_flags()) flags.push_back(flag);
  const auto trained = test::train_from_converted(*dir_ / "native_torch_dist", *dir_ / "mcore", *dir_ / "trained", flags, 2);
  ASSERT_EQ(trained.run.status, 0) << trained.run.output;
  ASSERT_EQ(trained.lm_losses.size(), 2u) << trained.run.output;
  const double first = reference_->at("batch_losses")[0].get<double>();
  EXPECT_NEAR(trained.lm_losses[0], first, 1e-5 * first) << "the first loss is not megatron-core's on its first batch";
  EXPECT_TRUE(std::isfinite(trained.lm_losses[1])) << trained.run.output;
}

}  // namespace
}  // namespace megatron
