// DeepSeek-V2 / V3 (multi-latent attention, YaRN, DeepSeek routing) against Hugging Face
// transformers and across parallel layouts. The --load-hf parity of random tiny V2-Lite, V3 and
// FP8-quantised V3 models is tests/model/test_hf_parity.cpp; here:
//  - `convert` of the V2-Lite and V3 fixtures gives HF's logits (1e-4) and loss (1e-5);
//  - HF -> native (TP=2 x EP=2 x PP=2) -> HF is bitwise for V3, fp32 and bf16, config.json too;
//  - a V3-style model trained from flags (query latent, YaRN, sigmoid routing over 2 groups with
//    the expert bias updating, shared experts, a dense first layer, one MTP depth) over 20 steps
//    under TP=2 + SP, EP=2, PP=2 (MTP on the last stage) and EP=2 x DP=2 + the distributed
//    optimizer gives one process's losses and MTP losses (1e-5) and the same expert biases, bit
//    for bit;
//  - MTP enters the objective by its scaling factor alone, and round-trips through HF;
//  - a dense MLA model under TP=2 without SP, PP=2 and selective recomputation gives one
//    process's losses;
//  - group-limited routing and the bias update against their definitions;
//  - the FLOP count takes an MTP depth as one more decoder layer plus the output layer again;
//  - inconsistent MLA dimensions and routing groups are errors naming the flag or field.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/files.h"
#include "model/family.h"
#include "model/gpt_model.h"
#include "moe/router.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"

namespace megatron {
namespace {

class DeepSeekHf : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekHf, ConvertedCheckpointMatchesTransformers) {
  test::TempDir dir;
  test::make_hf_model(dir / "hf", GetParam());
  auto r = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save", dir / "native",
                               "--make-vocab-size-divisible-by", "32"});
  ASSERT_EQ(r.status, 0) << r.output;
  ModelConfig config = model_config_from_hf(dir / "hf");
  config.padded_vocab_size = 96;
  GPTModel model(config);
  load_model_weights(latest_checkpoint_directory(dir / "native"), model);
  model.eval();
  test::expect_model_matches_reference(model, dir / "hf/reference.safetensors");
}

INSTANTIATE_TEST_SUITE_P(Versions, DeepSeekHf, ::testing::Values("deepseek_v2", "deepseek_v3"));

TEST(DeepSeekHfRoundTrip, ThroughTensorExpertPipelineParallelIsBitwise) {
  for (bool bf16 : {false, true}) {
    test::TempDir dir;
    test::make_hf_model(dir / "hf", "deepseek_v3", bf16);
    auto to_native = test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", dir / "hf", "--save",
                                         dir / "native", "--target-tensor-parallel-size", "2",
                                         "--target-pipeline-parallel-size", "2", "--target-expert-parallel-size", "2"});
    ASSERT_EQ(to_native.status, 0) << to_native.output;
    {  // stage 1 (the MoE layer), TP rank 1: MLA split by heads, the down projections whole
      SafetensorsFile dense(dir / "native/iter_0000000/model_tp01_pp001.safetensors");
      EXPECT_EQ(dense.view("decoder.layers.1.self_attention.linear_q_up_proj.weight").size(0), 2 * (12 + 8));
      EXPECT_EQ(dense.view("decoder.layers.1.self_attention.linear_kv_down_proj.weight").size(0), 16 + 8);
      EXPECT_TRUE(dense.contains("decoder.layers.1.mlp.router.expert_bias"));  // replicated, with the dense tensors
      SafetensorsFile ep1(dir / "native/iter_0000000/model_tp01_pp001_ep001.safetensors");
      EXPECT_TRUE(ep1.contains("decoder.layers.1.mlp.experts.linear_fc1.weight5"));
    }
    auto to_hf = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "native", "--save", dir / "back"});
    ASSERT_EQ(to_hf.status, 0) << to_hf.output;
    test::expect_bitwise_equal(dir / "hf", dir / "back");
    EXPECT_EQ(read_file(dir / "hf/config.json"), read_file(dir / "back/config.json"));
  }
}

