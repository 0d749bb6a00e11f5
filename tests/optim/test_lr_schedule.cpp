// Learning-rate schedules against megatron-core's own OptimizerParamScheduler (run from the
// project venv): warm-up from --lr-warmup-init, then each decay style, at every iteration; by
// iterations and by samples (--train-samples with --lr-*-samples, where the batch need not divide
// them), and with --lr-warmup-fraction.
#include <gtest/gtest.h>

#include <sstream>

#include "optim/lr_schedule.h"
#include "support/test_support.h"

namespace megatron {
namespace {

struct Case {
  std::string style;
  int warmup, decay, wsd_iters;  // iterations, or samples when `samples`
  std::string wsd_style;
  int batch = 1;                 // global batch size: the scheduler's step per iteration
  bool samples = false;
  double fraction = -1;          // --lr-warmup-fraction
};

class LrSchedule : public ::testing::TestWithParam<Case> {};

TEST_P(LrSchedule, MatchesMegatronCore) {
  const Case c = GetParam();
  const int steps = (c.samples ? c.decay / c.batch : c.decay) + 5;  // past the end of the decay too
  // What Megatron hands its scheduler: everything in samples.
  const int unit = c.samples ? 1 : c.batch;
  const double decay_steps = double(c.decay) * unit;
  const double warmup_steps = c.fraction >= 0 ? c.fraction * decay_steps : double(c.warmup) * unit;
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  std::ostringstream warmup_text;
  warmup_text.precision(17);
  warmup_text << warmup_steps;
  auto ref = test::run_command(test::shell_quote(python) + " " +
                               test::shell_quote(test::source_dir() + "/tests/optim/megatron_lr_reference.py") + " " +
                               c.style + " " + warmup_text.str() + " " + std::to_string(c.decay * unit) + " " +
                               std::to_string(c.wsd_iters * unit) + " " + c.wsd_style + " " + std::to_string(steps) + " " +
                               std::to_string(c.batch) + " 2>/dev/null");
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
  t.global_batch_size = c.batch;
  t.lr_warmup_fraction = c.fraction;
  if (c.samples) {
    t.train_samples = c.decay;
    t.lr_decay_samples = c.decay;
    t.lr_warmup_samples = c.warmup;
    t.lr_wsd_decay_samples = c.wsd_iters;
    t.lr_decay_iters = t.lr_warmup_iters = t.lr_wsd_decay_iters = 0;
  }
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
                                           Case{"WSD", 3, 30, 10, "exponential"}, Case{"WSD", 0, 30, 8, "minus_sqrt"},
                                           // by samples, the batch dividing none of them
                                           Case{"cosine", 20, 100, 0, "linear", 8, true},
                                           Case{"WSD", 13, 150, 45, "cosine", 6, true},
                                           Case{"inverse-square-root", 0, 100, 0, "linear", 8, true},
                                           Case{"inverse-square-root", 0, 20, 0, "linear", 4},
                                           // --lr-warmup-fraction: 0.3 x 80 samples = 24, 0.13 x 97 = 12.61
                                           Case{"linear", 0, 20, 0, "linear", 4, false, 0.3},
                                           Case{"cosine", 0, 97, 0, "linear", 5, true, 0.13}),
                         [](const auto& info) {
                           std::string name = info.param.style + "_" + info.param.wsd_style + "_batch" +
                                              std::to_string(info.param.batch) + (info.param.samples ? "_samples" : "") +
                                              (info.param.fraction >= 0 ? "_fraction" : "");
                           for (auto& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace megatron
