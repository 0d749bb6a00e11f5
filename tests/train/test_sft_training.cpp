// `megatron train --sft` end to end: chat JSONL -> `megatron preprocess --sft` (real Qwen3
// tokenizer, ChatML) -> a tiny model trains on the packs (loss only on assistant tokens,
// attention kept inside each packed conversation) and the loss falls.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "support/test_support.h"

namespace megatron {
namespace {

TEST(SftTraining, PreprocessThenTrainOnPackedConversations) {
  test::TempDir dir;
  const std::string tokenizer = test::tokenizer_models("qwen3");
  ASSERT_FALSE(tokenizer.empty()) << "tests/fixtures/fetch_tokenizers.sh failed";
  {
    std::ofstream out(dir / "chat.jsonl");
    for (int i = 0; i < 24; ++i) {
      out << R"({"messages": [{"role": "user", "content": "What is )" << i << R"( plus one?"}, )"
          << R"({"role": "assistant", "content": "It is )" << i + 1 << R"(."}]})" << "\n";
    }
  }
  auto pre = test::run_megatron({"preprocess", "--sft", "--seq-length", "64", "--input", dir / "chat.jsonl", "--output-prefix",
                                 dir / "chat", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
                                 "--chat-template", "chatml"});
  ASSERT_EQ(pre.status, 0) << pre.output;

  auto train = test::run_megatron({"train", "--sft", "--data-path", dir / "chat", "--tokenizer-type", "HuggingFaceTokenizer",
                                   "--tokenizer-model", tokenizer, "--model-family", "qwen3", "--num-layers", "2",
                                   "--hidden-size", "32", "--num-attention-heads", "4", "--num-query-groups", "2",
                                   "--ffn-hidden-size", "64", "--seq-length", "64", "--micro-batch-size", "2",
                                   "--global-batch-size", "4", "--train-iters", "30", "--lr", "1e-2", "--lr-warmup-iters", "2",
                                   "--split", "90,10,0", "--log-interval", "10", "--eval-interval", "30", "--eval-iters", "1",
                                   "--device", "cpu", "--cpu-threads", "1"});
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_NE(train.output.find("packed SFT, train"), std::string::npos) << train.output;
  const std::vector<double> losses = test::logged_losses(train.output, 10);
  ASSERT_EQ(losses.size(), 3u) << train.output;
  EXPECT_LT(losses.back(), losses.front() - 1.0) << train.output;
  EXPECT_NE(train.output.find("validation loss at iteration 30"), std::string::npos) << train.output;

  // Pai-Megatron-Patch's way: each split its own packed dataset, taken whole.
  auto own = test::run_megatron({"train", "--sft", "--train-data-path", dir / "chat", "--valid-data-path", dir / "chat",
                                 "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer, "--model-family",
                                 "qwen3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                 "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "64", "--micro-batch-size",
                                 "2", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-2", "--eval-interval", "2",
                                 "--eval-iters", "1", "--device", "cpu", "--cpu-threads", "1"});
  ASSERT_EQ(own.status, 0) << own.output;
  const std::smatch packs = [&] {
    std::smatch m;
    std::regex_search(own.output, m, std::regex(R"(packed SFT, train: packs 0\.\.(\d+) of (\d+)\))"));
    return m;
  }();
  ASSERT_EQ(packs.size(), 3u) << own.output;
  EXPECT_EQ(packs[1].str(), packs[2].str()) << "the whole dataset trains\n" << own.output;
  EXPECT_NE(own.output.find("validation loss at iteration 2"), std::string::npos) << own.output;
}

}  // namespace
}  // namespace megatron
