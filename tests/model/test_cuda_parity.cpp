// The model on CUDA against the same model on CPU (run on the GPU machine by scripts/gpu/run.sh;
// without a CUDA device these tests report a skip, never a pass).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/gpt_model.h"
#include "support/model_configs.h"
#include "support/test_support.h"

namespace megatron {
namespace {

ModelConfig small_llama() { return test::small_llama({128, 8, 2, 256, 64, 512}); }

double relative(const at::Tensor& a, const at::Tensor& b) {
  return ((a.cpu().to(at::kDouble) - b.cpu().to(at::kDouble)).norm() / b.cpu().to(at::kDouble).norm()).item<double>();
}

TEST(CudaParity, LossAndGradientsMatchCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::globalContext().setAllowTF32CuBLAS(false);
  const ModelConfig c = small_llama();
  GPTModel cpu(c), gpu(c);
  cpu.initialize(11);
  gpu.initialize(11);
  gpu.to(at::Device(at::kCUDA, 0));
  Batch batch{at::randint(0, c.vocab_size, {4, c.seq_length}), at::randint(0, c.vocab_size, {4, c.seq_length}),
              at::ones({4, c.seq_length})};
  Batch on_gpu{batch.tokens.cuda(), batch.labels.cuda(), batch.loss_mask.cuda()};
  at::Tensor loss_cpu = cpu.loss(batch), loss_gpu = gpu.loss(on_gpu);
  loss_cpu.backward();
  loss_gpu.backward();
  EXPECT_NEAR(loss_cpu.item<double>(), loss_gpu.item<double>(), 1e-4);
  auto pc = cpu.named_parameters(), pg = gpu.named_parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_LE(relative(pg[i].value().grad(), pc[i].value().grad()), 1e-3) << pc[i].key();
  }
}

TEST(CudaParity, Bf16LossCloseToFp32) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  const ModelConfig c = small_llama();
  GPTModel fp32(c), bf16(c);
  fp32.initialize(3);
  bf16.initialize(3);
  fp32.to(at::Device(at::kCUDA, 0));
  bf16.to(at::Device(at::kCUDA, 0), at::kBFloat16);
  Batch batch{at::randint(0, c.vocab_size, {4, c.seq_length}).cuda(), at::randint(0, c.vocab_size, {4, c.seq_length}).cuda(),
              at::ones({4, c.seq_length}).cuda()};
  at::NoGradGuard no_grad;
  EXPECT_NEAR(fp32.loss(batch).item<double>(), bf16.loss(batch).item<double>(), 2e-2);
}

TEST(CudaParity, TrainingOnCudaLowersTheLoss) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  auto run = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                 "--device", "cuda", "--bf16", "--train-iters", "50", "--log-interval", "10"});
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("on cuda:0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("validation loss at iteration 50"), std::string::npos) << run.output;
}

// The step replayed from a CUDA graph trains as the eager step does. The learning rate changes
// every iteration (warm-up, then cosine decay) and every iteration has a new batch: a graph that
// had either baked in would drift off the eager losses. Two micro-batches per step (the first
// overwrites the gradient buffer, the second adds to it); a validation run between replays.
TEST(CudaParity, CudaGraphStepTrainsAsTheEagerStep) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  const std::vector<std::string> args = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                         "--device", "cuda", "--bf16", "--train-iters", "30", "--log-interval", "1",
                                         "--eval-interval", "10", "--hidden-dropout", "0", "--attention-dropout", "0"};
  auto eager = test::run_megatron(args);
  std::vector<std::string> graph_args = args;
  for (const char* flag : {"--cuda-graph-impl", "local", "--cuda-graph-warmup-steps", "3"}) graph_args.push_back(flag);
  auto graphed = test::run_megatron(graph_args);
  ASSERT_EQ(eager.status, 0) << eager.output;
  ASSERT_EQ(graphed.status, 0) << graphed.output;
  EXPECT_NE(graphed.output.find("CUDA graph: captured the training step at iteration 3"), std::string::npos)
      << graphed.output;
  const std::vector<double> expected = test::logged_losses(eager.output), got = test::logged_losses(graphed.output);
  ASSERT_EQ(expected.size(), 30u) << eager.output;
  ASSERT_EQ(got.size(), expected.size()) << graphed.output;
  const double largest = test::largest_relative_difference(got, expected);
  std::printf("largest relative loss difference, graph replay vs eager: %.3e\n", largest);
  EXPECT_LE(largest, 2e-3) << graphed.output;
  EXPECT_LT(expected.back(), expected.front() - 0.1) << "the run must train, or the comparison says little";
}

