// --optimizer-cpu-offload through `megatron train` on tiny CPU runs: offloading all or half of
// the optimizer (with and without the overlapped copies, under the distributed optimizer too)
// trains bit for bit as keeping it where the parameters are; a run stopped and resumed with
// offloading, or resumed without it, continues bit for bit; Megatron's conditions are errors
// naming the flags.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/test_support.h"

namespace megatron {
namespace {

std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--log-interval", "1", "--bf16", "--hidden-dropout", "0",
                               "--attention-dropout", "0", "--train-iters", "6", "--use-precision-aware-optimizer",
                               "--exp-avg-dtype", "bf16"});
  return test::tiny_cpu_train(extra);
}

// The --metrics-jsonl lines of a run (losses, grad norm, learning rate: every step's numbers).
std::vector<std::string> metrics(const test::TempDir& dir, const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--metrics-jsonl", dir / (name + ".jsonl")});
  const auto r = test::run_megatron(tiny(extra));
  EXPECT_EQ(r.status, 0) << r.output;
  return test::file_lines(dir / (name + ".jsonl"));
}

TEST(CpuOffloadTraining, TrainsBitForBitAsKeepingTheOptimizerWithTheParameters) {
  test::TempDir dir;
  const auto kept = metrics(dir, "kept", {});
  ASSERT_EQ(kept.size(), 6u);
  EXPECT_EQ(metrics(dir, "all", {"--optimizer-cpu-offload"}), kept);
  EXPECT_EQ(metrics(dir, "half", {"--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5", "--overlap-cpu-optimizer-d2h-h2d"}),
            kept);
  EXPECT_EQ(metrics(dir, "none", {"--optimizer-cpu-offload", "--optimizer-offload-fraction", "0"}), kept);
}

TEST(CpuOffloadTraining, DistributedOptimizerShardsOffloadAndResumeEitherWay) {
  test::TempDir dir;
  auto two_ranks = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
    extra.insert(extra.end(), {"--use-distributed-optimizer", "--global-batch-size", "8", "--metrics-jsonl", dir / (name + ".jsonl")});
    for (const auto& a : tiny(extra)) args.push_back(a);
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return test::file_lines(dir / (name + ".jsonl"));
  };
  const auto kept = two_ranks("kept", {});
  ASSERT_EQ(kept.size(), 6u);
  EXPECT_EQ(two_ranks("offloaded", {"--optimizer-cpu-offload", "--exit-interval", "3", "--save", dir / "ckpt"}),
            std::vector<std::string>(kept.begin(), kept.begin() + 3));
  // Resumed with offloading, and at one process without it: the same next steps.
  EXPECT_EQ(two_ranks("resumed", {"--optimizer-cpu-offload", "--load", dir / "ckpt"}), std::vector<std::string>(kept.begin() + 3, kept.end()));
  const auto one = metrics(dir, "one", {"--global-batch-size", "8", "--load", dir / "ckpt"});
  ASSERT_EQ(one.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    // One process sums the batch in another order than two DP ranks: the same step's loss, not
    // the same bits.
    const double got = nlohmann::json::parse(one[i])["lm_loss"].get<double>();
    const double want = nlohmann::json::parse(kept[3 + i])["lm_loss"].get<double>();
    EXPECT_NEAR(got, want, 1e-4 * want) << one[i];
  }
}

TEST(CpuOffloadTraining, MegatronsConditionsAreErrorsNamingTheFlags) {
  auto error = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data", "--device", "cpu",
                               "--train-iters", "1"});
    const auto r = test::run_megatron(args);
    EXPECT_NE(r.status, 0);
    return r.output;
  };
  EXPECT_NE(error({"--optimizer-cpu-offload"}).find("--optimizer-cpu-offload needs --use-precision-aware-optimizer"), std::string::npos);
  EXPECT_NE(error({"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--optimizer-offload-fraction", "1.5"})
                .find("--optimizer-offload-fraction must be between 0 and 1"),
            std::string::npos);
  EXPECT_NE(error({"--optimizer-cpu-offload", "--use-precision-aware-optimizer", "--overlap-optimizer-step"})
                .find("do not go together"),
            std::string::npos);
}

}  // namespace
}  // namespace megatron
