// `megatron eval` on the tiny CPU recipe: it scores a checkpoint on the same validation batches
// the training run's first evaluation used (so the two print the same loss), also scores the
// test split, reads weights-only (converted) checkpoints, scores a dataset whose --split leaves
// no training samples (training on it is a clear error), gives the same figure under data
// parallelism, and refuses to run without weights or with a save directory. `train --skip-train`
// (Megatron's flag) is the same evaluation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace megatron {
namespace {

// `megatron <subcommand>` on the tiny recipe with the run's flags and `extra`.
std::vector<std::string> tiny(const std::string& subcommand, std::vector<std::string> extra) {
  std::vector<std::string> args = {subcommand, "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                   "--cpu-threads", "1", "--device", "cpu", "--train-iters", "4", "--lr-warmup-iters", "1",
                                   "--eval-interval", "4", "--eval-iters", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// The "lm loss value" printed after `what` in a validation block, as printed (6 decimals).
std::string printed_loss(const std::string& output, const std::string& what) {
  std::smatch match;
  const std::regex line(what + R"( \| lm loss value: ([0-9.E+-]+) \|)");
  return std::regex_search(output, match, line) ? match[1].str() : "";
}

TEST(EvalCommand, ScoresACheckpointOnTheTrainingRunsFirstValidationBatches) {
  test::TempDir dir;
  auto trained = test::run_megatron(tiny("train", {"--save", dir / "ckpt"}));
  ASSERT_EQ(trained.status, 0) << trained.output;
  // The run's first evaluation (iteration 4) takes the validation split from its first sample,
  // as eval does, with the weights the checkpoint holds.
  const std::string in_training = printed_loss(trained.output, "validation loss at iteration 4");
  ASSERT_FALSE(in_training.empty()) << trained.output;

  auto evaluated = test::run_megatron(tiny("eval", {"--load", dir / "ckpt"}));
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_EQ(printed_loss(evaluated.output, "validation loss at iteration 4 for val data"), in_training) << evaluated.output;
  const std::string test_loss = printed_loss(evaluated.output, "validation loss at iteration 4 for test data");
  ASSERT_FALSE(test_loss.empty()) << evaluated.output;
  EXPECT_NE(test_loss, in_training);  // the test split is other samples
  EXPECT_TRUE(std::isfinite(std::stod(test_loss)));
  EXPECT_EQ(evaluated.output.find("consumed samples"), std::string::npos) << "eval must not train: " << evaluated.output;

  // Scoring again gives the same figures: no state advances between runs.
  auto again = test::run_megatron(tiny("eval", {"--load", dir / "ckpt"}));
  EXPECT_EQ(printed_loss(again.output, "for test data"), test_loss);

  // Megatron's way of asking for it: train --skip-train, whose --save writes nothing.
  auto skipped = test::run_megatron(tiny("train", {"--load", dir / "ckpt", "--skip-train", "--save", dir / "unused"}));
  ASSERT_EQ(skipped.status, 0) << skipped.output;
  EXPECT_EQ(printed_loss(skipped.output, "validation loss at iteration 4 for val data"), in_training) << skipped.output;
  EXPECT_EQ(printed_loss(skipped.output, "for test data"), test_loss) << skipped.output;
  EXPECT_NE(skipped.output.find("--skip-train: nothing is trained, so --save / --save-hf write nothing"), std::string::npos)
      << skipped.output;
  EXPECT_EQ(skipped.output.find("consumed samples"), std::string::npos) << skipped.output;
  EXPECT_FALSE(std::ifstream(dir / "unused/latest_checkpointed_iteration.txt").good()) << skipped.output;
}

TEST(EvalCommand, ScoresAWeightsOnlyCheckpointConvertedFromHuggingFace) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(tiny("train", {"--save", dir / "ckpt"})).status, 0);
  ASSERT_EQ(test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "ckpt", "--save", dir / "hf"}).status, 0);
  auto back = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save", dir / "back",
                                  "--make-vocab-size-divisible-by", "64"});
  ASSERT_EQ(back.status, 0) << back.output;
  // A converted checkpoint holds no optimizer state or generators: eval reads the weights alone.
  auto evaluated = test::run_megatron(tiny("eval", {"--load", dir / "back"}));
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_FALSE(printed_loss(evaluated.output, "for val data").empty()) << evaluated.output;
  EXPECT_FALSE(printed_loss(evaluated.output, "for test data").empty()) << evaluated.output;
}

