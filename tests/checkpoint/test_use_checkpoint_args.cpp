// Megatron's --use-checkpoint-args on a megatron.cpp checkpoint: `megatron eval` (or train)
// given no model or tokenizer flags builds the model the checkpoint recorded and scores it as the
// run that saved it did; a model flag contradicting the checkpoint is refused by name, and no
// checkpoint under --load leaves the flags' model with a notice.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace megatron {
namespace {

// The validation loss printed after `what`, as printed.
std::string printed_loss(const std::string& output, const std::string& what) {
  std::smatch match;
  const std::regex line(what + R"( \| lm loss value: ([0-9.E+-]+) \|)");
  return std::regex_search(output, match, line) ? match[1].str() : "";
}

// What the run needs besides the model: data, batches, evaluation, this machine.
std::vector<std::string> run_flags(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--mock-data", "--cpu-threads", "1", "--device", "cpu", "--train-iters", "4", "--eval-interval", "4",
                                   "--eval-iters", "2", "--micro-batch-size", "4", "--global-batch-size", "8", "--seed", "1234"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(UseCheckpointArgs, EvalBuildsTheCheckpointsModelWithoutModelFlags) {
  test::TempDir dir;
  std::vector<std::string> train = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml"};
  for (const auto& a : run_flags({"--lr-warmup-iters", "1", "--save", dir / "ckpt"})) train.push_back(a);
  const auto trained = test::run_megatron(train);
  ASSERT_EQ(trained.status, 0) << trained.output;
  const std::string in_training = printed_loss(trained.output, "validation loss at iteration 4");
  ASSERT_FALSE(in_training.empty()) << trained.output;

  std::vector<std::string> eval = {"eval", "--load", dir / "ckpt", "--use-checkpoint-args"};
  for (const auto& a : run_flags({})) eval.push_back(a);
  const auto evaluated = test::run_megatron(eval);
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_EQ(printed_loss(evaluated.output, "validation loss at iteration 4 for val data"), in_training) << evaluated.output;

  // Without the flag the same command has no model to build.
  std::vector<std::string> bare = {"eval", "--load", dir / "ckpt"};
  for (const auto& a : run_flags({})) bare.push_back(a);
  EXPECT_EQ(test::run_megatron(bare).status, 2);

  std::vector<std::string> contradicting = eval;
  contradicting.insert(contradicting.end(), {"--num-layers", "3"});
  const auto refused = test::run_megatron(contradicting);
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.output.find("--num-layers 3 contradicts " + (dir / "ckpt/iter_0000004/state.json") +
                                " (2); with --use-checkpoint-args the architecture comes from the checkpoint"),
            std::string::npos)
      << refused.output;

  std::vector<std::string> nothing = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--load", dir / "empty",
                                      "--save", dir / "empty", "--use-checkpoint-args"};
  for (const auto& a : run_flags({"--train-iters", "1", "--lr-warmup-iters", "0"})) nothing.push_back(a);
  const auto fresh = test::run_megatron(nothing);
  EXPECT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("--use-checkpoint-args: no checkpoint under --load " + (dir / "empty") + ", so the model comes from the flags"),
            std::string::npos)
      << fresh.output;
}

}  // namespace
}  // namespace megatron
