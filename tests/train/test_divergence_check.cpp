// Megatron's --check-for-nan-in-loss-and-grad (issue #26): a diverging run stops at the first
// iteration whose loss or gradient norm is not finite, with an error naming it, having saved
// nothing after it; --no-check-for-nan-in-loss-and-grad skips and counts such steps, and neither
// the log line nor --metrics-jsonl shows a non-finite loss as 0 or as invalid JSON.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <limits>
#include <regex>

#include "support/test_support.h"
#include "train/divergence_check.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

at::Tensor scalar(double v) { return at::scalar_tensor(v, at::kDouble); }
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(DivergenceCheck, NamesTheFirstIterationWithANonFiniteLossOrGradientNorm) {
  DivergenceCheck check(/*enabled=*/true, at::kCPU);
  check.add(1, scalar(2.5), at::scalar_tensor(0.8f));
  check.add(2, scalar(kNaN), at::scalar_tensor(0.8f));
  // The latest iteration is left for later (on a GPU its copy may still be in flight).
  EXPECT_FALSE(check.check_lagged().has_value());
  check.add(3, scalar(2.4), at::scalar_tensor(kInf));
  const auto failure = check.check_lagged();
  ASSERT_TRUE(failure.has_value());
  EXPECT_NE(failure->find("iteration 2: the loss is not finite (lm loss nan, grad norm 0.8)"), std::string::npos) << *failure;
  EXPECT_NE(failure->find("--no-check-for-nan-in-loss-and-grad"), std::string::npos) << *failure;
  EXPECT_FALSE(check.check_all().has_value()) << "reported once";

  DivergenceCheck norm(/*enabled=*/true, at::kCPU);
  norm.add(7, scalar(2.5), at::scalar_tensor(-kInf));
  const auto by_norm = norm.check_all();
  ASSERT_TRUE(by_norm.has_value());
  EXPECT_NE(by_norm->find("iteration 7: the gradient norm is not finite (lm loss 2.5, grad norm -inf)"), std::string::npos) << *by_norm;

  DivergenceCheck off(/*enabled=*/false, at::kCPU);
  off.add(1, scalar(kNaN), at::scalar_tensor(kNaN));
  EXPECT_FALSE(off.check_all().has_value());
}

// A learning rate of 1e4 drives the tiny model's gradient norm to NaN within a few steps.
std::vector<std::string> diverging(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--lr", "1e4", "--lr-warmup-iters", "2", "--train-iters", "12"});
  return test::tiny_cpu_train(extra);
}

TEST(DivergenceCheck, ADivergingRunStopsAtTheFirstNonFiniteIterationHavingSavedNothingAfterIt) {
  test::TempDir dir;
  const auto r = test::run_megatron(diverging({"--log-interval", "100", "--save", dir / "ckpt", "--save-interval", "1"}));
  EXPECT_EQ(r.status, 2) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(error: iteration (\d+): the (loss|gradient norm) is not finite)"))) << r.output;
  const int failed = std::stoi(m[1]);
  ASSERT_GT(failed, 1) << r.output;
  ASSERT_LT(failed, 12) << r.output;
  // Every iteration before it was saved (each checked first), none from it on.
  const auto tracker = test::file_lines(dir / "ckpt/latest_checkpointed_iteration.txt");
  ASSERT_EQ(tracker.size(), 1u) << r.output;
  EXPECT_EQ(std::stoi(tracker[0]), failed - 1) << r.output;
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07d", failed);
  EXPECT_FALSE(fs::exists(dir / ("ckpt/" + std::string(name)))) << r.output;
}

TEST(DivergenceCheck, TurnedOffTheStepsAreSkippedCountedAndNeverShownAsZero) {
  test::TempDir dir;
  const auto r = test::run_megatron(
      diverging({"--no-check-for-nan-in-loss-and-grad", "--log-interval", "4", "--metrics-jsonl", dir / "metrics.jsonl"}));
  ASSERT_EQ(r.status, 0) << r.output;
  // The last interval's steps were all skipped: its loss is theirs, not Megatron's 0 over none.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(iteration +12/ +12 \|[^\n]*lm loss: ([^ ]+) \|[^\n]*)"
                                                        R"(number of skipped iterations: +4 \|)")))
      << r.output;
  EXPECT_NE(m[1], "0.000000E+00") << r.output;
  // NaN as Python's json module writes and reads it, not %g's bare "nan".
  const auto lines = test::file_lines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 12u);
  EXPECT_NE(lines.back().find("\"grad_norm\": NaN,"), std::string::npos) << lines.back();
  const auto parsed = test::run_command(test::shell_quote(test::venv_python()) + " -c " +
                                        test::shell_quote("import json, math, sys\n"
                                                          "rows = [json.loads(l) for l in open(sys.argv[1])]\n"
                                                          "print(sum(math.isnan(r['grad_norm']) for r in rows))") +
                                        " " + test::shell_quote(dir / "metrics.jsonl"));
  ASSERT_EQ(parsed.status, 0) << parsed.output;
  EXPECT_GE(std::stoi(parsed.output), 4) << parsed.output;
}

}  // namespace
}  // namespace megatron
