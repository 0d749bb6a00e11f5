// MoE models against Hugging Face transformers. For random-weight Mixtral, Qwen2-MoE (shared
// experts, pre-softmax routing) and Qwen3-MoE (a dense layer among MoE layers, renormalised top-k)
// built by tests/fixtures/make_hf_model.py with clear routing margins:
//  - `convert` to a native checkpoint gives HF's logits (1e-4) and loss (1e-5) (the --load-hf
//    path is tests/model/test_hf_parity.cpp);
//  - HF -> native (TP=2 x EP=2 x PP=2, each EP rank's experts in files of their own) -> HF is
//    bitwise, config.json included;
//  - `train --load-hf` at EP=2 gives the single process's loss, and --save-hf gathers every
//    expert back bit for bit;
//  - a model trained from flags exports a directory transformers runs to our logits.
// And config.json fields we cannot honour are errors naming the field.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/files.h"
#include "model/gpt_model.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

using test::expect_bitwise_equal;
using test::make_hf_model;

class MoeHf : public ::testing::TestWithParam<std::string> {};

TEST_P(MoeHf, ConvertedCheckpointMatchesTransformers) {
  test::TempDir dir;
  make_hf_model(dir / "hf", GetParam());
  auto r = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save", dir / "native",
                               "--make-vocab-size-divisible-by", "32"});
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string iter = latest_checkpoint_directory(dir / "native");
  ModelConfig config = model_config_from_hf(dir / "hf");
  config.padded_vocab_size = 96;
  GPTModel model(config);
  load_model_weights(iter, model);
  model.eval();
  test::expect_model_matches_reference(model, dir / "hf/reference.safetensors");
}

TEST_P(MoeHf, RoundTripThroughTensorExpertPipelineParallelIsBitwise) {
  for (bool bf16 : {false, true}) {
    test::TempDir dir;
    make_hf_model(dir / "hf", GetParam(), bf16);
    auto to_native = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save",
                                         dir / "native", "--target-tensor-parallel-size", "2",
                                         "--target-pipeline-parallel-size", "2", "--target-expert-parallel-size", "2"});
    ASSERT_EQ(to_native.status, 0) << to_native.output;
    {  // stage 1, TP rank 1: its dense tensors in one file, each EP rank's experts in another
      SafetensorsFile dense(dir / "native/iter_0000000/model_tp01_pp001.safetensors");
      SafetensorsFile ep1(dir / "native/iter_0000000/model_tp01_pp001_ep001.safetensors");
      EXPECT_TRUE(dense.contains("decoder.final_layernorm.weight"));
      EXPECT_EQ(dense.contains("decoder.layers.1.mlp.router.weight"), GetParam() != "qwen3_moe");  // qwen3_moe: layer 1 dense
      for (const auto& name : dense.names()) EXPECT_EQ(name.find(".experts."), std::string::npos) << name;
      if (GetParam() != "qwen3_moe") {
        EXPECT_TRUE(ep1.contains("decoder.layers.1.mlp.experts.linear_fc1.weight2"));
        EXPECT_TRUE(ep1.contains("decoder.layers.1.mlp.experts.linear_fc2.weight3"));
        EXPECT_FALSE(ep1.contains("decoder.layers.1.mlp.experts.linear_fc1.weight0"));
      }
    }
    auto to_hf = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "native", "--save",
                                     dir / "back", "--max-shard-size", "60KB"});
    ASSERT_EQ(to_hf.status, 0) << to_hf.output;
    expect_bitwise_equal(dir / "hf", dir / "back");
    EXPECT_EQ(read_file(dir / "hf/config.json"), read_file(dir / "back/config.json"));
  }
}

// The last "lm loss" in a run's log.
double last_loss(const std::string& output) {
  const std::vector<double> losses = test::logged_losses(output);
  return losses.empty() ? -1.0 : losses.back();
}

