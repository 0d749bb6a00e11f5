// Hugging Face interop against transformers itself. For each family (Llama 3 with llama3 RoPE
// scaling and untied output, Qwen2 with qkv bias, Qwen3 with q/k norm and tied embeddings,
// Mistral) a random-weight HF model from tests/fixtures/make_hf_model.py is
//  - converted to a native checkpoint, whose model matches HF's logits (1e-4) and loss (1e-5);
//  - converted HF -> native (TP=2 x PP=2) -> HF, bitwise identical in every tensor, fp32 and
//    bf16, with sharded output that transformers loads and runs to the same logits;
//  - trained from directly with `train --load-hf` under TP=2 x PP=2 and exported with --save-hf.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "core/config_json.h"
#include "core/files.h"
#include "model/gpt_model.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

using test::expect_bitwise_equal;
using test::make_hf_model;

class HfConvert : public ::testing::TestWithParam<std::string> {};

// Converted without vocabulary padding (96 rows divide by 32) the model is HF's exactly: logits
// and loss. With Megatron's default padding to a multiple of 128 the extra rows are zero, so the
// logits of the real vocabulary still match; the loss then differs as it does in Megatron, whose
// softmax also spans the padded rows.
TEST_P(HfConvert, NativeCheckpointMatchesTransformersLogits) {
  test::TempDir dir;
  make_hf_model(dir / "hf", GetParam());
  SafetensorsFile reference(dir / "hf/reference.safetensors");
  const at::Tensor ids = reference.load("input_ids");
  for (const std::string divisible : {"32", "128"}) {
    const std::string out = dir / ("native" + divisible);
    auto r = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save", out,
                                 "--make-vocab-size-divisible-by", divisible});
    ASSERT_EQ(r.status, 0) << r.output;
    const std::string iter = latest_checkpoint_directory(out);
    const ModelConfig config = model_config_from_json(read_checkpoint_state(iter).at("model_config"));
    EXPECT_EQ(config.padded_vocab_size, divisible == "32" ? 96 : 128);
    GPTModel model(config);
    load_model_weights(iter, model);
    model.eval();
    at::NoGradGuard no_grad;
    at::Tensor logits = model.forward(ids).transpose(0, 1).narrow(-1, 0, 96);  // [b, s, V_hf]
    EXPECT_LE((logits - reference.load("logits")).abs().max().item<double>(), 1e-4) << "padded to " << divisible;
    if (divisible == "32") {
      const int64_t s = ids.size(1);
      Batch batch{ids.narrow(1, 0, s - 1), ids.narrow(1, 1, s - 1), at::ones({ids.size(0), s - 1})};
      EXPECT_NEAR(model.loss(batch).item<double>(), reference.load("loss").item<double>(), 1e-5);
    }
  }
}

TEST_P(HfConvert, RoundTripThroughTensorParallelNativeIsBitwise) {
  for (bool bf16 : {false, true}) {
    test::TempDir dir;
    make_hf_model(dir / "hf", GetParam(), bf16);
    auto to_native = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save",
                                         dir / "native", "--target-tensor-parallel-size", "2",
                                         "--target-pipeline-parallel-size", "2"});
    ASSERT_EQ(to_native.status, 0) << to_native.output;
    EXPECT_TRUE(fs::exists(dir / "native/iter_0000000/model_tp01_pp001.safetensors"));
    {  // each stage holds its own layer; the embedding sits on the first (and, tied, the last)
      SafetensorsFile first(dir / "native/iter_0000000/model_tp00_pp000.safetensors");
      SafetensorsFile last(dir / "native/iter_0000000/model_tp00_pp001.safetensors");
      EXPECT_TRUE(first.contains("decoder.layers.0.self_attention.linear_qkv.weight"));
      EXPECT_FALSE(first.contains("decoder.layers.1.self_attention.linear_qkv.weight"));
      EXPECT_TRUE(last.contains("decoder.layers.1.self_attention.linear_qkv.weight"));
      EXPECT_TRUE(last.contains("decoder.final_layernorm.weight"));
      EXPECT_EQ(last.contains("embedding.word_embeddings.weight"), GetParam() == "qwen3");  // tied
    }
    auto to_hf = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "native", "--save",
                                     dir / "back", "--max-shard-size", "40KB"});
    ASSERT_EQ(to_hf.status, 0) << to_hf.output;
    EXPECT_TRUE(fs::exists(dir / "back/model.safetensors.index.json")) << "expected several shards";
    expect_bitwise_equal(dir / "hf", dir / "back");
    EXPECT_EQ(read_file(dir / "hf/config.json"), read_file(dir / "back/config.json"));
    if (!bf16) {
      auto run = test::run_command(test::shell_quote(test::venv_python()) + " " +
                                   test::shell_quote(test::source_dir() + "/tests/fixtures/hf_logits.py") + " " +
                                   test::shell_quote(dir / "back") + " " + test::shell_quote(dir / "hf/reference.safetensors"));
      ASSERT_EQ(run.status, 0) << run.output;
      EXPECT_NE(run.output.find("max_abs_diff 0.000e+00"), std::string::npos) << run.output;
    }
  }
}

