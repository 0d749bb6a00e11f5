// The iteration log line is Megatron-LM's, field by field and timestamp included, rendered by
// Megatron's own format specifications in Python (tests/train/megatron_log_line.py), with
// megatron.cpp's tokens/s and MFU after all of Megatron's fields, so that parsers splitting on
// '|' find every Megatron field at its index.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/test_support.h"
#include "train/log_line.h"

namespace megatron {
namespace {

std::string megatron_rendering(const nlohmann::json& values) {
  const std::string python = test::venv_python();
  EXPECT_FALSE(python.empty()) << "no reference venv: run scripts/setup.sh";
  auto r = test::run_command(test::shell_quote(python) + " " + test::shell_quote(test::source_dir() + "/tests/train/megatron_log_line.py") +
                             " " + test::shell_quote(values.dump()));
  EXPECT_EQ(r.status, 0) << r.output;
  std::string line = r.output;
  while (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}

TEST(LogLine, IsMegatronsFieldByFieldThenOurs) {
  for (int variant : {0, 1, 2}) {
    // The optional fields ride along with the second rendering; the third is an fp16 iteration
    // whose update was skipped: a loss scale, and no grad norm.
    const bool log_throughput = variant == 1, optional_fields = variant == 1, skipped = variant == 2;
    const int64_t time_us = 1796173323045678;  // 2026-12-02, a fraction of a second that needs all six digits
    IterationLog l;
    l.timestamp = megatron_timestamp(std::chrono::system_clock::time_point(std::chrono::microseconds(time_us)));
    l.log_throughput = log_throughput;
    l.iteration = 120;
    l.train_iters = 305175;
    l.consumed_samples = 960;
    l.elapsed_ms_per_iteration = 812.345;
    l.tflops_per_device = 431.26;
    l.tokens_per_second_per_device = 72069.31;
    l.mfu_percent = 43.6;
    l.learning_rate = 3.0e-4;
    l.global_batch_size = 8;
    l.lm_loss = 7.123456789;
    l.loss_terms = {{"mtp_1 loss", 7.5}, {"load_balancing_loss", 1.0073}};
    if (!skipped) l.grad_norm = 1.98765;
    if (skipped) l.loss_scale = 32768.0;
    if (optional_fields) {
      l.num_zeros = 1234.0;
      l.params_norm = 271.82818;
    }
    l.skipped_iterations = 1;
    l.nan_iterations = 1;
    nlohmann::json values = {{"time_us", time_us}, {"iteration", 120}, {"train_iters", 305175}, {"consumed", 960},
                                   {"elapsed_s", 0.812345}, {"log_throughput", log_throughput}, {"tflops", 431.26},
                                   {"lr", 3.0e-4}, {"batch", 8},
                                   {"losses", nlohmann::json::array({nlohmann::json::array({"lm loss", 7.123456789}),
                                                                     nlohmann::json::array({"mtp_1 loss", 7.5}),
                                                                     nlohmann::json::array({"load_balancing_loss", 1.0073})})},
                                   {"loss_scale", skipped ? 32768.0 : 1.0}, {"skipped", 1}, {"nan", 1}};
    if (!skipped) values["grad_norm"] = 1.98765;
    if (optional_fields) {
      values["num_zeros"] = 1234.0;
      values["params_norm"] = 271.82818;
    }
    const std::string theirs = megatron_rendering(values);
    const std::string ours = format_iteration_log(l);
    ASSERT_GT(theirs.size(), 100u) << theirs;
    EXPECT_EQ(ours.substr(0, theirs.size()), theirs) << "ours:   " << ours << "\ntheirs: " << theirs;
    EXPECT_EQ(ours.substr(theirs.size()), " throughput (tokens/s/GPU): 72069.3 | MFU: 43.6% |") << ours;
    EXPECT_EQ(ours.find(" [2026-12-0"), 0u) << ours;
    if (optional_fields) EXPECT_NE(ours.find(" num zeros: 1234.0 | params norm: 271.828 |"), std::string::npos) << ours;
    if (skipped) EXPECT_NE(ours.find(" loss scale: 32768.0 | number of skipped iterations:"), std::string::npos) << ours;
  }
}

}  // namespace
}  // namespace megatron
