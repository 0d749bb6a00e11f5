// FP8 training (issue #24) on tiny CPU runs, through at::_scaled_mm's CPU FP8 GEMM:
//  - each recipe (tensorwise, delayed with a history, blockwise) trains and stays within a few
//    percent of bf16's losses from the same initialisation; the start-up line says what runs;
//  - the delayed recipe's amax histories and scales are saved (fp8_ppPPP.safetensors, by layer
//    name) and a stopped run resumes bit for bit; a run saved with two pipeline stages resumes at
//    one process with every layer's state found;
//  - the MoE experts' FP8 grouped GEMMs train as bf16's experts do;
//  - bad combinations are refused by flag name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "support/test_support.h"

namespace megatron {
namespace {

// hidden 128 and ffn 256 make every GEMM dimension a multiple of 128 (blockwise tiles); 64 x 4
// tokens per micro-batch as well.
std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--log-interval", "1", "--hidden-size", "128",
                               "--ffn-hidden-size", "256", "--bf16", "--hidden-dropout", "0", "--attention-dropout", "0"});
  return test::tiny_cpu_train(extra);
}

using test::file_lines;

double mean_of_last(const std::vector<double>& v, size_t n) {
  return std::accumulate(v.end() - long(n), v.end(), 0.0) / double(n);
}

TEST(Fp8Training, EachRecipeTracksBf16) {
  auto run = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "30"});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return r;
  };
  const auto bf16 = run({});
  const std::vector<double> reference = test::logged_losses(bf16.output);
  ASSERT_EQ(reference.size(), 30u) << bf16.output;
  struct Case {
    std::vector<std::string> flags;
    const char* line;
  };
  const Case cases[] = {
      {{"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}, "> FP8 GEMMs: e4m3 (e4m3), tensor-wise current scaling, layers 0-1"},
      {{"--fp8-format", "hybrid", "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max"},
       "> FP8 GEMMs: hybrid (e4m3 forward, e5m2 gradients), delayed scaling (amax history 16, max, margin 0, reduced over TP x DP), layers 0-1"},
      {{"--fp8-format", "e4m3", "--fp8-recipe", "blockwise"}, "blockwise scaling (1x128 activations, 128x128 weights), layers 0-1"},
      {{"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "1",
        "--num-layers-at-end-in-bf16", "0"},
       "tensor-wise current scaling, layers 1-1"},
  };
  for (const Case& c : cases) {
    const auto r = run(c.flags);
    EXPECT_NE(r.output.find(c.line), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("FP8 on the CPU: the FP8 values multiply in fp32 GEMMs"), std::string::npos);
    const std::vector<double> losses = test::logged_losses(r.output);
    ASSERT_EQ(losses.size(), 30u) << r.output;
    const double first = reference.front(), end = mean_of_last(reference, 5), got = mean_of_last(losses, 5);
    std::printf("%s %s: last five losses %.4f, bf16 %.4f (first %.4f)\n", c.flags[1].c_str(), c.flags.size() > 3 ? c.flags[3].c_str() : "delayed",
                got, end, first);
    EXPECT_LT(got, first - 1.0) << "learns";
    EXPECT_NEAR(got, end, 0.03 * end) << r.output;
    EXPECT_NE(losses, reference) << "the GEMMs ran in FP8";
  }
}

// The MoE experts' FP8 grouped GEMMs (fp8/grouped.h) in a whole run: 4 experts, top-2, the
// delayed recipe for the other layers; the notice says how the experts scale.
TEST(Fp8Training, MoeExpertsTrackBf16) {
  auto run = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "30", "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "64",
                               "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-2"});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return r;
  };
  const auto bf16 = run({});
  const auto fp8 = run({"--fp8-format", "hybrid"});
  EXPECT_NE(fp8.output.find("the MoE layers' experts run FP8 grouped GEMMs scaled per row"), std::string::npos) << fp8.output;
  const std::vector<double> reference = test::logged_losses(bf16.output), losses = test::logged_losses(fp8.output);
  ASSERT_EQ(reference.size(), 30u) << bf16.output;
  ASSERT_EQ(losses.size(), 30u) << fp8.output;
  const double first = reference.front(), end = mean_of_last(reference, 5), got = mean_of_last(losses, 5);
  std::printf("MoE FP8: last five losses %.4f, bf16 %.4f (first %.4f)\n", got, end, first);
  EXPECT_LT(got, first - 1.0) << "learns";
  EXPECT_NEAR(got, end, 0.03 * end) << fp8.output;
  EXPECT_NE(losses, reference) << "the GEMMs ran in FP8";
}