// --overlap-optimizer-step trains as the serial step: eagerly (the next forward waits for each
// bucket's update) and captured as a CUDA graph (the capture joins the update stream). Two
// micro-batches per step and a validation run between steps, as above.
TEST(CudaParity, OverlappedOptimizerStepTrainsAsTheSerialStep) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  const std::vector<std::string> args = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                         "--device", "cuda", "--bf16", "--train-iters", "30", "--log-interval", "1",
                                         "--eval-interval", "10", "--hidden-dropout", "0", "--attention-dropout", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = args;
    all.insert(all.end(), extra.begin(), extra.end());
    return test::run_megatron(all);
  };
  auto serial = with({});
  ASSERT_EQ(serial.status, 0) << serial.output;
  const std::vector<double> expected = test::logged_losses(serial.output);
  ASSERT_EQ(expected.size(), 30u) << serial.output;
  EXPECT_LT(expected.back(), expected.front() - 0.1) << "the run must train, or the comparison says little";
  for (const auto& extra : {std::vector<std::string>{"--overlap-optimizer-step"},
                            std::vector<std::string>{"--overlap-optimizer-step", "--cuda-graph-impl", "local"}}) {
    auto run = with(extra);
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_NE(run.output.find("> optimizer step: on a stream of its own"), std::string::npos) << run.output;
    const std::vector<double> got = test::logged_losses(run.output);
    ASSERT_EQ(got.size(), expected.size()) << run.output;
    const double largest = test::largest_relative_difference(got, expected);
    std::printf("largest relative loss difference, %s vs the serial step: %.3e\n", extra.back().c_str(), largest);
    EXPECT_LE(largest, 2e-3) << run.output;
  }
}

// --fp16 (the fused kernels on fp16 tensors, loss scaling) and the precision-aware optimizer's bf16
// moments (the fused AdamW kernel reading and writing them) train on CUDA as fp32 does, within
// their rounding: the tiny model, 30 steps, the fp16 run starting at a scale that does not overflow.
TEST(CudaParity, Fp16AndBf16MomentsTrainAsFp32) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  const std::vector<std::string> args = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                         "--device", "cuda", "--train-iters", "30", "--log-interval", "1", "--eval-interval", "0",
                                         "--hidden-dropout", "0", "--attention-dropout", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = args;
    all.insert(all.end(), extra.begin(), extra.end());
    return test::run_megatron(all);
  };
  const auto fp32 = with({});
  ASSERT_EQ(fp32.status, 0) << fp32.output;
  const std::vector<double> expected = test::logged_losses(fp32.output);
  ASSERT_EQ(expected.size(), 30u) << fp32.output;
  EXPECT_LT(expected.back(), expected.front() - 0.1) << "the run must train, or the comparison says little";
  for (const auto& extra : {std::vector<std::string>{"--fp16", "--initial-loss-scale", "4096"},
                            std::vector<std::string>{"--bf16", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                                                     "--exp-avg-sq-dtype", "bf16", "--main-grads-dtype", "bf16"}}) {
    const auto run = with(extra);
    ASSERT_EQ(run.status, 0) << run.output;
    const std::vector<double> got = test::logged_losses(run.output);
    ASSERT_EQ(got.size(), expected.size()) << run.output;
    const double largest = test::largest_relative_difference(got, expected);
    std::printf("largest relative loss difference, %s vs fp32 on CUDA: %.3e\n", extra.front().c_str(), largest);
    EXPECT_LE(largest, 3e-2) << run.output;
    EXPECT_EQ(run.output.find("number of skipped iterations:   1"), std::string::npos) << "nothing skipped\n" << run.output;
  }
}

}  // namespace
}  // namespace megatron
