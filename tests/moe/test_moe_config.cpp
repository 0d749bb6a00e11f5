// --moe-layer-freq in both of Megatron's forms, and the MoE flags read together.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "moe/moe_config.h"

namespace megatron {
namespace {

TEST(MoeConfig, LayerFreqReadsBothForms) {
  EXPECT_EQ(moe::parse_moe_layer_freq("1", 3), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(moe::parse_moe_layer_freq("2", 5), (std::vector<int>{1, 0, 1, 0, 1}));
  EXPECT_EQ(moe::parse_moe_layer_freq("[1,0,1]", 3), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(moe::parse_moe_layer_freq("([0]*1+[1]*3)", 4), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(moe::parse_moe_layer_freq(" [0] * 2 + ([1, 0] * 2) ", 6), (std::vector<int>{0, 0, 1, 0, 1, 0}));
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"0", "must be at least 1"},
           {"[1,2,1,1]", "entries must be 0 (dense) or 1 (MoE)"},
           {"[1]*3", "gives 3 layers, the model has --num-layers 4"},
           {"[1,0", "missing ']'"},
           {"{1}", "expected a list"}}) {
    try {
      moe::parse_moe_layer_freq(text, 4);
      ADD_FAILURE() << "accepted " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--moe-layer-freq"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(MoeConfig, DenseModelsRefuseExpertParallelism) {
  ModelConfig m;
  m.num_layers = 2;
  ParallelConfig p;
  p.expert_model_parallel_size = 2;
  EXPECT_THROW(moe::finalize_moe_config(m, p, 2), UserError);
  p.expert_model_parallel_size = 1;
  moe::finalize_moe_config(m, p, 2);
  EXPECT_TRUE(m.moe_layers.empty());
  EXPECT_EQ(m.num_moe_layers(), 0);
  EXPECT_EQ(p.expert_tensor_parallel_size, 1);
}

TEST(MoeConfig, ExpertLayoutChecks) {
  ModelConfig m;
  m.num_layers = 4;
  m.ffn_hidden_size = 64;
  m.swiglu = true;
  m.num_experts = 8;
  m.moe_layer_freq = "2";
  ParallelConfig p;
  p.expert_model_parallel_size = 4;
  moe::finalize_moe_config(m, p, 4);
  EXPECT_EQ(m.num_moe_layers(), 2);
  EXPECT_EQ(m.moe_ffn_hidden_size, 64);  // defaults to --ffn-hidden-size
  auto error_of = [&](ModelConfig model, ParallelConfig parallel, int world) {
    try {
      moe::finalize_moe_config(model, parallel, world);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  p.expert_tensor_parallel_size = 0;  // finalize filled it in; each case below starts unset
  ParallelConfig tp2 = p;
  tp2.expert_model_parallel_size = 1;
  tp2.tensor_model_parallel_size = 2;
  EXPECT_NE(error_of(m, tp2, 2).find("needs --sequence-parallel"), std::string::npos);
  ParallelConfig ep3 = p;
  ep3.expert_model_parallel_size = 3;
  EXPECT_NE(error_of(m, ep3, 3).find("does not divide --num-experts 8"), std::string::npos);
  EXPECT_NE(error_of(m, p, 2).find("--expert-model-parallel-size 4: expert TP 1 x EP 4 must divide the 2 ranks of a pipeline stage"),
            std::string::npos);
  // Expert TP apart from TP: 1 under TP=2 (EP spans the TP ranks), or 2 without TP.
  ParallelConfig etp = tp2;
  etp.sequence_parallel = true;
  etp.expert_tensor_parallel_size = 1;
  etp.expert_model_parallel_size = 2;
  EXPECT_EQ(error_of(m, etp, 2), "");
  ParallelConfig etp2 = p;
  etp2.expert_model_parallel_size = 1;
  etp2.expert_tensor_parallel_size = 2;
  EXPECT_EQ(error_of(m, etp2, 2), "");
  etp2.expert_tensor_parallel_size = 4;
  EXPECT_NE(error_of(m, etp2, 2).find("--expert-tensor-parallel-size 4: expert TP 4 x EP 1 must divide the 2 ranks"),
            std::string::npos);
  etp2.expert_tensor_parallel_size = 3;
  EXPECT_NE(error_of(m, etp2, 3).find("--moe-ffn-hidden-size 64 is not divisible by the expert tensor-parallel size 3"),
            std::string::npos);
}

}  // namespace
}  // namespace megatron
