// fp16 with loss scaling and the precision-aware optimizer (issue #24), on tiny CPU runs:
//  - fp16's default dynamic scale (2^32) overflows at once: those steps are skipped (Megatron's
//    line shows the scale and no grad norm, the learning-rate schedule does not advance), the
//    scale backs off as Megatron's DynamicGradScaler does, and the loss then falls; a short
//    growth window brings the scale up to an overflow again mid-run, skipped and recovered from;
//  - fp16 losses follow fp32's at least as closely as bf16's do, the MoE router's losses too
//    (their gradients scaled with the loss);
//  - an fp16 run stopped and resumed (the scaler and the skipped samples in the checkpoint) is bit
//    for bit the run that was not stopped, and TP=2 x DP=2 over Gloo reproduces one process;
//  - bf16 Adam moments (--use-precision-aware-optimizer): held in bf16 in the checkpoint, resumed
//    bit for bit, resharded from DP=2 with the distributed optimizer, within bf16 noise of fp32
//    moments; the flags Megatron accepts but this does not build are refused by name.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "support/test_support.h"

namespace megatron {
namespace {

std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--log-interval", "1"});
  return test::tiny_cpu_train(extra);
}

// One iteration's log line (--log-interval 1).
struct Line {
  int64_t iteration = 0;
  double lr = 0, loss = 0, scale = 0;
  std::optional<double> grad_norm;  // none: the update was skipped
  int64_t skipped = 0, nan = 0;
};

std::vector<Line> log_lines(const std::string& output) {
  std::vector<Line> out;
  const std::regex line(R"( iteration +(\d+)/ *\d+ \|[^\n]*learning rate: ([0-9.E+-]+) \|[^\n]*lm loss: ([0-9.E+-]+) \| )"
                        R"(loss scale: ([0-9.]+) \|( grad norm: ([0-9.]+) \|)? number of skipped iterations: +(\d+) \| )"
                        R"(number of nan iterations: +(\d+) \|)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    Line l;
    l.iteration = std::stoll(m[1]);
    l.lr = std::stod(m[2]);
    l.loss = std::stod(m[3]);
    l.scale = std::stod(m[4]);
    if (m[6].matched) l.grad_norm = std::stod(m[6]);
    l.skipped = std::stoll(m[7]);
    l.nan = std::stoll(m[8]);
    out.push_back(l);
  }
  return out;
}

using test::file_lines;

TEST(Fp16Training, OverflowsAreSkippedTheScaleBacksOffAndTrainingGoesOn) {
  const auto r = test::run_megatron(tiny({"--fp16", "--train-iters", "40", "--lr-warmup-iters", "2"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("fp16 (fp32 master weights and gradients, dynamic loss scale from 4.29497e+09)"), std::string::npos)
      << r.output;
  const std::vector<Line> lines = log_lines(r.output);
  ASSERT_EQ(lines.size(), 40u) << r.output;
  // 2^32 overflows fp16: the first step is skipped, the scale kept once (hysteresis 2), then halved
  // on every further overflow until the gradients fit.
  EXPECT_EQ(lines[0].skipped, 1);
  EXPECT_FALSE(lines[0].grad_norm) << "a skipped step has no grad norm in Megatron's line";
  EXPECT_EQ(lines[0].scale, 4294967296.0);
  EXPECT_EQ(lines[1].scale, 2147483648.0);
  size_t first_applied = 0;
  while (first_applied < lines.size() && lines[first_applied].skipped == 1) ++first_applied;
  ASSERT_GT(first_applied, 2u) << r.output;
  ASSERT_LT(first_applied, 25u) << r.output;
  for (size_t i = 1; i < first_applied; ++i) {
    EXPECT_EQ(lines[i].scale, lines[i - 1].scale / 2.0) << "iteration " << i + 1;
    EXPECT_EQ(lines[i].lr, lines[0].lr) << "the schedule counts applied steps only (iteration " << i + 1 << ")";
  }
  EXPECT_TRUE(lines[first_applied].grad_norm.has_value());
  EXPECT_NE(lines[first_applied].lr, lines[0].lr) << "the first applied step advances the schedule";
  for (const Line& l : lines) EXPECT_EQ(l.nan, 0) << "overflowing gradients, not a non-finite loss";
  // Applied from then on at the settled scale, and learning.
  const double first = lines[first_applied].loss, last = lines.back().loss;
  EXPECT_LT(last, first - 1.0) << r.output;

  // A growth window of 2 with no hysteresis: the scale doubles every two applied steps until it
  // overflows again, is halved at once, and training goes on past each of those skips.
  const auto g = test::run_megatron(tiny({"--fp16", "--train-iters", "30", "--lr-warmup-iters", "2", "--initial-loss-scale", "1024",
                                          "--loss-scale-window", "2", "--hysteresis", "1"}));
  ASSERT_EQ(g.status, 0) << g.output;
  const std::vector<Line> grown = log_lines(g.output);
  ASSERT_EQ(grown.size(), 30u) << g.output;
  int mid_run_skips = 0;
  for (size_t i = 1; i < grown.size(); ++i) {
    if (grown[i].skipped == 0) continue;
    ++mid_run_skips;
    EXPECT_EQ(grown[i].scale, grown[i - 1].scale / 2) << "iteration " << i + 1;
    EXPECT_EQ(grown[i].lr, grown[i - 1].lr) << "iteration " << i + 1;
    if (i + 1 < grown.size()) EXPECT_EQ(grown[i + 1].skipped, 0) << "recovered at iteration " << i + 2;
  }
  EXPECT_GE(mid_run_skips, 2) << g.output;
  EXPECT_GT(grown[2].scale, 1024.0) << "grown after two steps";
  EXPECT_LT(grown.back().loss, grown.front().loss - 1.0) << g.output;
}

TEST(Fp16Training, FollowsFp32AtLeastAsCloselyAsBf16) {
  test::TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "20", "--metrics-jsonl", dir / (name + ".jsonl")});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return test::jsonl_series(dir / (name + ".jsonl"));
  };
  const std::vector<double> fp32 = run("fp32", {}), bf16 = run("bf16", {"--bf16"});
  const std::vector<double> fp16 = run("fp16", {"--fp16", "--initial-loss-scale", "4096"});
  ASSERT_EQ(fp32.size(), 20u);
  ASSERT_EQ(fp16.size(), 20u);
  const double fp16_error = test::largest_relative_difference(fp16, fp32), bf16_error = test::largest_relative_difference(bf16, fp32);
  std::printf("largest relative loss difference from fp32 over 20 steps: fp16 %.3e, bf16 %.3e\n", fp16_error, bf16_error);
  EXPECT_GT(fp16_error, 0.0) << "fp16 computes in fp16";
  EXPECT_LT(fp16_error, 1e-2);
  EXPECT_LE(fp16_error, bf16_error) << "fp16 keeps 3 more mantissa bits than bf16";
}