std::vector<std::string> deepseek_flags(int steps) {
  return {"--model-family", "deepseek_v3", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
          "--q-lora-rank", "16", "--kv-lora-rank", "12", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
          "--v-head-dim", "6", "--rotary-scaling-factor", "4", "--mscale", "1.0", "--mscale-all-dim", "1.0",
          "--yarn-original-max-position-embeddings", "8", "--ffn-hidden-size", "48", "--num-experts", "8",
          "--moe-router-topk", "2", "--moe-router-num-groups", "2", "--moe-router-group-topk", "1",
          "--moe-router-topk-scaling-factor", "2.5", "--moe-router-bias-update-rate", "0.01", "--moe-ffn-hidden-size", "16",
          "--moe-shared-expert-intermediate-size", "16", "--moe-layer-freq", "([0]*1+[1]*3)", "--moe-router-dtype", "fp32",
          "--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "8",
          "--train-iters", std::to_string(steps), "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "120", "--make-vocab-size-divisible-by", "64",
          "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3",
          "--log-interval", "5", "--eval-interval", "0", "--cpu-threads", "1", "--device", "cpu", "--seed", "7"};
}

// The "mtp_1 loss" values of a run's log lines at multiples of `interval` (as test::logged_losses).
std::vector<double> logged_mtp_losses(const std::string& output, int64_t interval) {
  std::vector<double> out;
  const std::regex value(R"( iteration +([0-9]+)/[^\n]*mtp_1 loss: ([0-9.eE+-]+))");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), value); it != std::sregex_iterator(); ++it) {
    if (std::stoll((*it)[1]) % interval == 0) out.push_back(std::stod((*it)[2]));
  }
  return out;
}

struct DeepSeekRun {
  std::vector<double> losses;
  std::vector<double> mtp_losses;  // "mtp_1 loss"
  std::vector<double> grad_norms;  // every step's: Adam hides a group of gradients off by a constant factor, the norm does not
  std::map<std::string, at::Tensor> hf;  // the exported model, expert biases among it
  std::string output;
};

DeepSeekRun train(const test::TempDir& dir, const std::string& name, int nproc, const std::vector<std::string>& layout) {
  std::vector<std::string> args;
  if (nproc > 1) args = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
  args.push_back("train");
  for (const auto& a : deepseek_flags(20)) args.push_back(a);
  for (const auto& a : layout) args.push_back(a);
  for (const auto& a : {std::string("--save-hf"), dir / name, std::string("--metrics-jsonl"), dir / (name + ".jsonl")}) args.push_back(a);
  const auto r = test::run_megatron(args);
  EXPECT_EQ(r.status, 0) << name << "\n" << r.output;
  DeepSeekRun run{test::logged_losses(r.output, 5), logged_mtp_losses(r.output, 5), test::jsonl_series(dir / (name + ".jsonl"), "grad_norm"),
                  {}, r.output};
  if (r.status == 0) run.hf = test::hf_tensors(dir / name);
  return run;
}

TEST(DeepSeekTraining, LayoutsReproduceOneProcessWithTheExpertBiasUpdating) {
  test::TempDir dir;
  const DeepSeekRun single = train(dir, "single", 1, {});
  ASSERT_EQ(single.losses.size(), 4u) << single.output;
  ASSERT_EQ(single.grad_norms.size(), 20u) << single.output;
  EXPECT_NE(single.output.find("> expert bias (auxiliary-loss-free balancing), updated by 0.01 per step"), std::string::npos)
      << single.output;
  const at::Tensor bias = single.hf.at("model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_GT(bias.abs().max().item<double>(), 0.0) << "the expert bias moved";
  // The MTP depth: reported, exported as HF layer 4 (after the decoder's four), its MoE router's
  // expert bias moving too.
  ASSERT_EQ(single.mtp_losses.size(), 4u) << single.output;
  EXPECT_TRUE(single.hf.count("model.layers.4.eh_proj.weight") && single.hf.count("model.layers.4.shared_head.norm.weight"));
  EXPECT_GT(single.hf.at("model.layers.4.mlp.gate.e_score_correction_bias").abs().max().item<double>(), 0.0);
  const std::vector<std::pair<std::string, std::pair<int, std::vector<std::string>>>> layouts = {
      {"tp2_sp", {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}}},
      {"ep2", {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}}},
      {"pp2", {2, {"--pipeline-model-parallel-size", "2"}}},
      // MLA's own value head dim in the ring's blocks; the MTP depth's shifted tokens and labels
      // cut from the whole sequence, its mean over both CP ranks' tokens.
      {"cp2", {2, {"--context-parallel-size", "2"}}},
      {"ep2_dp2_distopt", {4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer"}}},
  };
  for (const auto& [name, layout] : layouts) {
    const DeepSeekRun got = train(dir, name, layout.first, layout.second);
    ASSERT_EQ(got.losses.size(), single.losses.size()) << name << "\n" << got.output;
    for (size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], single.losses[i], 1e-5 * std::abs(single.losses[i])) << name << " log " << i;
    }
    ASSERT_EQ(got.mtp_losses.size(), single.mtp_losses.size()) << name << "\n" << got.output;
    for (size_t i = 0; i < got.mtp_losses.size(); ++i) {
      EXPECT_NEAR(got.mtp_losses[i], single.mtp_losses[i], 1e-5 * std::abs(single.mtp_losses[i])) << name << " mtp log " << i;
    }
    ASSERT_EQ(got.grad_norms.size(), single.grad_norms.size()) << name << "\n" << got.output;
    for (size_t i = 0; i < got.grad_norms.size(); ++i) {
      EXPECT_NEAR(got.grad_norms[i], single.grad_norms[i], 1e-4 * single.grad_norms[i]) << name << " grad norm, step " << i + 1;
    }
    for (const auto& [key, tensor] : single.hf) {
      if (key.find("e_score_correction_bias") == std::string::npos) continue;
      EXPECT_TRUE(at::equal(got.hf.at(key), tensor)) << name << ": " << key;
    }
  }
}

