// `megatron convert --from megatron` on mixture-of-experts checkpoints megatron-core itself writes
// (make_megatron_checkpoint.py --moe: 3 layers, the middle one dense, 4 experts routed 2 per token
// by sigmoid scores with a random expert bias and a scaling factor, a gated shared expert):
// torch_dist (per-layer keys, experts stacked on an axis of their own) and legacy files, each as
// one process saved them and as two expert-parallel ranks did; and one with every layer MoE
// (stacked over layers and experts). Every one converts and gives megatron-core's own loss;
// training from it starts at megatron-core's first-batch loss.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/megatron_args.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/megatron_fixture.h"
#include "core/errors.h"

namespace megatron {
namespace {

class MegatronConvertMoe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    reference_ = new nlohmann::json(test::make_megatron_fixture(*dir_ / "mcore", "--moe --format both --ep 2 --data"));
    every_layer_ = new nlohmann::json(test::make_megatron_fixture(*dir_ / "every_layer", "--moe --moe-every-layer --format torch_dist"));
  }
  void SetUp() override { ASSERT_NE(every_layer_, nullptr) << "megatron-core's fixtures were not written"; }
  static void TearDownTestSuite() {
    delete every_layer_;
    delete reference_;
    delete dir_;
  }
  // Converts `from` (under the fixture) into `to` and checks the loss is megatron-core's.
  static void expect_megatron_loss(const std::string& from, const std::string& to, std::vector<std::string> extra = {},
                                   const nlohmann::json* reference = reference_) {
    auto r = test::convert_from_megatron(*dir_ / from, *dir_ / to, extra);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("4 experts"), std::string::npos) << r.output;
    const double expected = reference->at("loss").get<double>();
    EXPECT_NEAR(test::converted_loss(*dir_ / to, *reference), expected, 1e-5 * expected) << from;
  }
  static test::TempDir* dir_;
  static nlohmann::json* reference_;    // mcore/: layers MoE, dense, MoE
  static nlohmann::json* every_layer_;  // every_layer/: all three MoE
};
test::TempDir* MegatronConvertMoe::dir_ = nullptr;
nlohmann::json* MegatronConvertMoe::reference_ = nullptr;
nlohmann::json* MegatronConvertMoe::every_layer_ = nullptr;

