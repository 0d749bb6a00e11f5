// fp16's dynamic loss scale follows Megatron-Core's DynamicGradScaler step for step (the class
// itself, run in Python by tests/optim/megatron_grad_scaler.py): backing off only once the
// hysteresis is spent, then on every overflow, not below the floor; doubling after a window of
// finite steps, which restores the hysteresis. A constant scale never moves.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <sstream>

#include "optim/grad_scaler.h"
#include "support/test_support.h"

namespace megatron {
namespace {

TEST(GradScaler, FollowsMegatronsDynamicGradScaler) {
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  struct Case {
    double initial, minimum, window;
    int64_t hysteresis;
    std::string flags;  // one per step: 1 = the gradients overflowed
  };
  const Case cases[] = {
      {4294967296.0, 1.0, 1000, 2, "1111111100000"},      // the start of every fp16 run: backing off
      {65536.0, 1.0, 3, 2, "0001000100110000111"},       // growth, an isolated overflow, growth again
      {8.0, 2.0, 2, 1, "111110011"},                      // the floor holds
      {1024.0, 1.0, 4, 3, "1101100001111"},               // hysteresis restored by growth only
  };
  std::string command = test::shell_quote(python) + " " + test::shell_quote(test::source_dir() + "/tests/optim/megatron_grad_scaler.py");
  for (const Case& c : cases) {
    command += " " + std::to_string(c.initial) + "," + std::to_string(c.minimum) + "," + std::to_string(c.window) + "," +
               std::to_string(c.hysteresis) + "," + c.flags;
  }
  auto r = test::run_command(command);
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream theirs(r.output);
  for (const Case& c : cases) {
    TrainConfig t;
    t.fp16 = true;
    t.initial_loss_scale = c.initial;
    t.min_loss_scale = c.minimum;
    t.loss_scale_window = c.window;
    t.hysteresis = c.hysteresis;
    GradScaler scaler(t, at::kCPU);
    for (size_t i = 0; i < c.flags.size(); ++i) {
      scaler.update(at::full({}, c.flags[i] == '1', at::kBool));
      double scale = 0, growth = 0, hysteresis = 0;
      ASSERT_TRUE(theirs >> scale >> growth >> hysteresis) << r.output;
      const GradScalerState ours = scaler.state();
      EXPECT_EQ(ours.scale, scale) << c.flags << " step " << i;
      EXPECT_EQ(ours.growth_tracker, growth) << c.flags << " step " << i;
      EXPECT_EQ(ours.hysteresis_tracker, hysteresis) << c.flags << " step " << i;
      EXPECT_EQ(scaler.scale().item<double>(), scale);
    }
  }
}

TEST(GradScaler, ConstantScaleNeverMovesAndStateRoundTrips) {
  TrainConfig t;
  t.fp16 = true;
  t.loss_scale = 512.0;
  GradScaler constant(t, at::kCPU);
  EXPECT_FALSE(constant.dynamic());
  for (bool overflow : {true, true, false, true}) constant.update(at::full({}, overflow, at::kBool));
  EXPECT_EQ(constant.scale().item<double>(), 512.0);

  TrainConfig d;
  d.fp16 = true;
  GradScaler a(d, at::kCPU), b(d, at::kCPU);
  for (bool overflow : {true, true, true, false}) a.update(at::full({}, overflow, at::kBool));
  b.load_state(a.state());
  for (bool overflow : {true, false, true}) {
    a.update(at::full({}, overflow, at::kBool));
    b.update(at::full({}, overflow, at::kBool));
    EXPECT_EQ(a.state().scale, b.state().scale);
    EXPECT_EQ(a.state().hysteresis_tracker, b.state().hysteresis_tracker);
  }
}

}  // namespace
}  // namespace megatron