// Multi-token prediction's place in the objective: with a scaling factor of 0 the main model
// trains exactly as without MTP (the depth touches nothing else), with 0.3 it trains otherwise.
// A model with MTP exported to HF (its depth as the layer after the decoder's) loads back with
// its depth and exports bit for bit.
TEST(DeepSeekTraining, MultiTokenPredictionEntersTheObjectiveAndRoundTrips) {
  test::TempDir dir;
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"train"};
    for (const auto& a : deepseek_flags(5)) args.push_back(a);
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  auto every_step = [](std::vector<std::string> a) {
    a.insert(a.end(), {"--log-interval", "1"});
    return a;
  };
  const std::vector<double> without = test::logged_losses(run(every_step({"--mtp-num-layers", "0"})));
  const std::vector<double> zero = test::logged_losses(run(every_step({"--mtp-loss-scaling-factor", "0"})));
  const std::vector<double> weighted = test::logged_losses(run(every_step({})));
  ASSERT_EQ(without.size(), 5u);
  ASSERT_EQ(zero.size(), 5u);
  ASSERT_EQ(weighted.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(zero[i], without[i], 1e-6 * without[i]) << "step " << i + 1;
  EXPECT_NEAR(weighted[0], without[0], 1e-6 * without[0]) << "the same first forward";
  EXPECT_GT(std::abs(weighted[4] - without[4]), 1e-4) << "the MTP loss's gradient changed the training";

  run({"--save-hf", dir / "hf"});
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "hf/config.json")).at("num_nextn_predict_layers"), 1);
  std::vector<std::string> again = {"train", "--load-hf", dir / "hf", "--mtp-num-layers", "1", "--seq-length", "16",
                                    "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-30",
                                    "--weight-decay", "0", "--moe-router-bias-update-rate", "0", "--mock-data",
                                    "--tokenizer-type", "NullTokenizer", "--vocab-size", "120", "--make-vocab-size-divisible-by",
                                    "64", "--eval-interval", "0", "--device", "cpu", "--cpu-threads", "1", "--save-hf", dir / "back"};
  const auto r = test::run_megatron(again);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("start from --seed"), std::string::npos) << "the depth's weights were in the checkpoint\n" << r.output;
  test::expect_bitwise_equal(dir / "hf", dir / "back");
}

// A dense MLA model (no query latent, as V2-Lite) under TP=2 without sequence parallelism (the
// rotary key's gradient summed over the heads of both ranks) and under PP=2, and with its core
// attention recomputed in the backward, gives one process's losses.
TEST(DeepSeekTraining, DenseMlaUnderTensorParallelAndRecomputation) {
  const std::vector<std::string> flags = {
      "train", "--model-family", "deepseek_v2", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
      "--kv-lora-rank", "12", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6",
      "--rotary-scaling-factor", "4", "--mscale", "0.707", "--mscale-all-dim", "0.707", "--yarn-original-max-position-embeddings",
      "8", "--ffn-hidden-size", "48", "--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "2",
      "--global-batch-size", "4", "--train-iters", "6", "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
      "--tokenizer-type", "NullTokenizer", "--vocab-size", "120", "--make-vocab-size-divisible-by", "64", "--log-interval", "1",
      "--eval-interval", "0", "--cpu-threads", "1", "--device", "cpu", "--seed", "3"};
  auto run = [&](int nproc, const std::vector<std::string>& extra) {
    std::vector<std::string> args;
    if (nproc > 1) args = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return test::logged_losses(r.output);
  };
  const std::vector<double> single = run(1, {});
  ASSERT_EQ(single.size(), 6u);
  for (const auto& [name, losses] : {std::pair<std::string, std::vector<double>>{"tp2", run(2, {"--tensor-model-parallel-size", "2"})},
                                     {"pp2", run(2, {"--pipeline-model-parallel-size", "2"})},
                                     {"selective recompute", run(1, {"--recompute-granularity", "selective"})}}) {
    ASSERT_EQ(losses.size(), single.size()) << name;
    for (size_t i = 0; i < single.size(); ++i) EXPECT_NEAR(losses[i], single[i], 1e-5 * single[i]) << name << " step " << i + 1;
  }
}