TEST_F(MegatronConvertMoe, ReadsTheExpertsAndTheRoutingFromTheCheckpoint) {
  const MegatronCheckpoint checkpoint(*dir_ / "mcore/torch_dist");
  // The experts' stack comes out one tensor per expert, under the global index; only MoE layers
  // have routers.
  EXPECT_TRUE(checkpoint.has("decoder.layers.2.mlp.experts.linear_fc1.weight3"));
  EXPECT_FALSE(checkpoint.has("decoder.layers.2.mlp.experts.experts.linear_fc1.weight"));
  EXPECT_FALSE(checkpoint.has("decoder.layers.1.mlp.router.weight"));
  EXPECT_EQ(checkpoint.tensor("decoder.layers.2.mlp.experts.linear_fc1.weight3").sizes().vec(), (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(checkpoint.tensor("decoder.layers.0.mlp.experts.linear_fc2.weight1").sizes().vec(), (std::vector<int64_t>{64, 32}));
  // Expert-parallel ranks saved apart hold the same global experts.
  const MegatronCheckpoint split(*dir_ / "mcore/ep2/torch");
  EXPECT_TRUE(at::equal(split.tensor("decoder.layers.2.mlp.experts.linear_fc1.weight3"),
                        checkpoint.tensor("decoder.layers.2.mlp.experts.linear_fc1.weight3")));
  EXPECT_FALSE(split.has("decoder.layers.2.mlp.experts.local_experts.1.linear_fc1.weight"));
  const at::Tensor bias = checkpoint.tensor("decoder.layers.0.mlp.router.expert_bias");
  EXPECT_GT(bias.abs().max().item<double>(), 0.0) << "the fixture's expert bias should not be zero";

  const ModelConfig m = model_config_from_megatron_args(checkpoint.args(), "test");
  EXPECT_EQ(m.num_experts, 4);
  EXPECT_EQ(m.moe_layers, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m.moe_ffn_hidden_size, 32);
  EXPECT_EQ(m.moe_router_topk, 2);
  EXPECT_EQ(m.moe_router_score_function, "sigmoid");
  EXPECT_TRUE(m.moe_router_enable_expert_bias);
  EXPECT_DOUBLE_EQ(m.moe_router_topk_scaling_factor, 2.5);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 48);
  EXPECT_TRUE(m.moe_shared_expert_gate);
  EXPECT_EQ(m.moe_router_load_balancing_type, (std::vector<std::string>{"seq_aux_loss"}));
  EXPECT_EQ(m.moe_aux_loss_coeff, (std::vector<double>{1e-3}));
  EXPECT_EQ(m.moe_router_dtype, "fp32");
}

TEST_F(MegatronConvertMoe, TorchDistGivesMegatronCoresLossAndTrainsOn) {
  expect_megatron_loss("mcore/torch_dist", "native");
  // Our own expert-parallel split of it is the same model.
  expect_megatron_loss("mcore/torch_dist", "native_ep2", {"--target-expert-parallel-size", "2"});
  EXPECT_TRUE(std::filesystem::exists(latest_checkpoint_directory(*dir_ / "native_ep2") + "/model_tp00_pp000_ep001.safetensors"));

  // The MoE flags of the megatron-core run and its data: the first loss is megatron-core's on
  // the first batch its GPTDataset drew (NullTokenizer: EOD = vocab size = 127).
  std::vector<std::string> flags = {"--finetune", "--num-layers", "3", "--group-query-attention", "--num-query-groups", "2"};
  for (const std::string& flag : test::fixture_moe_flags()) flags.push_back(flag);
  const auto trained = test::train_from_converted(*dir_ / "native", *dir_ / "mcore", *dir_ / "trained", flags, 2);
  ASSERT_EQ(trained.run.status, 0) << trained.run.output;
  ASSERT_EQ(trained.lm_losses.size(), 2u) << trained.run.output;
  const double first = reference_->at("batch_losses")[0].get<double>();
  EXPECT_NEAR(trained.lm_losses[0], first, 1e-5 * first) << "the first loss is not megatron-core's on its first batch";
  EXPECT_TRUE(std::isfinite(trained.lm_losses[1])) << trained.run.output;
}

TEST_F(MegatronConvertMoe, EveryLayerMoeIsStackedOverLayersAndExperts) {
  // Homogeneous layers (Mixtral, Qwen-MoE): one stored tensor per parameter, [L, E, ...].
  const MegatronCheckpoint checkpoint(*dir_ / "every_layer/torch_dist");
  EXPECT_TRUE(checkpoint.has("decoder.layers.1.mlp.experts.linear_fc2.weight2"));
  EXPECT_TRUE(checkpoint.has("decoder.layers.2.mlp.shared_experts.gate_weight"));
  EXPECT_EQ(checkpoint.tensor("decoder.layers.1.mlp.experts.linear_fc2.weight2").sizes().vec(), (std::vector<int64_t>{64, 32}));
  EXPECT_FALSE(at::equal(checkpoint.tensor("decoder.layers.1.mlp.experts.linear_fc2.weight2"),
                         checkpoint.tensor("decoder.layers.2.mlp.experts.linear_fc2.weight1")));
  expect_megatron_loss("every_layer/torch_dist", "native_every_layer", {}, every_layer_);
}

TEST_F(MegatronConvertMoe, LegacyAndExpertParallelSavesAreTheSameModel) {
  expect_megatron_loss("mcore/torch", "native_legacy");  // SequentialMLP's local_experts.<i>
  expect_megatron_loss("mcore/ep2/torch_dist", "native_dist_ep2");  // each rank's chunks of the expert axis
  expect_megatron_loss("mcore/ep2/torch", "native_legacy_ep2");  // mp_rank_00_000 and _001, local indices

  // A file of the expert-parallel pair missing, and a legacy MoE checkpoint under TP (not read):
  // named errors.
  const std::string partial = *dir_ / "partial/iter_0000001";
  std::filesystem::create_directories(partial);
  std::filesystem::copy(*dir_ / "mcore/ep2/torch/iter_0000001/mp_rank_00_000", partial + "/mp_rank_00_000",
                        std::filesystem::copy_options::recursive);
  auto missing = test::convert_from_megatron(partial, *dir_ / "refused");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.output.find("1 mp_rank_* directories, but the run saved 1 tensor-parallel ranks x 2 expert-parallel ranks"),
            std::string::npos)
      << missing.output;
}