TEST(EvalCommand, ScoresADatasetWhoseSplitLeavesNoTrainingSamples) {
  test::TempDir dir;
  {
    std::ofstream jsonl(dir / "corpus.jsonl");
    uint64_t lcg = 7;
    for (int doc = 0; doc < 300; ++doc) {  // NullTokenizer text: token ids separated by spaces
      jsonl << "{\"text\": \"";
      for (int t = 0; t < 80; ++t) {
        lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
        jsonl << (t ? " " : "") << (lcg >> 33) % 255;
      }
      jsonl << "\"}\n";
    }
  }
  auto pre = test::run_megatron({"preprocess", "--input", dir / "corpus.jsonl", "--output-prefix", dir / "corpus",
                                 "--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--append-eod"});
  ASSERT_EQ(pre.status, 0) << pre.output;
  ASSERT_EQ(test::run_megatron(tiny("train", {"--save", dir / "ckpt"})).status, 0);
  const std::vector<std::string> held_out = {"--data-path", dir / "corpus_text_document", "--split", "0,90,10",
                                             "--data-cache-path", dir / "cache"};
  std::vector<std::string> eval_flags = {"--load", dir / "ckpt"};
  eval_flags.insert(eval_flags.end(), held_out.begin(), held_out.end());
  auto on_corpus = [](std::vector<std::string> args) {  // the corpus instead of the recipe's mock data
    args.erase(std::remove(args.begin(), args.end(), std::string("--mock-data")), args.end());
    return args;
  };
  auto evaluated = test::run_megatron(on_corpus(tiny("eval", eval_flags)));
  ASSERT_EQ(evaluated.status, 0) << evaluated.output;
  EXPECT_FALSE(printed_loss(evaluated.output, "for val data").empty()) << evaluated.output;
  EXPECT_FALSE(printed_loss(evaluated.output, "for test data").empty()) << evaluated.output;
  // Training on it is a clear error, not a crash.
  auto trained = test::run_megatron(on_corpus(tiny("train", held_out)));
  EXPECT_EQ(trained.status, 2);
  EXPECT_NE(trained.output.find("error: no training samples: --split 0,90,10 leaves the training split empty"),
            std::string::npos) << trained.output;
}

TEST(EvalCommand, DataParallelRanksScoreTheSameBatches) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(tiny("train", {"--save", dir / "ckpt"})).status, 0);
  auto one = test::run_megatron(tiny("eval", {"--load", dir / "ckpt"}));
  std::vector<std::string> launch = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  const auto eval_args = tiny("eval", {"--load", dir / "ckpt"});
  launch.insert(launch.end(), eval_args.begin(), eval_args.end());
  auto two = test::run_megatron(launch);
  ASSERT_EQ(two.status, 0) << two.output;
  for (const std::string split : {"for val data", "for test data"}) {
    const std::string a = printed_loss(one.output, split), b = printed_loss(two.output, split);
    ASSERT_FALSE(a.empty() || b.empty()) << one.output << two.output;
    EXPECT_NEAR(std::stod(a), std::stod(b), 1e-5 * std::stod(a)) << split;
  }
}

TEST(EvalCommand, RefusesToRunWithoutWeightsOrWithASaveDirectory) {
  auto no_weights = test::run_megatron(tiny("eval", {}));
  EXPECT_EQ(no_weights.status, 2);
  EXPECT_NE(no_weights.output.find("error: megatron eval needs the weights to evaluate: --load DIR"), std::string::npos)
      << no_weights.output;
  test::TempDir dir;
  auto with_save = test::run_megatron(tiny("eval", {"--load", dir / "ckpt", "--save", dir / "out"}));
  EXPECT_EQ(with_save.status, 2);
  EXPECT_NE(with_save.output.find("drop --save"), std::string::npos) << with_save.output;
  auto help = test::run_megatron({"eval", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("usage: megatron eval"), std::string::npos);
}

}  // namespace
}  // namespace megatron
