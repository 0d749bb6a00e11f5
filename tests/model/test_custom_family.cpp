// Acceptance of the seams (issue #19): a feed-forward of a program's own, added through a layer
// spec and a family record of its own (tests/custom_family/main.cpp), and nothing else, trains
// as real processes under TP=2 + SP x PP=2 to the single-process losses, its checkpoint reshards
// into one process (model and optimizer state: training goes on as the single-process run's),
// and it converts to Hugging Face and back bitwise through its own weight table; its own loss
// function's named term reaches the log line.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "support/test_support.h"

namespace megatron {
namespace {

test::CommandResult run_custom(const std::vector<std::string>& args) {
  std::string command = test::shell_quote(MEGATRON_CUSTOM_FAMILY_BINARY);
  for (const auto& a : args) command += " " + test::shell_quote(a);
  return test::run_command(command);
}

std::vector<std::string> train_flags(int iterations) {
  return {"train", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
          "--num-query-groups", "2", "--ffn-hidden-size", "128", "--normalization", "RMSNorm",
          "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
          "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters",
          std::to_string(iterations), "--lr", "1e-3", "--lr-decay-style", "constant", "--mock-data", "--tokenizer-type",
          "NullTokenizer", "--vocab-size", "200", "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1",
          "--eval-interval", "1000", "--cpu-threads", "1", "--device", "cpu", "--seed", "11"};
}

// Trains (optionally under `launch`); the per-iteration losses go to <name>.jsonl, the output
// into `output` when given.
void train(const test::TempDir& dir, const std::string& name, int iterations, const std::vector<std::string>& extra,
           int nproc = 1, std::string* output = nullptr) {
  std::vector<std::string> args;
  if (nproc > 1) args = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
  for (const auto& a : train_flags(iterations)) args.push_back(a);
  for (const auto& a : extra) args.push_back(a);
  for (const auto& a : {std::string("--metrics-jsonl"), dir / (name + ".jsonl")}) args.push_back(a);
  const auto run = run_custom(args);
  if (output != nullptr) *output = run.output;
  ASSERT_EQ(run.status, 0) << name << "\n" << run.output;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what, double tolerance = 1e-5) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), tolerance * std::abs(want[i])) << what << ", iteration " << i + 1 << ": " << got[i]
                                                                     << " vs " << want[i];
  }
}

