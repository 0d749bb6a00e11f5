// Sampling rules on hand-made logits, and generation end to end: a tiny model trained on the
// mock data (runs of consecutive ids) continues a run greedily from its checkpoint.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

#include "inference/generate.h"
#include "support/test_support.h"

namespace megatron {
namespace {

TEST(Sampling, GreedyTopKTopPAndTemperature) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor logits = at::tensor({0.1f, 2.0f, 1.5f, -1.0f, 1.9f});
  SamplingOptions greedy;
  greedy.greedy = true;
  EXPECT_EQ(sample_next_token(logits, greedy, gen), 1);
  SamplingOptions top1;
  top1.top_k = 1;
  SamplingOptions nucleus;
  nucleus.top_p = 0.05;  // the most likely id alone already holds more than this
  SamplingOptions cold;
  cold.temperature = 1e-4;
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(sample_next_token(logits, top1, gen), 1);
    EXPECT_EQ(sample_next_token(logits, nucleus, gen), 1);
    EXPECT_EQ(sample_next_token(logits, cold, gen), 1);
  }
  SamplingOptions top3;
  top3.top_k = 3;
  std::set<int64_t> seen;
  for (int i = 0; i < 300; ++i) seen.insert(sample_next_token(logits, top3, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
  // softmax probabilities: id 1 0.369, id 4 0.334, id 2 0.224, id 0 0.055, id 3 0.018.
  SamplingOptions p90;
  p90.top_p = 0.9;  // ids 1, 4 hold 0.703 < 0.9, so id 2 joins; with it 0.926 >= 0.9: no more
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(sample_next_token(logits, p90, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
  SamplingOptions p95;
  p95.top_p = 0.95;  // 0.926 < 0.95 lets id 0 in; then 0.982: id 3 stays out
  seen.clear();
  for (int i = 0; i < 600; ++i) seen.insert(sample_next_token(logits, p95, gen));
  EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 4}));
}

TEST(Generate, TrainedTinyModelContinuesARun) {
  test::TempDir dir;
  auto train = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                   "--device", "cpu", "--cpu-threads", "1", "--train-iters", "100", "--log-interval", "50",
                                   "--save", dir / "ckpt"});
  ASSERT_EQ(train.status, 0) << train.output;
  auto gen = test::run_megatron({"generate", "--load", dir / "ckpt", "--prompt", "40 41 42 43", "--greedy",
                                 "--max-new-tokens", "6", "--device", "cpu"});
  ASSERT_EQ(gen.status, 0) << gen.output;
  EXPECT_NE(gen.output.find("40 41 42 43 44 45 46 47"), std::string::npos) << gen.output;
  auto bad = test::run_megatron({"generate", "--load", dir / "nothing-here", "--prompt", "1"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("no latest_checkpointed_iteration.txt"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace megatron
