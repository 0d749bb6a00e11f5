// An MoE training step captured as one CUDA graph (--cuda-graph-impl local) trains as the eager
// step: nothing in the routed path may read back to the host (the token counts, the grouped GEMM's
// group ends, the expert-bias counts all stay on the device), or the capture fails. A tiny
// Qwen2-MoE style model in bf16 (grouped GEMM, permutation kernels, shared experts behind their
// gate on a stream of their own, balancing and z losses), dropless, padded to capacity (tokens
// dropped), and with DeepSeek's sigmoid routing and its expert bias updated every step. Run on the
// GPU machine by scripts/gpu/run.sh; without a CUDA device they report a skip, never a pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "support/test_support.h"

namespace megatron {
namespace {

std::vector<std::string> moe_args(const test::TempDir& dir, const std::string& name) {
  return {"train", "--model-family", "qwen2_moe", "--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4",
          "--num-query-groups", "2", "--ffn-hidden-size", "128", "--num-experts", "8", "--moe-router-topk", "2",
          "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "64", "--moe-layer-freq", "([0]*1+[1]*2)",
          "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001", "--moe-grouped-gemm", "--moe-permute-fusion",
          "--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall", "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
          "--global-batch-size", "4", "--train-iters", "20", "--lr", "3e-3", "--lr-warmup-iters", "2", "--mock-data",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--log-interval", "1", "--eval-interval", "10",
          "--eval-iters", "1", "--hidden-dropout", "0", "--attention-dropout", "0", "--bf16", "--device", "cuda",
          "--seed", "7", "--metrics-jsonl", dir / (name + ".jsonl")};
}

TEST(MoeCudaGraph, CapturedStepTrainsAsTheEagerStep) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device; scripts/gpu/run.sh runs this there";
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"dropless", {}},
      {"padded", {"--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"}},
      {"expert_bias", {"--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-2"}},
  };
  for (const auto& [name, extra] : variants) {
    auto run = [&](const std::string& tag, std::vector<std::string> more) {
      std::vector<std::string> args = moe_args(dir, name + "_" + tag);
      args.insert(args.end(), extra.begin(), extra.end());
      args.insert(args.end(), more.begin(), more.end());
      return test::run_megatron(args);
    };
    const auto eager = run("eager", {});
    const auto graphed = run("graph", {"--cuda-graph-impl", "local", "--cuda-graph-warmup-steps", "3"});
    ASSERT_EQ(eager.status, 0) << name << "\n" << eager.output;
    ASSERT_EQ(graphed.status, 0) << name << "\n" << graphed.output;
    EXPECT_NE(graphed.output.find("CUDA graph: captured the training step at iteration 3"), std::string::npos) << graphed.output;
    std::vector<double> loss;
    for (const char* key : {"lm_loss", "load_balancing_loss", "z_loss", "grad_norm"}) {
      const std::vector<double> want = test::jsonl_series(dir / (name + "_eager.jsonl"), key),
                                got = test::jsonl_series(dir / (name + "_graph.jsonl"), key);
      ASSERT_EQ(want.size(), 20u) << name << " " << key << "\n" << eager.output;
      ASSERT_EQ(got.size(), want.size()) << name << " " << key << "\n" << graphed.output;
      if (loss.empty()) loss = want;
      const double largest = test::largest_relative_difference(got, want);
      std::printf("%s, %s: largest relative difference, graph replay vs eager: %.3e\n", name.c_str(), key, largest);
      EXPECT_LE(largest, 2e-3) << name << " " << key << "\n" << graphed.output;
    }
    EXPECT_LT(loss.back(), loss.front() - 0.1) << name << ": the run must train, or the comparison says little";
  }
}

}  // namespace
}  // namespace megatron