// The MoE router's losses ride on activations into backward: under --fp16 their gradient must be
// the loss scale's multiple too, or the optimizer's unscaling shrinks it 4096-fold (z_loss then
// drifts to 1.97 by step 12 instead of 1.74). fp16 follows fp32 in the balancing and z losses.
TEST(Fp16Training, RouterLossesAreScaledWithTheLoss) {
  auto terms = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "12", "--lr-warmup-iters", "1", "--num-experts", "4", "--moe-router-topk", "2",
                               "--moe-ffn-hidden-size", "32", "--moe-aux-loss-coeff", "0.1", "--moe-z-loss-coeff", "0.01",
                               "--hidden-dropout", "0", "--attention-dropout", "0"});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    std::vector<std::pair<double, double>> out;  // (load_balancing_loss, z_loss) per iteration
    const std::regex line(R"(load_balancing_loss: ([0-9.E+-]+) \| z_loss: ([0-9.E+-]+) \|)");
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line); it != std::sregex_iterator(); ++it) {
      out.emplace_back(std::stod((*it)[1]), std::stod((*it)[2]));
    }
    return out;
  };
  const auto fp32 = terms({}), fp16 = terms({"--fp16", "--initial-loss-scale", "4096"});
  ASSERT_EQ(fp32.size(), 12u);
  ASSERT_EQ(fp16.size(), 12u);
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(fp16[i].first, fp32[i].first, 1e-3 * fp32[i].first) << "load balancing, iteration " << i + 1;
    EXPECT_NEAR(fp16[i].second, fp32[i].second, 2e-3 * fp32[i].second) << "z loss, iteration " << i + 1;
  }
}

TEST(Fp16Training, ResumesBitForBitWithTheScalerAndTheSkippedSamples) {
  test::TempDir dir;
  // Skips early and mid-run (a growth window of 2), so both halves hold some.
  const std::vector<std::string> flags = {"--fp16", "--initial-loss-scale", "8388608", "--loss-scale-window", "2", "--hysteresis", "1",
                                          "--lr-warmup-iters", "3"};
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), flags.begin(), flags.end());
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  const std::string straight = run({"--train-iters", "12", "--metrics-jsonl", dir / "straight.jsonl"});
  run({"--train-iters", "12", "--exit-interval", "6", "--save", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"});
  const nlohmann::json state = read_checkpoint_state(latest_checkpoint_directory(dir / "ckpt"));
  ASSERT_TRUE(state.contains("grad_scaler")) << state.dump();
  EXPECT_GT(state["grad_scaler"]["scale"].get<double>(), 0.0);
  const std::string resumed = run({"--train-iters", "12", "--load", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"});
  EXPECT_EQ(file_lines(dir / "resumed.jsonl"), file_lines(dir / "straight.jsonl"));
  const std::vector<Line> a = log_lines(straight), b = log_lines(resumed);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 6u);
  int skipped_before = 0, skipped_after = 0;
  for (size_t i = 0; i < a.size(); ++i) (i < 6 ? skipped_before : skipped_after) += int(a[i].skipped);
  EXPECT_GT(skipped_before, 0) << straight;
  EXPECT_GT(skipped_after, 0) << straight;
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i].scale, a[i + 6].scale) << "iteration " << i + 7;
    EXPECT_EQ(b[i].lr, a[i + 6].lr) << "iteration " << i + 7;
  }
}

TEST(Fp16Training, TensorAndDataParallelReproduceOneProcess) {
  test::TempDir dir;
  // 255 + 1 rows pad to 256 at TP=1 and TP=2 alike: the same model.
  const std::vector<std::string> model = {"--vocab-size", "255", "--hidden-dropout", "0", "--attention-dropout", "0"};
  const std::vector<std::string> launch4 = {"launch", "--nproc-per-node", "4", "--master-port", "0"};
  const std::vector<std::string> layout = {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"};
  auto run = [&](const std::vector<std::string>& launch, std::vector<std::string> extra) {
    std::vector<std::string> args = launch;
    extra.insert(extra.end(), model.begin(), model.end());
    for (const auto& a : tiny(extra)) args.push_back(a);
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  // A scale that grows every three steps and stays clear of overflow (which, near the threshold,
  // rounding may tip either way): the same losses and scales.
  const std::vector<std::string> growing = {"--fp16", "--train-iters", "12", "--initial-loss-scale", "65536", "--loss-scale-window", "3"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::string single = run({}, with(growing, {"--metrics-jsonl", dir / "single.jsonl"}));
  const std::string parallel = run(launch4, with(with(growing, layout), {"--metrics-jsonl", dir / "parallel.jsonl"}));
  const std::vector<double> want = test::jsonl_series(dir / "single.jsonl"), got = test::jsonl_series(dir / "parallel.jsonl");
  ASSERT_EQ(want.size(), 12u) << single;
  ASSERT_EQ(got.size(), 12u) << parallel;
  const double difference = test::largest_relative_difference(got, want);
  std::printf("fp16, TP=2 + SP x DP=2 against one process: largest relative loss difference %.3e\n", difference);
  EXPECT_LT(difference, 2e-3);
  const std::vector<Line> a = log_lines(single), b = log_lines(parallel);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].scale, b[i].scale) << "iteration " << i + 1;
  EXPECT_GT(a.back().scale, 65536.0) << "the scale grew";

  // From 2^32, overflowing: every rank skips the same steps (the overflow is judged on the norm
  // over all of them), or the data-parallel replicas' weights would part.
  const std::string skipping = run(launch4, with(layout, {"--fp16", "--train-iters", "14", "--check-weight-hash-across-dp-replicas-interval", "1"}));
  const std::vector<Line> lines = log_lines(skipping);
  ASSERT_EQ(lines.size(), 14u) << skipping;
  EXPECT_EQ(lines[0].skipped, 1) << skipping;
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const Line& l) { return l.skipped == 0; })) << skipping;
  EXPECT_EQ(skipping.find("weights differ"), std::string::npos) << skipping;
}

