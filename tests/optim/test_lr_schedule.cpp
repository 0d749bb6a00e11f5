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

// --weight-decay-incr-style: megatron-core's get_wd at every iteration, past the end of the run too
// (an interrupted run resumed with more iterations keeps --end-weight-decay).
TEST(WeightDecaySchedule, MatchesMegatronCore) {
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  struct WdCase {
    std::string style;
    double start, end;
    int iters, batch;
    int samples = 0;  // --train-samples instead of --train-iters
  };
  const WdCase cases[] = {{"constant", 0.1, 0.1, 10, 4}, {"linear", 0.0, 0.1, 20, 4}, {"cosine", 0.05, 0.3, 16, 3},
                          {"cosine", 0.0, 0.2, 0, 7, 100}, {"linear", 0.02, 0.1, 0, 6, 45}};
  auto steps_of = [](const WdCase& c) {
    const int incr_steps = c.samples > 0 ? c.samples : c.iters * c.batch;
    return std::make_pair(incr_steps, incr_steps / c.batch + 4);
  };
  // Every case in one run (megatron-core imported once).
  std::ostringstream args;
  args.precision(17);
  for (const WdCase& c : cases) {
    const auto [incr_steps, steps] = steps_of(c);
    args << " " << c.style << "," << c.start << "," << c.end << "," << incr_steps << "," << steps << "," << c.batch;
  }
  auto ref = test::run_command(test::shell_quote(python) + " " +
                               test::shell_quote(test::source_dir() + "/tests/optim/megatron_wd_reference.py") + args.str() +
                               " 2>/dev/null");
  ASSERT_EQ(ref.status, 0) << ref.output;
  std::istringstream lines(ref.output);
  for (const WdCase& c : cases) {
    TrainConfig t;
    t.weight_decay_incr_style = c.style;
    if (c.style == "constant") {
      t.weight_decay = c.start;
    } else {
      t.weight_decay = 0.7;  // not used by linear or cosine
      t.start_weight_decay = c.start;
      t.end_weight_decay = c.end;
    }
    t.global_batch_size = c.batch;
    t.train_iters = c.iters;
    t.train_samples = c.samples;
    const WeightDecaySchedule schedule(t);
    const int steps = steps_of(c).second;
    for (int step = 0; step <= steps; ++step) {
      double expected = 0;
      ASSERT_TRUE(lines >> expected) << c.style << " step " << step << "\n" << ref.output;
      EXPECT_NEAR(schedule.at_samples(int64_t(step) * c.batch), expected, 1e-15 + 1e-12 * expected) << c.style << " step " << step;
    }
  }
  double extra = 0;
  EXPECT_FALSE(lines >> extra) << "more lines than steps:\n" << ref.output;
}

}  // namespace
}  // namespace megatron
