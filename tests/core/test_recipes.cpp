// Every recipe in examples/ parses and passes the configuration checks (model recipes that
// name a real tokenizer are checked with the NullTokenizer and the vocabulary they would have).
#include <gtest/gtest.h>

#include <filesystem>

#include "train/arguments.h"
#include "support/test_support.h"

namespace megatron {
namespace {

TEST(Recipes, EveryExampleIsValid) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    Config c = parse_train_arguments({"--config", entry.path().string(), "--mock-data", "--tokenizer-type",
                                      "NullTokenizer", "--vocab-size", "128255"});
    EXPECT_NO_THROW(finalize_config(c, 1)) << entry.path();
    EXPECT_GT(c.model.num_layers, 0) << entry.path();
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(Recipes, Llama3And8BShapes) {
  Config c = parse_train_arguments({"--config", test::source_dir() + "/examples/llama3-8b.yaml", "--mock-data",
                                    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255"});
  finalize_config(c, 1);
  EXPECT_EQ(c.model.padded_vocab_size, 128256);
  EXPECT_EQ(c.model.kv_channels, 128);
  EXPECT_EQ(c.model.num_query_groups, 8);
  EXPECT_TRUE(c.model.swiglu);
  EXPECT_EQ(c.model.normalization, "RMSNorm");
}

// The long-context recipe under the layout its comment gives: 16 ranks, CP=8 x TP=2 + SP.
TEST(Recipes, LongContextSplitsOverContextParallelRanks) {
  Config c = parse_train_arguments({"--config", test::source_dir() + "/examples/llama3.1-8b-128k.yaml", "--mock-data",
                                    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255", "--context-parallel-size", "8",
                                    "--cp-comm-type", "p2p", "--tensor-model-parallel-size", "2", "--sequence-parallel"});
  finalize_config(c, 16);
  EXPECT_EQ(c.model.seq_length, 131072);
  EXPECT_EQ(c.parallel.data_parallel_size, 1);
  EXPECT_EQ(c.model.attention_dropout, 0.0);
  // Its two-node variant: the all-to-all inside each node, the ring across the two.
  Config h = parse_train_arguments({"--config", test::source_dir() + "/examples/llama3.1-8b-128k.yaml", "--mock-data",
                                    "--tokenizer-type", "NullTokenizer", "--vocab-size", "128255", "--context-parallel-size", "8",
                                    "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "4", "2",
                                    "--tensor-model-parallel-size", "2", "--sequence-parallel"});
  finalize_config(h, 16);
  EXPECT_EQ(h.parallel.hierarchical_context_parallel_sizes, (std::vector<int>{4, 2}));
  EXPECT_EQ(h.model.cp_comm_type, (std::vector<std::string>{"a2a+p2p"}));
}

}  // namespace
}  // namespace megatron