TEST(Fp8Training, DelayedScalingStateIsSavedAndResumedBitForBit) {
  test::TempDir dir;
  const std::vector<std::string> fp8 = {"--fp8-format", "hybrid", "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max",
                                        "--train-iters", "8"};
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), fp8.begin(), fp8.end());
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  run({"--metrics-jsonl", dir / "straight.jsonl"});
  run({"--exit-interval", "4", "--save", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"});
  const std::string iteration = latest_checkpoint_directory(dir / "ckpt");
  SafetensorsFile state(iteration + "/fp8_pp000.safetensors");
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv";
  ASSERT_TRUE(state.contains(qkv + ".fp8_amax_history")) << "a tensor per FP8 layer";
  EXPECT_EQ(state.load(qkv + ".fp8_amax_history").sizes(), at::IntArrayRef({4, 3}));
  EXPECT_EQ(state.names().size(), 2u * 2 * 4) << "2 layers x 4 linear layers x (history, scales)";
  EXPECT_NE(state.load(qkv + ".fp8_scale")[0].item<float>(), 1.0f) << "the scales moved from their start";
  const std::string resumed = run({"--load", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"});
  EXPECT_EQ(resumed.find("holds no FP8 delayed-scaling state"), std::string::npos) << resumed;
  EXPECT_EQ(file_lines(dir / "resumed.jsonl"), file_lines(dir / "straight.jsonl"));
  // A bf16 checkpoint resumed in FP8: the layers start afresh, said so.
  const auto plain = test::run_megatron(tiny({"--train-iters", "8", "--exit-interval", "2", "--save", dir / "bf16"}));
  ASSERT_EQ(plain.status, 0) << plain.output;
  const std::string mixed = run({"--load", dir / "bf16"});
  EXPECT_NE(mixed.find("holds no FP8 delayed-scaling state for 8 layer(s)"), std::string::npos) << mixed;
}

TEST(Fp8Training, PipelineStagesStateReshardsToOneProcess) {
  test::TempDir dir;
  const std::vector<std::string> fp8 = {"--fp8-format", "e4m3", "--fp8-amax-history-len", "2", "--train-iters", "6"};
  std::vector<std::string> two = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
  for (const auto& a : tiny(fp8)) two.push_back(a);
  for (const auto& a : {"--pipeline-model-parallel-size", "2", "--exit-interval", "3", "--save"}) two.push_back(a);
  two.push_back(dir / "ckpt");
  const auto saved = test::run_megatron(two);
  ASSERT_EQ(saved.status, 0) << saved.output;
  const std::string iteration = latest_checkpoint_directory(dir / "ckpt");
  EXPECT_TRUE(std::filesystem::exists(iteration + "/fp8_pp000.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(iteration + "/fp8_pp001.safetensors"));
  std::vector<std::string> one = tiny(fp8);
  one.insert(one.end(), {"--load", dir / "ckpt"});
  const auto resumed = test::run_megatron(one);
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resharded"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("holds no FP8 delayed-scaling state"), std::string::npos) << "both stages' layers found: " << resumed.output;
  EXPECT_EQ(test::logged_losses(resumed.output).size(), 3u) << resumed.output;
}

// Megatron reduces the delayed recipe's amaxes over TP x DP: the shards of a weight then share the
// whole weight's scale, and every replica the batch's. After one step, TP=2 + SP x DP=2 holds the
// same amax history as one process for every weight (each shard's amax reduced to the whole
// weight's) and for the first layer's input (the step's tokens pooled over the replicas).
TEST(Fp8Training, DelayedAmaxesAreReducedOverTensorAndDataParallelRanks) {
  test::TempDir dir;
  auto save_one_step = [&](std::vector<std::string> launch, std::vector<std::string> layout, const std::string& name) {
    std::vector<std::string> args = std::move(launch);
    for (const auto& a : tiny({"--fp8-format", "hybrid", "--fp8-amax-history-len", "2", "--train-iters", "8", "--exit-interval", "1",
                               "--save", dir / name, "--vocab-size", "255"})) {
      args.push_back(a);
    }
    args.insert(args.end(), layout.begin(), layout.end());
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return latest_checkpoint_directory(dir / name) + "/fp8_pp000.safetensors";
  };
  const std::string one = save_one_step({}, {}, "one");
  const std::string four = save_one_step({"launch", "--nproc-per-node", "4", "--master-port", "0"},
                                         {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, "four");
  SafetensorsFile a(one), b(four);
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : a.names()) {
    if (name.find("fp8_amax_history") == std::string::npos) continue;
    const at::Tensor ha = a.load(name), hb = b.load(name);  // [2, 3]: input, weight, output gradient
    EXPECT_TRUE(at::equal(ha.select(1, 1), hb.select(1, 1))) << name << " weight amax: " << ha << hb;
    EXPECT_TRUE(at::allclose(ha.select(1, 0), hb.select(1, 0), 3e-2, 0)) << name << " input: " << ha << hb;
    // Each replica's loss is its one micro-batch's, where one process averages over two (the
    // gradients are averaged over DP afterwards, as Megatron's): output gradients twice as large,
    // up to the FP8 noise of the layers above (the first step casts them with scale 1, where e5m2
    // is subnormal for gradients of 1e-4: twice the gradient is not twice the rounding).
    EXPECT_TRUE(at::allclose(2 * ha.select(1, 2), hb.select(1, 2), 0.2, 0)) << name << " output gradient: " << ha << hb;
  }
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.fp8_amax_history";
  EXPECT_TRUE(at::equal(a.load(qkv).select(1, 0), b.load(qkv).select(1, 0))) << "the first layer's input, pooled over DP";
}

TEST(Fp8Training, BadCombinationsAreRefusedByFlag) {
  auto error = [](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "2", "--lr-warmup-iters", "1"});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_NE(r.status, 0) << r.output;
    return r.output;
  };
  EXPECT_NE(error({"--fp8-format", "e5m2"}).find("--fp8-format must be e4m3 or hybrid"), std::string::npos);
  EXPECT_NE(error({"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"}).find("--fp8-recipe mxfp8 is not implemented yet"), std::string::npos);
  EXPECT_NE(error({"--fp8-format", "e4m3", "--first-last-layers-bf16"}).find("--first-last-layers-bf16 does not work with --fp8-recipe delayed"),
            std::string::npos);
  EXPECT_NE(error({"--fp8-format", "e4m3", "--fp8-amax-compute-algo", "mean"}).find("--fp8-amax-compute-algo must be max or most_recent"),
            std::string::npos);
  // Blockwise tiles of 128: a hidden size of 96 does not tile.
  const std::string tiles = error({"--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--hidden-size", "96", "--num-attention-heads", "4"});
  EXPECT_NE(tiles.find("--fp8-recipe blockwise casts tiles of 128"), std::string::npos) << tiles;
  EXPECT_NE(tiles.find("96 input"), std::string::npos) << tiles;
}

}  // namespace
}  // namespace megatron
