// 1F1B bounds activation memory: the first of two stages keeps at most two micro-batches'
// activations (p - r in flight on stage r), however many micro-batches the step has. Measured
// from the trainer's memory report after the first iteration: the C heap in use after each
// forward minus its level at the step's start (CPU tensors live on that heap), real processes
// over Gloo.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "support/test_support.h"

namespace megatron {
namespace {

struct StageMemory {
  double activations_mb = 0;
  int in_flight = 0;
};

// Per pipeline stage, from the "[Rank R] (after 1 iterations) memory (MB) | ..." lines.
std::map<int, StageMemory> pipeline_memory(int micro_batches) {
  // Attention probabilities [b, heads, s, s] dominate what a layer keeps for backward (about
  // 10 MB per layer and micro-batch here), far above the heap's noise.
  std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0", "train",
                                   "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "256", "--micro-batch-size", "4",
                                   "--global-batch-size", std::to_string(4 * micro_batches), "--train-iters", "1",
                                   "--lr", "1e-3", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "200",
                                   "--log-interval", "1", "--cpu-threads", "1", "--device", "cpu",
                                   "--pipeline-model-parallel-size", "2"};
  auto run = test::run_megatron(args);
  EXPECT_EQ(run.status, 0) << run.output;
  std::regex line(R"(activations at peak: ([0-9.]+) \| micro-batches in flight at peak: (\d+) \| pipeline stage: (\d))");
  std::map<int, StageMemory> stages;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), line); it != std::sregex_iterator(); ++it) {
    stages[std::stoi((*it)[3])] = {std::stod((*it)[1]), std::stoi((*it)[2])};
  }
  EXPECT_EQ(stages.size(), 2u) << run.output;
  return stages;
}

TEST(PipelineMemory, FirstStageActivationsFollowMicroBatchesInFlightNotTheirNumber) {
  auto one = pipeline_memory(1), two = pipeline_memory(2), eight = pipeline_memory(8);
  // In flight: min(m, p - r).
  EXPECT_EQ(one[0].in_flight, 1);
  EXPECT_EQ(two[0].in_flight, 2);
  EXPECT_EQ(eight[0].in_flight, 2);
  EXPECT_EQ(eight[1].in_flight, 1);
  // Memory grows with the micro-batches in flight ...
  EXPECT_GT(two[0].activations_mb, 1.6 * one[0].activations_mb) << one[0].activations_mb << " MB -> " << two[0].activations_mb;
  // ... and not with the number of micro-batches (8 would hold 4x as much as 2 without 1F1B).
  EXPECT_LT(eight[0].activations_mb, 1.25 * two[0].activations_mb) << two[0].activations_mb << " MB -> " << eight[0].activations_mb;
  EXPECT_LT(eight[1].activations_mb, 1.25 * two[1].activations_mb) << two[1].activations_mb << " MB -> " << eight[1].activations_mb;
  EXPECT_GT(one[0].activations_mb, 5.0);  // the measurement sees the activations at all
}

}  // namespace
}  // namespace megatron