// The model `train --load-hf` builds is HF's: after one step at a vanishing learning rate (weights
// unchanged) its checkpoint gives HF's logits and, unpadded, HF's loss.
TEST_P(HfConvert, LoadHfGivesTransformersLogits) {
  test::TempDir dir;
  make_hf_model(dir / "hf", GetParam());
  auto r = test::run_megatron({"train", "--load-hf", dir / "hf", "--seq-length", "16", "--micro-batch-size", "2",
                               "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0", "--mock-data",
                               "--tokenizer-type", "NullTokenizer", "--vocab-size", "90", "--make-vocab-size-divisible-by",
                               "32", "--eval-interval", "0", "--device", "cpu", "--cpu-threads", "1", "--save", dir / "ckpt"});
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string iter = latest_checkpoint_directory(dir / "ckpt");
  const ModelConfig config = model_config_from_json(read_checkpoint_state(iter).at("model_config"));
  ASSERT_EQ(config.padded_vocab_size, 96);
  GPTModel model(config);
  load_model_weights(iter, model);
  model.eval();
  test::expect_model_matches_reference(model, dir / "hf/reference.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Families, HfConvert, ::testing::Values("llama3", "qwen2", "qwen3", "mistral"));

// `train --load-hf` takes the architecture from config.json and the weights sharded for TP=2 x
// PP=2; `--save-hf` gathers them back (over TP on each stage, then to rank 0 over the pipeline).
// With a vanishing learning rate the exported tensors must equal the input bit for bit, which
// checks mapping, sharding, staging and gathering end to end.
TEST(HfTraining, LoadHfTrainSaveHfUnderTensorAndPipelineParallel) {
  for (const std::string variant : {"qwen3", "llama3"}) {
    test::TempDir dir;
    make_hf_model(dir / "hf", variant);
    auto r = test::run_megatron({"launch", "--nproc-per-node", "4", "--master-port", "0", "train", "--load-hf", dir / "hf",
                                 "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                 "--seq-length", "16", "--micro-batch-size", "2",
                                 "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0", "--mock-data",
                                 "--tokenizer-type", "NullTokenizer", "--vocab-size", "90", "--eval-interval", "0",
                                 "--device", "cpu", "--cpu-threads", "1", "--save-hf", dir / "out"});
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("> model: 2 layers, hidden 64, 4 heads (2 query groups), ffn 160"), std::string::npos) << r.output;
    expect_bitwise_equal(dir / "hf", dir / "out");
    EXPECT_EQ(read_file(dir / "hf/config.json"), read_file(dir / "out/config.json"));
  }
}

TEST(HfTraining, ContradictingModelFlagIsAnError) {
  test::TempDir dir;
  make_hf_model(dir / "hf", "llama3");
  auto r = test::run_megatron({"train", "--load-hf", dir / "hf", "--num-layers", "3", "--seq-length", "16",
                               "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                               "--vocab-size", "90", "--device", "cpu"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--num-layers 3 contradicts " + dir.path() + "/hf/config.json (2)"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron
