// Context parallelism end to end where only whole runs can tell: packed SFT conversations of
// uneven lengths (each rank's queries kept inside their own conversation, across the chunks of
// every rank) train at CP=2 with each exchange (a2a+p2p as 2 x 1) as one process does, 20 steps to 1e-5; and the
// flags that cannot work are refused naming them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>

#include "support/test_support.h"

namespace megatron {
namespace {

TEST(ContextParallelTraining, PackedConversationsOfUnevenLengthsTrainAsOneProcess) {
  test::TempDir dir;
  const std::string tokenizer = test::tokenizer_models("qwen3");
  ASSERT_FALSE(tokenizer.empty()) << "tests/fixtures/fetch_tokenizers.sh failed";
  {
    std::ofstream out(dir / "chat.jsonl");
    for (int i = 0; i < 40; ++i) {
      std::string question = "What is " + std::to_string(i) + " plus one";
      for (int extra = 0; extra < i % 6; ++extra) question += ", please";  // lengths from ~20 to ~45 tokens
      out << R"({"messages": [{"role": "user", "content": ")" << question << R"(?"}, )"
          << R"({"role": "assistant", "content": "It is )" << i + 1 << R"(."}]})" << "\n";
    }
  }
  auto pre = test::run_megatron({"preprocess", "--sft", "--seq-length", "64", "--input", dir / "chat.jsonl", "--output-prefix",
                                 dir / "chat", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer,
                                 "--chat-template", "chatml"});
  ASSERT_EQ(pre.status, 0) << pre.output;
  auto train = [&](const std::string& name, const std::vector<std::string>& layout) {
    std::vector<std::string> args;
    if (!layout.empty()) args = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
    for (const std::string& a : std::vector<std::string>{
             "train", "--sft", "--data-path", dir / "chat", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
             tokenizer, "--model-family", "qwen3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--num-query-groups", "2", "--ffn-hidden-size", "64", "--seq-length", "64", "--micro-batch-size", "2",
             "--global-batch-size", "4", "--train-iters", "20", "--lr", "1e-2", "--lr-warmup-iters", "2", "--split", "100,0,0",
             "--log-interval", "10", "--eval-interval", "0", "--device", "cpu", "--cpu-threads", "1", "--metrics-jsonl",
             dir / (name + ".jsonl")}) {
      args.push_back(a);
    }
    args.insert(args.end(), layout.begin(), layout.end());
    auto run = test::run_megatron(args);
    EXPECT_EQ(run.status, 0) << name << "\n" << run.output;
    return std::make_pair(test::jsonl_series(dir / (name + ".jsonl")), run.output);
  };
  const auto [single, single_output] = train("single", {});
  ASSERT_EQ(single.size(), 20u) << single_output;
  EXPECT_NE(single_output.find("packed SFT"), std::string::npos) << single_output;
  for (const std::string type : {"p2p", "all_gather", "a2a", "a2a+p2p"}) {
    std::vector<std::string> layout = {"--context-parallel-size", "2", "--cp-comm-type", type};
    // Hierarchical as Ulysses between the two ranks and a ring of one: the documents' ids reach
    // the ring through the traded heads.
    if (type == "a2a+p2p") layout.insert(layout.end(), {"--hierarchical-context-parallel-sizes", "2", "1"});
    const auto [losses, output] = train(type, layout);
    ASSERT_EQ(losses.size(), 20u) << type << "\n" << output;
    EXPECT_NE(output.find("x context 2 (" + type), std::string::npos) << output;
    for (size_t i = 0; i < losses.size(); ++i) {
      EXPECT_LE(std::abs(losses[i] - single[i]), 1e-5 * std::abs(single[i])) << type << ": iteration " << i + 1;
    }
  }
}

TEST(ContextParallelTraining, FlagsThatCannotWorkAreRefusedByName) {
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--seq-length", "34"}, "--seq-length 34 does not cut into 2 x --context-parallel-size = 4 equal chunks"},
      {{"--cp-comm-type", "a2a", "--num-attention-heads", "3", "--hidden-size", "48"},
       "--cp-comm-type a2a trades heads for sequence: --num-attention-heads 3"},
      {{"--attention-dropout", "0.1"}, "--attention-dropout 0.1"},
      {{"--cp-comm-type", "ring"}, "--cp-comm-type ring: expected p2p, all_gather, a2a or a2a+p2p"},
      {{"--cp-comm-type", "a2a+p2p"}, "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P"},
      {{"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"},
       "--hierarchical-context-parallel-sizes: the sizes multiply to 4, not --context-parallel-size 2"},
      {{"--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "1", "--num-attention-heads", "3", "--hidden-size", "48"},
       "heads per rank do not divide over --hierarchical-context-parallel-sizes' 2"},
      {{"--cp-comm-type", "p2p", "a2a", "p2p"}, "--cp-comm-type: 3 values for 2 layers"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0", "train", "--num-layers", "2",
                                     "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
                                     "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                     "--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--attention-dropout", "0",
                                     "--device", "cpu", "--context-parallel-size", "2"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    const auto r = test::run_megatron(args);
    EXPECT_NE(r.status, 0) << c.expected << "\n" << r.output;  // each rank exits 2; the launcher reports it
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace megatron