TEST(PrecisionAwareOptimizer, Bf16MomentsCheckpointResumeAndReshard) {
  test::TempDir dir;
  const std::vector<std::string> bf16_moments = {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"};
  auto run = [&](std::vector<std::string> extra, const std::vector<std::string>& launch = {}) {
    std::vector<std::string> args = launch;
    extra.insert(extra.end(), {"--hidden-dropout", "0", "--attention-dropout", "0"});
    for (const auto& a : tiny(extra)) args.push_back(a);
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // Within bf16 noise of fp32 moments, and not the same run.
  const std::string plain = run({"--bf16", "--train-iters", "12", "--metrics-jsonl", dir / "plain.jsonl"});
  const std::string low = run(with({"--bf16", "--train-iters", "12", "--metrics-jsonl", dir / "low.jsonl"}, bf16_moments));
  EXPECT_NE(low.find("bf16 (fp32 master weights as bf16 + 16-bit remainders, Adam moments bf16/bf16)"), std::string::npos) << low;
  const std::vector<double> fp32_moments = test::jsonl_series(dir / "plain.jsonl"), bf16_losses = test::jsonl_series(dir / "low.jsonl");
  ASSERT_EQ(bf16_losses.size(), 12u);
  const double difference = test::largest_relative_difference(bf16_losses, fp32_moments);
  std::printf("bf16 against fp32 Adam moments, 12 steps: largest relative loss difference %.3e\n", difference);
  EXPECT_GT(difference, 0.0);
  EXPECT_LT(difference, 2e-2);

  // Saved in bf16, resumed bit for bit.
  run(with({"--bf16", "--train-iters", "12", "--exit-interval", "6", "--save", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"},
           bf16_moments));
  {
    SafetensorsFile optimizer(latest_checkpoint_directory(dir / "ckpt") + "/optimizer.safetensors");
    EXPECT_EQ(optimizer.load("decoder.layers.0.mlp.linear_fc1.weight.exp_avg").scalar_type(), at::kBFloat16);
    EXPECT_EQ(optimizer.load("decoder.layers.0.mlp.linear_fc1.weight.exp_avg_sq").scalar_type(), at::kBFloat16);
    EXPECT_EQ(optimizer.load("decoder.layers.0.mlp.linear_fc1.weight.master").scalar_type(), at::kFloat);
  }
  run(with({"--bf16", "--train-iters", "12", "--load", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"}, bf16_moments));
  EXPECT_EQ(file_lines(dir / "resumed.jsonl"), file_lines(dir / "low.jsonl"));

  // Saved as two data-parallel shards (fp32 weights: DP=2 is then one process to rounding), resumed
  // by one process: it goes on as the two did.
  const std::vector<std::string> launch2 = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  run(with({"--train-iters", "8", "--metrics-jsonl", dir / "dp2.jsonl", "--use-distributed-optimizer"}, bf16_moments), launch2);
  run(with({"--train-iters", "8", "--exit-interval", "4", "--save", dir / "dp2ckpt", "--use-distributed-optimizer"}, bf16_moments),
      launch2);
  run(with({"--train-iters", "8", "--load", dir / "dp2ckpt", "--metrics-jsonl", dir / "one.jsonl"}, bf16_moments));
  const std::vector<double> two = test::jsonl_series(dir / "dp2.jsonl"), one = test::jsonl_series(dir / "one.jsonl");
  ASSERT_EQ(two.size(), 8u);
  ASSERT_EQ(one.size(), 4u);
  const double resharded = test::largest_relative_difference(one, std::vector<double>(two.begin() + 4, two.end()));
  std::printf("bf16 moments resharded DP=2 -> 1: largest relative loss difference %.3e\n", resharded);
  EXPECT_LT(resharded, 1e-4);
}

TEST(MixedPrecisionFlags, AreCheckedByName) {
  auto error = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "1", "--lr-warmup-iters", "0"});
    return test::run_megatron(tiny(extra)).output;
  };
  EXPECT_NE(error({"--fp16", "--bf16"}).find("--fp16 and --bf16 exclude each other"), std::string::npos);
  EXPECT_NE(error({"--fp16", "--hysteresis", "0"}).find("--hysteresis must be a positive count"), std::string::npos);
  EXPECT_NE(error({"--fp16", "--loss-scale", "nan"}).find("--loss-scale: expected a finite number"), std::string::npos);
  EXPECT_NE(error({"--fp16", "--loss-scale", "-2"}).find("--loss-scale must be a positive number"), std::string::npos);
  EXPECT_NE(error({"--fp16", "--min-loss-scale", "8", "--initial-loss-scale", "4"}).find("--min-loss-scale 8"), std::string::npos);
  EXPECT_NE(error({"--bf16", "--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "fp8"})
                .find("--exp-avg-sq-dtype fp8 is not implemented yet"),
            std::string::npos);
  EXPECT_NE(error({"--use-precision-aware-optimizer", "--exp-avg-dtype", "int4"}).find("--exp-avg-dtype must be one of fp32, fp16, bf16, fp8"),
            std::string::npos);
  EXPECT_NE(error({"--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"}).find("--main-grads-dtype bf16 needs --bf16"),
            std::string::npos);
  // As Megatron, the dtypes mean nothing without the switch: said, and the run goes on.
  const auto r = test::run_megatron(tiny({"--train-iters", "1", "--lr-warmup-iters", "0", "--exp-avg-dtype", "bf16"}));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("> note: --exp-avg-dtype bf16 has no effect without --use-precision-aware-optimizer"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace megatron
