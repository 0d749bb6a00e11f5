// Learning-rate schedules against megatron-core's own OptimizerParamScheduler (run from the
// project venv): warm-up from --lr-warmup-init, then each decay style, at every step.
#include <gtest/gtest.h>

#include <sstream>

#include "optim/lr_schedule.h"
#include "support/test_support.h"

namespace megatron {
namespace {

struct Case {
  std::string style;
  int warmup, decay, wsd_iters;
  std::string wsd_style;
};

class LrSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(LrSchedule, MatchesMegatronCore) {
  const Case c = GetParam();
  const int steps = c.decay + 5;  // past the end of the decay too
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  auto ref = test::run_command(test::shell_quote(python) + " " +
                               test::shell_quote(test::source_dir() + "/tests/optim/megatron_lr_reference.py") + " " +
                               c.style + " " + std::to_string(c.warmup) + " " + std::to_string(c.decay) + " " +
                               std::to_string(c.wsd_iters) + " " + c.wsd_style + " " + std::to_string(steps) + " 2>/dev/null");
  ASSERT_EQ(ref.status, 0) << ref.output;
  TrainConfig t;
  t.lr = 3e-4;
  t.min_lr = 3e-5;
  t.lr_warmup_init = 1e-5;
  t.lr_warmup_iters = c.warmup;
  t.lr_decay_iters = c.decay;
  t.lr_decay_style = c.style;
  t.lr_wsd_decay_iters = c.wsd_iters;
  t.lr_wsd_decay_style = c.wsd_style;
  LearningRateSchedule schedule(t);
  std::istringstream lines(ref.output);
  int step = 0;
  for (double expected; lines >> expected; ++step) {
    EXPECT_NEAR(schedule.at(step), expected, 1e-12 + 1e-9 * expected) << c.style << " step " << step;
  }
  EXPECT_EQ(step, steps + 1) << ref.output;
}

INSTANTIATE_TEST_SUITE_P(Styles, LrSchedule,
                         ::testing::Values(Case{"constant", 3, 20, 0, "linear"}, Case{"linear", 4, 20, 0, "linear"},
                                           Case{"cosine", 5, 30, 0, "linear"}, Case{"inverse-square-root", 4, 20, 0, "linear"},
                                           Case{"WSD", 3, 30, 10, "linear"}, Case{"WSD", 3, 30, 10, "cosine"},
                                           Case{"WSD", 3, 30, 10, "exponential"}, Case{"WSD", 0, 30, 8, "minus_sqrt"}),
                         [](const auto& info) {
                           std::string name = info.param.style + "_" + info.param.wsd_style;
                           for (auto& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace megatron
