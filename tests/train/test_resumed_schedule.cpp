// The learning-rate schedule across a resume, as Megatron's OptimizerParamScheduler decides it
// (checkpoints record its state as Megatron's opt_param_scheduler): with the optimizer the flags'
// schedule must match the saved one unless --override-opt-param-scheduler (the flags', where the
// run stands) or --use-checkpoint-opt-param-scheduler (the saved one); --no-load-optim starts it
// over from its warm-up, and a checkpoint saved after that goes on from where it restarted. Each
// learning rate is compared exactly (the --metrics-jsonl "lr" of every iteration) against a run
// that never stopped.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace megatron {
namespace {

// Warm-up over the first iteration, then cosine decay over 8 whatever --train-iters says, so runs
// of different lengths share one schedule.
std::vector<std::string> run_args(const test::TempDir& dir, const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--log-interval", "1", "--lr-warmup-iters", "1", "--lr-decay-iters", "8",
                               "--metrics-jsonl", dir / (name + ".jsonl")});
  return test::tiny_cpu_train(extra);
}

// Iteration -> the learning rate it stepped with, as printed (%.17g: exact).
std::map<int, std::string> learning_rates(const test::TempDir& dir, const std::string& name) {
  static const std::regex line(R"re("iteration": (\d+),.*"lr": ([^,]+),)re");
  std::map<int, std::string> out;
  for (const auto& l : test::file_lines(dir / (name + ".jsonl"))) {
    std::smatch m;
    if (std::regex_search(l, m, line)) out[std::stoi(m[1])] = m[2];
  }
  return out;
}

std::map<int, std::string> train(const test::TempDir& dir, const std::string& name, const std::vector<std::string>& extra) {
  const auto r = test::run_megatron(run_args(dir, name, extra));
  EXPECT_EQ(r.status, 0) << r.output;
  return learning_rates(dir, name);
}

TEST(ResumedSchedule, MatchesOverridesOrKeepsTheCheckpointsAndNoLoadOptimStartsItOver) {
  test::TempDir dir;
  const auto straight = train(dir, "straight", {"--train-iters", "6"});
  ASSERT_EQ(straight.size(), 6u);
  ASSERT_NE(straight.at(1), straight.at(3));
  train(dir, "first", {"--train-iters", "2", "--save", dir / "ckpt"});

  // The same schedule goes on where it stood, a longer run too (its decay is --lr-decay-iters).
  const auto resumed = train(dir, "resumed", {"--train-iters", "6", "--load", dir / "ckpt"});
  for (int k = 3; k <= 6; ++k) EXPECT_EQ(resumed.at(k), straight.at(k)) << "iteration " << k;

  // Another peak learning rate: refused, naming the field, its flag, both values and the ways out.
  const auto refused = test::run_megatron(run_args(dir, "refused", {"--train-iters", "3", "--load", dir / "ckpt", "--lr", "6e-3"}));
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.output.find("the flags' learning-rate schedule differs from the one the checkpoint was saved with"),
            std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("the learning rate (--lr) is 0.006 here, 0.003 in the checkpoint"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("pass --override-opt-param-scheduler"), std::string::npos) << refused.output;
  // A longer decay is a difference too (Megatron's "total number of iterations").
  const auto longer = test::run_megatron(run_args(dir, "longer", {"--train-iters", "3", "--load", dir / "ckpt", "--lr-decay-iters", "9"}));
  EXPECT_EQ(longer.status, 2);
  EXPECT_NE(longer.output.find("the decay in samples (--lr-decay-iters"), std::string::npos) << longer.output;
  EXPECT_NE(longer.output.find("is 72 here, 64 in the checkpoint"), std::string::npos) << longer.output;

  // --override-opt-param-scheduler: the flags' schedule at the run's position, as if it had
  // always been the run's; --use-checkpoint-opt-param-scheduler: the saved one, flags ignored.
  const auto doubled = train(dir, "doubled", {"--train-iters", "3", "--lr", "6e-3"});
  const auto overridden = train(dir, "overridden", {"--train-iters", "3", "--load", dir / "ckpt", "--lr", "6e-3",
                                                    "--override-opt_param-scheduler"});
  EXPECT_EQ(overridden.at(3), doubled.at(3));
  EXPECT_NE(overridden.at(3), straight.at(3));
  const auto kept = train(dir, "kept", {"--train-iters", "3", "--load", dir / "ckpt", "--lr", "6e-3", "--lr-decay-style", "linear",
                                        "--use-checkpoint-opt-param-scheduler"});
  EXPECT_EQ(kept.at(3), straight.at(3));

  // --no-load-optim: the schedule starts over at iteration 3 (warm-up again), and a checkpoint
  // saved after that resumes where the restarted schedule stands.
  const auto fresh = train(dir, "fresh", {"--train-iters", "4", "--load", dir / "ckpt", "--no-load-optim", "--save", dir / "ckpt2"});
  EXPECT_EQ(fresh.at(3), straight.at(1));
  EXPECT_EQ(fresh.at(4), straight.at(2));
  const auto after = train(dir, "after", {"--train-iters", "6", "--load", dir / "ckpt2"});
  EXPECT_EQ(after.at(5), straight.at(3));
  EXPECT_EQ(after.at(6), straight.at(4));

  const auto both = test::run_megatron(run_args(dir, "both", {"--train-iters", "3", "--load", dir / "ckpt", "--override-opt-param-scheduler",
                                                             "--use-checkpoint-opt-param-scheduler"}));
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.output.find("--override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler contradict each other"),
            std::string::npos) << both.output;
}

}  // namespace
}  // namespace megatron