// Group-limited top-k against its definition: each group scored by the sum of its top k / gk,
// the gk best groups kept, the k best experts among them.
TEST(DeepSeekRouting, GroupLimitedTopkKeepsTheBestGroups) {
  at::manual_seed(11);
  const int64_t T = 40, E = 12, k = 4, groups = 3, group_topk = 2;
  const at::Tensor scores = at::rand({T, E});
  const auto [values, indices] = moe::group_limited_topk(scores, k, groups, group_topk);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<std::pair<double, int64_t>> group_score;
    for (int64_t g = 0; g < groups; ++g) {
      auto top = scores[t].narrow(0, g * (E / groups), E / groups).topk(k / group_topk);
      group_score.push_back({std::get<0>(top).sum().item<double>(), g});
    }
    std::sort(group_score.rbegin(), group_score.rend());
    std::vector<std::pair<double, int64_t>> allowed;
    for (int64_t i = 0; i < group_topk; ++i) {
      const int64_t g = group_score[size_t(i)].second;
      for (int64_t e = g * (E / groups); e < (g + 1) * (E / groups); ++e) allowed.push_back({scores[t][e].item<double>(), e});
    }
    std::sort(allowed.rbegin(), allowed.rend());
    std::set<int64_t> want, got;
    for (int64_t i = 0; i < k; ++i) want.insert(allowed[size_t(i)].second), got.insert(indices[t][i].item<int64_t>());
    EXPECT_EQ(want, got) << "token " << t;
  }
}

// The bias update: rate x sign(mean - count); the expert counts of a step are those routed.
TEST(DeepSeekRouting, ExpertBiasMovesTowardsBalance) {
  ModelConfig c;
  c.hidden_size = 8;
  c.num_layers = 1;
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_layers = {1};
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  c.moe_router_bias_update_rate = 0.5;
  const tp::TensorParallel tp;
  moe::TopKRouter router(PartContext{c, tp, at::kCPU, false, 0});
  {
    at::NoGradGuard no_grad;
    router.weight.normal_(0, 1.0);
  }
  router.train();
  const at::Tensor tokens = at::randn({30, 8});
  const moe::Routing routing = router.forward(tokens, 1);
  const at::Tensor counts = router.take_expert_counts();
  EXPECT_TRUE(at::equal(counts, at::bincount(routing.indices.reshape({-1}), {}, 4).to(at::kFloat)));
  router.update_expert_bias(counts);
  const at::Tensor expected = at::sign(counts.mean() - counts) * 0.5;
  EXPECT_TRUE(at::equal(router.expert_bias, expected)) << router.expert_bias << expected;
  EXPECT_EQ(router.take_expert_counts().sum().item<double>(), 0.0) << "the counts start afresh each step";
}

// The expert bias moves in steps of 1e-3: it stays fp32 when the model is cast to bf16, and is
// not trained (no gradient, not in the gradient buffers).
TEST(DeepSeekRouting, ExpertBiasStaysFp32AndUntrained) {
  ModelConfig c;
  c.hidden_size = 16;
  c.ffn_hidden_size = 32;
  c.num_layers = 1;
  c.num_attention_heads = 2;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.seq_length = 8;
  c.max_position_embeddings = 8;
  c.vocab_size = c.padded_vocab_size = 32;
  c.swiglu = true;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 8;
  c.moe_layers = {1};
  c.moe_router_score_function = "sigmoid";
  c.moe_router_enable_expert_bias = true;
  GPTModel model(c);
  model.initialize(1);
  model.to(at::kCPU, at::kBFloat16);
  const auto params = model.named_parameters();
  EXPECT_EQ(params["decoder.layers.0.mlp.router.expert_bias"].scalar_type(), at::kFloat);
  EXPECT_FALSE(params["decoder.layers.0.mlp.router.expert_bias"].requires_grad());
  EXPECT_EQ(params["decoder.layers.0.mlp.router.weight"].scalar_type(), at::kBFloat16);
  EXPECT_FALSE(model.parameter_table().at("decoder.layers.0.mlp.router.expert_bias").trainable);
}