TEST_P(MoeHf, LoadHfAtExpertParallelTwoIsTheSameModel) {
  test::TempDir dir;
  make_hf_model(dir / "hf", GetParam());
  auto args = [&](const std::string& out) {
    return std::vector<std::string>{"train", "--load-hf", dir / "hf", "--seq-length", "16", "--micro-batch-size", "1",
                                    "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0",
                                    "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "90",
                                    // The same padded vocabulary (its zero logits count in the loss) at TP 1 and 2.
                                    "--make-vocab-size-divisible-by", "64",
                                    "--log-interval", "1", "--eval-interval", "0", "--device", "cpu", "--cpu-threads", "1",
                                    "--save-hf", out};
  };
  auto single = test::run_megatron(args(dir / "single"));
  ASSERT_EQ(single.status, 0) << single.output;
  std::vector<std::string> ep = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  for (const auto& a : args(dir / "ep2")) ep.push_back(a);
  for (const auto& a : {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}) ep.push_back(a);
  auto parallel = test::run_megatron(ep);
  ASSERT_EQ(parallel.status, 0) << parallel.output;
  // config.json gives the architecture; how the run dispatches stays the flags' choice.
  EXPECT_NE(parallel.output.find("alltoall dispatcher"), std::string::npos) << parallel.output;
  EXPECT_NEAR(last_loss(parallel.output), last_loss(single.output), 1e-5 * last_loss(single.output)) << parallel.output;
  expect_bitwise_equal(dir / "hf", dir / "ep2");  // every expert gathered back from its EP rank
  EXPECT_EQ(read_file(dir / "hf/config.json"), read_file(dir / "ep2/config.json"));
  if (GetParam() != "mixtral") return;
  // Expert TP 1 under TP=2 + SP: the dense tensors split over TP, the experts whole on their EP
  // rank (EP spanning the TP ranks); loaded, trained and exported the same.
  std::vector<std::string> etp = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  for (const auto& a : args(dir / "etp1")) etp.push_back(a);
  for (const auto& a : {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                        "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}) {
    etp.push_back(a);
  }
  auto split = test::run_megatron(etp);
  ASSERT_EQ(split.status, 0) << split.output;
  EXPECT_NE(split.output.find("experts: expert tensor 1 x expert parallel 2 x expert data 1"), std::string::npos) << split.output;
  EXPECT_NEAR(last_loss(split.output), last_loss(single.output), 1e-5 * last_loss(single.output)) << split.output;
  expect_bitwise_equal(dir / "hf", dir / "etp1");
}

// A model trained from flags (no HF config.json to copy) exports a directory transformers loads
// and runs to our logits: config.json written from the architecture, weights through the table.
TEST_P(MoeHf, SaveHfFromFlagsRunsInTransformers) {
  test::TempDir dir;
  std::vector<std::string> args = {"train", "--model-family", GetParam(), "--num-layers", "2", "--hidden-size", "64",
                                   "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "96",
                                   "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                   "--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "1",
                                   "--train-iters", "3", "--lr", "1e-2", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                   "--vocab-size", "127", "--eval-interval", "0", "--device", "cpu", "--cpu-threads", "1",
                                   "--save", dir / "ckpt", "--save-interval", "3", "--save-hf", dir / "out"};
  if (GetParam() == "qwen2_moe") {
    for (const auto& a : {"--moe-shared-expert-intermediate-size", "48"}) args.push_back(a);
  }
  if (GetParam() == "qwen3_moe") {
    for (const auto& a : {"--moe-layer-freq", "[1,0]"}) args.push_back(a);  // layer 1 dense: mlp_only_layers
  }
  auto r = test::run_megatron(args);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string iter = latest_checkpoint_directory(dir / "ckpt");
  const ModelConfig config = model_config_from_json(read_checkpoint_state(iter).at("model_config"));
  GPTModel model(config);
  load_model_weights(iter, model);
  model.eval();
  const at::Tensor ids = at::randint(0, 128, {2, 16}, at::kLong);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = model.forward(ids).transpose(0, 1).narrow(-1, 0, 128).contiguous();  // [b, s, V_hf]
  }
  save_safetensors(dir / "reference.safetensors", {{"input_ids", ids}, {"logits", logits}}, {});
  auto run = test::run_command(test::shell_quote(test::venv_python()) + " " +
                               test::shell_quote(test::source_dir() + "/tests/fixtures/hf_logits.py") + " " +
                               test::shell_quote(dir / "out") + " " + test::shell_quote(dir / "reference.safetensors"));
  ASSERT_EQ(run.status, 0) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.output, m, std::regex(R"(max_abs_diff ([0-9.eE+-]+))"))) << run.output;
  EXPECT_LE(std::stod(m[1]), 1e-4) << run.output << "\n" << read_file(dir / "out/config.json");
}

INSTANTIATE_TEST_SUITE_P(Families, MoeHf, ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe"));

// A config.json of an MoE family with a field we cannot honour: an error naming it.
TEST(MoeHfConfig, UnsupportedFieldsNameTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"model_type": "mixtral", "router_jitter_noise": 0.1})", "router_jitter_noise = 0.1 is not supported"},
      {R"({"model_type": "mixtral", "sliding_window": 4096})", "sliding_window = 4096 is not supported"},
      {R"({"model_type": "qwen2_moe", "use_sliding_window": true})", "use_sliding_window = true is not supported"},
      {R"({"model_type": "qwen3_moe", "hidden_act": "gelu"})", "hidden_act = \"gelu\" is not supported"},
      {R"({"model_type": "qwen3_moe", "mlp_only_layers": [7]})", "mlp_only_layers = [7] is not supported"},
  };
  for (const auto& [fields, message] : cases) {
    test::TempDir dir;
    nlohmann::json j = nlohmann::json::parse(fields);
    const nlohmann::json defaults = {{"num_hidden_layers", 2}, {"hidden_size", 32}, {"intermediate_size", 64},
                                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"vocab_size", 100},
                                     {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}};
    for (const auto& [key, value] : defaults.items()) {
      if (!j.contains(key)) j[key] = value;
    }
    write_file_atomic(dir / "config.json", j.dump());
    try {
      model_config_from_hf(dir.path());
      ADD_FAILURE() << "accepted " << fields;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dir / "config.json"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace megatron