pickle::ValuePtr pickled_int(int64_t v) {
  auto out = std::make_shared<pickle::Value>();
  out->kind = pickle::Value::Kind::Int;
  out->integer = v;
  return out;
}

pickle::ValuePtr pickled_list(const std::vector<int64_t>& values) {
  auto out = std::make_shared<pickle::Value>();
  out->kind = pickle::Value::Kind::List;
  for (int64_t v : values) out->items.push_back(pickled_int(v));
  return out;
}

// A run's args as a checkpoint pickles them: a 3-layer MoE model's, and `extra`.
pickle::Value megatron_args(const std::vector<std::pair<std::string, pickle::ValuePtr>>& extra) {
  pickle::Value args;
  args.kind = pickle::Value::Kind::Dict;
  auto set = [&](const std::string& key, pickle::ValuePtr v) {
    auto name = std::make_shared<pickle::Value>();
    name->kind = pickle::Value::Kind::String;
    name->text = key;
    args.entries.emplace_back(name, std::move(v));
  };
  for (auto [key, v] : {std::pair<const char*, int64_t>{"num_layers", 3}, {"hidden_size", 64}, {"num_attention_heads", 4},
                        {"padded_vocab_size", 128}, {"num_experts", 4}}) {
    set(key, pickled_int(v));
  }
  for (const auto& [key, v] : extra) set(key, v);
  return args;
}

std::string config_error(const pickle::Value& args) {
  try {
    model_config_from_megatron_args(args, "ckpt");
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(MegatronArgs, MoeArgumentsInEitherOfMegatronsFormsOrNamedErrors) {
  // Megatron-LM's two forms of --moe-layer-freq: every N-th layer, or one 0/1 per layer.
  EXPECT_EQ(model_config_from_megatron_args(megatron_args({{"moe_layer_freq", pickled_int(2)}}), "ckpt").moe_layers,
            (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(model_config_from_megatron_args(megatron_args({{"moe_layer_freq", pickled_list({0, 1, 1})}}), "ckpt").moe_layers,
            (std::vector<int>{0, 1, 1}));
  // One coefficient for several balancing types applies to each.
  auto types = std::make_shared<pickle::Value>();
  types->kind = pickle::Value::Kind::List;
  for (const char* type : {"aux_loss", "seq_aux_loss"}) {
    auto item = std::make_shared<pickle::Value>();
    item->kind = pickle::Value::Kind::String;
    item->text = type;
    types->items.push_back(item);
  }
  const ModelConfig two = model_config_from_megatron_args(megatron_args({{"moe_router_load_balancing_type", types},
                                                                         {"moe_aux_loss_coeff", pickled_int(1)}}), "ckpt");
  EXPECT_EQ(two.moe_aux_loss_coeff, (std::vector<double>{1.0, 1.0}));

  const std::string short_freq = config_error(megatron_args({{"moe_layer_freq", pickled_list({1, 0})}}));
  EXPECT_NE(short_freq.find("ckpt: the checkpoint's args: --moe-layer-freq '[1,0]' gives 2 layers"), std::string::npos) << short_freq;
  const std::string bad_type = config_error(megatron_args({{"moe_router_load_balancing_type", pickled_list({3})}}));
  EXPECT_NE(bad_type.find("ckpt: the checkpoint's args hold 'moe_router_load_balancing_type' as"), std::string::npos) << bad_type;
  const std::string coeffs = config_error(megatron_args({{"moe_aux_loss_coeff", pickled_list({1, 2})}}));
  EXPECT_NE(coeffs.find("2 moe_aux_loss_coeff values for 1 moe_router_load_balancing_type entries"), std::string::npos) << coeffs;
  const std::string topk = config_error(megatron_args({{"moe_router_topk", pickled_list({2})}}));
  EXPECT_NE(topk.find("'moe_router_topk' as"), std::string::npos) << topk;
  const std::string mtp = config_error(megatron_args({{"mtp_num_layers", pickled_list({1})}}));
  EXPECT_NE(mtp.find("ckpt: the checkpoint's args hold 'mtp_num_layers' as"), std::string::npos) << mtp;
}

}  // namespace
}  // namespace megatron