// Inconsistent MLA dimensions, routing groups that do not fit, HF fields we cannot honour: each an
// error naming the flag or field.
// An MTP depth costs what one more MoE decoder layer costs, plus its own projections and norms,
// plus the output layer's GEMM once more (its weight is the model's, counted once): its 64
// inactive experts are not FLOPs (session 12's log counted them, 524 "TFLOP/s" on an H200).
TEST(DeepSeekConfig, FlopsCountAnMtpDepthAsOneMoreLayerAndTheOutputLayerAgain) {
  test::TempDir dir;
  test::make_hf_model(dir / "hf", "deepseek_v3");
  ModelConfig base = model_config_from_hf(dir / "hf");
  base.padded_vocab_size = 96;
  base.seq_length = 16;
  ASSERT_TRUE(base.is_moe_layer(base.num_layers - 1));
  auto flops = [](const ModelConfig& m, int64_t* parameters) {
    *parameters = GPTModel(m).num_parameters();
    return family_of(m).flops_per_token(m, *parameters);
  };
  ModelConfig deeper = base, with_mtp = base;
  deeper.num_layers += 1;
  deeper.moe_layers.push_back(1);
  with_mtp.mtp_num_layers = 1;
  int64_t p_base = 0, p_deeper = 0, p_mtp = 0;
  const double f_base = flops(base, &p_base), f_deeper = flops(deeper, &p_deeper), f_mtp = flops(with_mtp, &p_mtp);
  const double projections_and_norms = double(p_mtp - p_deeper);  // eh_proj, enorm, hnorm, the depth's final norm
  ASSERT_GT(projections_and_norms, 0);
  const double output_again = 6.0 * base.padded_vocab_size * base.hidden_size;
  EXPECT_DOUBLE_EQ(f_mtp - f_base, (f_deeper - f_base) + 6.0 * projections_and_norms + output_again);
}

TEST(DeepSeekConfig, BadInputNamesTheFlagOrField) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--qk-pos-emb-head-dim", "5"}, "--qk-pos-emb-head-dim 5 must be even"},
      {{"--kv-lora-rank", "0"}, "--kv-lora-rank must be positive with --multi-latent-attention"},
      {{"--moe-router-num-groups", "3"}, "--moe-router-num-groups 3 does not divide --num-experts 8"},
      {{"--moe-router-group-topk", "3"}, "--moe-router-group-topk 3 is above --moe-router-num-groups 2"},
      {{"--moe-router-score-function", "softmax"}, "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid"},
      {{"--rope-type", "ntk"}, "--rope-type must be rope or yarn"},
      {{"--group-query-attention", "--num-query-groups", "2"}, "--multi-latent-attention has no query groups"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"train"};
    for (const auto& a : deepseek_flags(1)) args.push_back(a);
    for (const auto& a : flags) args.push_back(a);
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  const std::vector<std::pair<std::string, std::string>> fields = {
      {R"({"model_type": "deepseek_v3", "rope_interleave": false})", "rope_interleave = false is not supported"},
      {R"({"model_type": "deepseek_v2", "topk_method": "noaux_tc"})", "topk_method = \"noaux_tc\" is not supported"},
      {R"({"model_type": "deepseek_v3", "norm_topk_prob": false})", "norm_topk_prob = false is not supported"},
      {R"({"model_type": "deepseek_v2", "num_key_value_heads": 2})", "num_key_value_heads = 2 is not supported"},
      {R"({"model_type": "deepseek_v3", "quantization_config": {"quant_method": "bitsandbytes"}})",
       "quantization_config = {\"quant_method\":\"bitsandbytes\"} is not supported"},
  };
  for (const auto& [text, message] : fields) {
    test::TempDir dir;
    nlohmann::json j = nlohmann::json::parse(text);
    const nlohmann::json defaults = {{"num_hidden_layers", 2}, {"hidden_size", 32}, {"intermediate_size", 64},
                                     {"num_attention_heads", 4}, {"vocab_size", 100}, {"kv_lora_rank", 8},
                                     {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 4}, {"v_head_dim", 8},
                                     {"n_routed_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16},
                                     {"n_group", 2}, {"topk_group", 1}};
    for (const auto& [key, value] : defaults.items()) {
      if (!j.contains(key)) j[key] = value;
    }
    write_file_atomic(dir / "config.json", j.dump());
    try {
      model_config_from_hf(dir.path());
      ADD_FAILURE() << "accepted " << text;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace megatron