std::map<std::string, at::Tensor> tensors_of(const std::string& path) {
  SafetensorsFile file(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.load(name);
  return out;
}

TEST(CustomFamily, TrainsUnderTensorSequenceAndPipelineParallelismReshardsAndRoundTripsThroughHf) {
  test::TempDir dir;
  // One process, 4 iterations, then 2 more from its checkpoint.
  train(dir, "single", 4, {"--save", dir / "single"});
  train(dir, "single", 6, {"--load", dir / "single", "--save", dir / "single"});
  const std::vector<double> single = test::jsonl_series(dir / "single.jsonl");
  ASSERT_EQ(single.size(), 6u);

  // TP=2 with sequence parallelism x PP=2: the same 4 losses.
  std::string log;
  train(dir, "parallel", 4,
        {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "2",
         "--save", dir / "parallel"},
        /*nproc=*/4, &log);
  // The family's loss term, reduced as the loss is and sent from the last stage: twice lm loss.
  const std::regex logged(R"(\| lm loss: ([0-9.E+-]+) \| lm loss x2: ([0-9.E+-]+) \|)");
  int lines = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), logged); it != std::sregex_iterator(); ++it, ++lines) {
    EXPECT_NEAR(std::stod((*it)[2]), 2 * std::stod((*it)[1]), 1e-5) << (*it)[0];
  }
  EXPECT_EQ(lines, 4) << log;
  const std::string saved = latest_checkpoint_directory(dir / "parallel");
  ASSERT_TRUE(std::ifstream(saved + "/model_tp01_pp001.safetensors").good()) << "not a TP=2 x PP=2 checkpoint";
  const std::vector<double> parallel = test::jsonl_series(dir / "parallel.jsonl");
  expect_close(parallel, {single.begin(), single.begin() + 4}, "TP=2 + SP x PP=2");
  // And the gradient norms (Adam would hide the family's weights' gradients off by a constant factor).
  const std::vector<double> single_norms = test::jsonl_series(dir / "single.jsonl", "grad_norm");
  ASSERT_EQ(single_norms.size(), 6u);
  expect_close(test::jsonl_series(dir / "parallel.jsonl", "grad_norm"), {single_norms.begin(), single_norms.begin() + 4},
               "TP=2 + SP x PP=2, gradient norm", 1e-4);
  // The expert-free custom weights are split over TP by their own description: column rows, row columns.
  const auto tp0 = tensors_of(saved + "/model_tp00_pp000.safetensors");
  ASSERT_TRUE(tp0.count("decoder.layers.0.mlp.expand.weight"));
  EXPECT_EQ(tp0.at("decoder.layers.0.mlp.expand.weight").sizes(), (at::IntArrayRef{96, 64}));
  EXPECT_EQ(tp0.at("decoder.layers.0.mlp.contract.weight").sizes(), (at::IntArrayRef{64, 96}));

  // Resharded into one process, model and optimizer state: iterations 5 and 6 as the single run's.
  train(dir, "resharded", 6, {"--load", dir / "parallel", "--save", dir / "resharded"});
  const std::vector<double> resharded = test::jsonl_series(dir / "resharded.jsonl");
  expect_close(resharded, {single.begin() + 4, single.end()}, "resharded to one process");

  // To HF through the family's own table and back: the same tensors, bitwise.
  auto to_hf = run_custom({"convert", "--from", "native", "--to", "hf", "--load", dir / "single", "--save", dir / "hf"});
  ASSERT_EQ(to_hf.status, 0) << to_hf.output;
  const auto hf = tensors_of(dir / "hf/model.safetensors");
  EXPECT_TRUE(hf.count("model.layers.3.mlp.fc_in.weight"));
  EXPECT_TRUE(hf.count("model.layers.3.mlp.fc_out.weight"));
  EXPECT_FALSE(hf.count("model.layers.3.mlp.gate_proj.weight"));
  std::ifstream config(dir / "hf/config.json");
  const std::string config_text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  EXPECT_NE(config_text.find("\"wide_mlp\""), std::string::npos) << config_text;
  auto back = run_custom({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save", dir / "back"});
  ASSERT_EQ(back.status, 0) << back.output;
  auto again = run_custom({"convert", "--from", "native", "--to", "hf", "--load", dir / "back", "--save", dir / "hf2"});
  ASSERT_EQ(again.status, 0) << again.output;
  const auto hf2 = tensors_of(dir / "hf2/model.safetensors");
  ASSERT_EQ(hf2.size(), hf.size());
  for (const auto& [name, tensor] : hf) {
    ASSERT_TRUE(hf2.count(name)) << name;
    EXPECT_TRUE(at::equal(hf2.at(name), tensor)) << name;
  }
  // Native -> HF -> native: every tensor as trained (vocabulary rows up to the tokenizer's; the
  // padding rows come back as zeros).
  const auto trained = tensors_of(latest_checkpoint_directory(dir / "single") + "/model.safetensors");
  const auto returned = tensors_of(dir / "back/iter_0000000/model.safetensors");
  ASSERT_EQ(returned.size(), trained.size());
  for (const auto& [name, tensor] : trained) {
    ASSERT_TRUE(returned.count(name)) << name;
    const at::Tensor& got = returned.at(name);
    ASSERT_EQ(got.sizes(), tensor.sizes()) << name;
    const bool vocab = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    EXPECT_TRUE(vocab ? at::equal(got.narrow(0, 0, 200), tensor.narrow(0, 0, 200)) : at::equal(got, tensor)) << name;
  }
}

}  // namespace
}  // namespace megatron
