// Mixture of experts under expert parallelism, as real processes over Gloo: a tiny Qwen2-MoE
// style model (shared experts behind their gate, pre-softmax top-2 of 4 experts, one dense layer
// among MoE layers, balancing and z losses on) trained for 20 steps under EP=2 with either
// dispatcher, EP=2 x TP=2 + SP (experts split over TP too: expert TP = TP), EP=2 x DP=2 + the
// distributed optimizer, EP=2 x PP=2, EP=2 x expert TP 2, and expert TP 1 under TP=2 reproduces the single-process losses, balancing losses
// and z-losses to 1e-5; with a capacity factor EP=2 drops what one process drops (both policies,
// both dispatchers), and padding every expert to its capacity changes nothing; the global
// balancing loss (with the per-sequence one) is the same under TP=2 + SP and PP=2; a checkpoint saved under TP=2 x EP=2 x PP=2 + the distributed optimizer
// resumes at one process and at EP=4 to the uninterrupted run's next losses.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>

#include "support/test_support.h"

namespace megatron {
namespace {

constexpr double kTolerance = 1e-5;

std::vector<std::string> moe_flags(int steps) {
  return {"--model-family", "qwen2_moe", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
          "--num-query-groups", "2", "--ffn-hidden-size", "48", "--num-experts", "4", "--moe-router-topk", "2",
          "--moe-ffn-hidden-size", "16", "--moe-shared-expert-intermediate-size", "32", "--moe-layer-freq",
          "([1]*1+[0]*1+[1]*2)", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
          "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "8",
          "--train-iters", std::to_string(steps), "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
          "--tokenizer-type", "NullTokenizer", "--vocab-size", "120", "--make-vocab-size-divisible-by", "64",
          "--log-interval", "5", "--eval-interval", "0",
          "--cpu-threads", "1", "--device", "cpu", "--seed", "5"};
}

// The per-iteration values read from --metrics-jsonl.
// The gradient norm too: Adam's steps hardly change when a group of gradients is off by a
// constant factor (an expert's gradient averaged over the wrong ranks), the norm does.
const char* const kSeries[] = {"lm_loss", "load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss",
                               "grad_norm"};

struct MoeRun {
  std::map<std::string, std::vector<double>> series;  // each of kSeries the run logged, per iteration
  std::string output;
};

MoeRun train(const test::TempDir& dir, const std::string& name, int nproc, const std::vector<std::string>& layout, int steps = 20) {
  std::vector<std::string> args;
  if (nproc > 1) args = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
  args.push_back("train");
  for (const auto& a : moe_flags(steps)) args.push_back(a);
  for (const auto& a : layout) args.push_back(a);
  args.push_back("--metrics-jsonl");
  args.push_back(dir / (name + ".jsonl"));
  const auto result = test::run_megatron(args);
  EXPECT_EQ(result.status, 0) << name << "\n" << result.output;
  MoeRun run;
  run.output = result.output;
  std::ifstream in(dir / (name + ".jsonl"));
  for (std::string line; std::getline(in, line);) {
    for (const char* key : kSeries) {
      std::smatch m;
      if (std::regex_search(line, m, std::regex(std::string("\"") + key + "\": ([0-9.eE+-]+)"))) {
        run.series[key].push_back(std::stod(m[1]));
      }
    }
  }
  return run;
}

void expect_same(const MoeRun& expected, const MoeRun& got, const std::string& name, size_t from = 0) {
  ASSERT_TRUE(expected.series.count("lm_loss")) << expected.output;
  for (const auto& [key, a] : expected.series) {
    ASSERT_TRUE(got.series.count(key)) << name << " logged no " << key << "\n" << got.output;
    const auto& b = got.series.at(key);
    ASSERT_EQ(b.size() + from, a.size()) << name << " " << key << "\n" << got.output;
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_NEAR(b[i], a[i + from], kTolerance * std::abs(a[i + from])) << name << " " << key << " at iteration " << i + from + 1;
    }
  }
}

TEST(MoeTraining, ExpertParallelLayoutsReproduceOneProcess) {
  test::TempDir dir;
  const MoeRun single = train(dir, "single", 1, {});
  ASSERT_EQ(single.series.at("lm_loss").size(), 20u) << single.output;
  EXPECT_NE(single.output.find("> mixture of experts: 3 of 4 layers, 4 experts (top-2), expert ffn 16, shared experts 32"),
            std::string::npos) << single.output;
  EXPECT_LT(single.series.at("lm_loss").back(), single.series.at("lm_loss").front());  // it learns
  const std::vector<std::pair<std::string, std::pair<int, std::vector<std::string>>>> layouts = {
      {"ep2_alltoall", {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}}},
      {"ep2_allgather", {2, {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"}}},
      {"ep2_tp2_sp", {4, {"--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                          "--moe-token-dispatcher-type", "alltoall"}}},
      {"ep2_dp2_distopt", {4, {"--expert-model-parallel-size", "2", "--use-distributed-optimizer",
                               "--moe-token-dispatcher-type", "alltoall"}}},
      {"ep2_pp2", {4, {"--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                       "--moe-token-dispatcher-type", "allgather"}}},
      // Expert TP apart from TP: EP=2 with expert TP 2 and no TP (the experts split over two
      // ranks holding different data), and expert TP 1 under TP=2 + SP (EP spans the TP ranks).
      {"ep2_etp2", {4, {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2",
                        "--moe-token-dispatcher-type", "alltoall"}}},
      // Context parallelism beside EP: the routers' load counts and z-loss span both CP ranks'
      // chunks of each sequence.
      {"cp2_ep2", {2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}}},
      {"ep2_etp1_tp2_sp", {2, {"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1",
                               "--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-token-dispatcher-type", "alltoall"}}},
  };
  for (const auto& [name, run] : layouts) {
    const MoeRun got = train(dir, name, run.first, run.second);
    expect_same(single, got, name);
  }
}

// With a capacity each rank drops from its own tokens (as Megatron): EP ranks hold different data,
// so an EP run drops exactly what one process does with the same micro-batches.
TEST(MoeTraining, CapacityDropsWhatOneProcessDrops) {
  test::TempDir dir;
  const MoeRun dropless = train(dir, "dropless", 1, {}, 6);
  for (const std::string policy : {"probs", "position"}) {
    const std::vector<std::string> capacity = {"--moe-expert-capacity-factor", "0.5", "--moe-token-drop-policy", policy};
    const MoeRun single = train(dir, "single_" + policy, 1, capacity, 6);
    // Dropping changed the training: the losses leave the dropless run's.
    double apart = 0;
    for (size_t i = 0; i < dropless.series.at("lm_loss").size(); ++i) {
      apart = std::max(apart, std::abs(single.series.at("lm_loss")[i] - dropless.series.at("lm_loss")[i]));
    }
    std::printf("%s: max |capacity 0.5 - dropless| lm loss over 6 steps = %.3g\n", policy.c_str(), apart);
    EXPECT_GT(apart, 1e-3) << policy;
    for (const std::string dispatcher : {"alltoall", "allgather"}) {
      std::vector<std::string> layout = capacity;
      for (const auto& a : {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type"}) layout.push_back(a);
      layout.push_back(dispatcher);
      expect_same(single, train(dir, "ep2_" + policy + "_" + dispatcher, 2, layout, 6), "EP=2 " + dispatcher + " " + policy);
      if (policy != "probs") continue;
      // Padding every expert's input to its capacity (zero rows of weight 0; under alltoall
      // static splits, no count exchange) changes nothing.
      layout.push_back("--moe-pad-expert-input-to-capacity");
      expect_same(single, train(dir, "ep2_padded_" + dispatcher, 2, layout, 6), "EP=2 padded " + dispatcher);
    }
    if (policy == "probs") {
      std::vector<std::string> padded = capacity;
      padded.push_back("--moe-pad-expert-input-to-capacity");
      expect_same(single, train(dir, "single_padded", 1, padded, 6), "one process padded");
    }
  }
}

TEST(MoeTraining, CheckpointReshardsAcrossExpertLayouts) {
  test::TempDir dir;
  const MoeRun whole = train(dir, "whole", 1, {}, 14);
  // Saved at iteration 4 under TP=2 x EP=2 x PP=2 with the distributed optimizer (8 ranks)...
  train(dir, "first", 8, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
                          "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--moe-token-dispatcher-type",
                          "alltoall", "--save", dir / "ckpt", "--save-interval", "4", "--exit-interval", "4"}, 14);
  // ... resumed at one process and at EP=4: the next 10 losses are the uninterrupted run's.
  const MoeRun one = train(dir, "resumed_one", 1, {"--load", dir / "ckpt"}, 14);
  expect_same(whole, one, "resumed at one process", 4);
  const MoeRun ep4 = train(dir, "resumed_ep4", 4, {"--load", dir / "ckpt", "--expert-model-parallel-size", "4",
                                                "--moe-token-dispatcher-type", "alltoall"}, 14);
  expect_same(whole, ep4, "resumed at EP=4", 4);
  // Saved with expert TP 1 under TP=2 + SP x EP=2 x DP=2 and the distributed optimizer (the
  // experts' optimizer state sharded over expert DP), resumed at one process and at expert TP 2.
  train(dir, "etp1_first", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
                               "--expert-model-parallel-size", "2", "--use-distributed-optimizer", "--moe-token-dispatcher-type",
                               "alltoall", "--save", dir / "etp1_ckpt", "--save-interval", "4", "--exit-interval", "4"}, 14);
  expect_same(whole, train(dir, "etp1_resumed_one", 1, {"--load", dir / "etp1_ckpt"}, 14), "expert TP 1 resumed at one process", 4);
  expect_same(whole, train(dir, "etp1_resumed_etp2", 4, {"--load", dir / "etp1_ckpt", "--tensor-model-parallel-size", "2",
                                                         "--sequence-parallel", "--expert-model-parallel-size", "2",
                                                         "--moe-token-dispatcher-type", "alltoall"}, 14),
              "expert TP 1 resumed at expert TP 2", 4);
}

// --moe-router-load-balancing-type sinkhorn (no balancing loss): each rank balances its own
// micro-batch's tokens, so EP=2 (two ranks, different data) reproduces one process; the routing
// differs from plain top-k's, and no balancing loss is logged.
TEST(MoeTraining, SinkhornRoutingUnderExpertParallelism) {
  test::TempDir dir;
  const std::vector<std::string> sinkhorn = {"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"};
  const MoeRun single = train(dir, "single", 1, sinkhorn, 6);
  ASSERT_EQ(single.series.at("lm_loss").size(), 6u) << single.output;
  EXPECT_EQ(single.series.count("load_balancing_loss"), 0u) << single.output;
  const MoeRun topk = train(dir, "topk", 1, {"--moe-aux-loss-coeff", "0"}, 6);
  double apart = 0;
  for (size_t i = 0; i < 6; ++i) apart = std::max(apart, std::abs(single.series.at("lm_loss")[i] - topk.series.at("lm_loss")[i]));
  EXPECT_GT(apart, 1e-4) << "sinkhorn routed as plain top-k";
  std::vector<std::string> ep2 = sinkhorn;
  for (const auto& a : {"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}) ep2.push_back(a);
  expect_same(single, train(dir, "ep2", 2, ep2, 6), "EP=2 sinkhorn");
  // A sinkhorn-routed model has no Hugging Face router to export to.
  std::vector<std::string> save = sinkhorn;
  for (const std::string& a : std::vector<std::string>{"--save", dir / "ckpt", "--save-interval", "2"}) save.push_back(a);
  train(dir, "saved", 1, save, 2);
  const auto r = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "ckpt", "--save", dir / "hf"});
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--moe-router-load-balancing-type sinkhorn does not export to Hugging Face"), std::string::npos) << r.output;
}

// Megatron's global balancing loss (expert counts over the whole data-parallel batch, averaged
// over the step's micro-batches), here beside the per-sequence one with a coefficient each:
// TP=2 + SP, PP=2 and CP=2 keep the batch and reproduce one process. Under DP=2 (here EP=2) the batch's
// micro-batches pair up differently, so the value is close to, not equal to, one process's.
TEST(MoeTraining, GlobalAuxLossAcrossLayouts) {
  test::TempDir dir;
  const std::vector<std::string> losses = {"--moe-router-load-balancing-type", "seq_aux_loss", "global_aux_loss",
                                           "--moe-aux-loss-coeff", "0.01", "0.001"};
  auto with = [&](std::vector<std::string> layout) {
    layout.insert(layout.end(), losses.begin(), losses.end());
    return layout;
  };
  const MoeRun single = train(dir, "single", 1, with({}), 8);
  ASSERT_TRUE(single.series.count("global_load_balancing_loss")) << single.output;
  ASSERT_TRUE(single.series.count("seq_load_balancing_loss")) << single.output;
  EXPECT_EQ(single.series.count("load_balancing_loss"), 0u) << "aux_loss was not asked for";
  EXPECT_NE(single.output.find("global_load_balancing_loss: "), std::string::npos) << single.output;
  expect_same(single, train(dir, "tp2_sp", 2, with({"--tensor-model-parallel-size", "2", "--sequence-parallel"}), 8), "TP=2 + SP");
  expect_same(single, train(dir, "pp2", 2, with({"--pipeline-model-parallel-size", "2"}), 8), "PP=2");
  expect_same(single, train(dir, "cp2", 2, with({"--context-parallel-size", "2"}), 8), "CP=2");
  const MoeRun ep2 = train(dir, "ep2", 2, with({"--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"}), 8);
  const double one = single.series.at("global_load_balancing_loss")[0], two = ep2.series.at("global_load_balancing_loss")[0];
  EXPECT_NEAR(two, one, 0.1 * one) << "the DP=2 value is the whole batch's, as one process's";
}

// Bad MoE flags are errors that name the flag.
TEST(MoeTraining, BadFlagsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--moe-router-topk", "5"}, "--moe-router-topk 5 must be between 1 and --num-experts 4"},
      {{"--moe-layer-freq", "[1,0]"}, "--moe-layer-freq '[1,0]' gives 2 layers, the model has --num-layers 4"},
      {{"--moe-layer-freq", "([1]*2+[0]*2"}, "--moe-layer-freq '([1]*2+[0]*2': missing ')'"},
      {{"--moe-router-load-balancing-type", "sinkorn"},
       "--moe-router-load-balancing-type must be aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none (got 'sinkorn')"},
      {{"--moe-router-load-balancing-type", "sinkhorn"},
       "--moe-aux-loss-coeff must be 0 with --moe-router-load-balancing-type sinkhorn"},
      {{"--moe-router-load-balancing-type", "sinkhorn", "aux_loss", "--moe-aux-loss-coeff", "0", "0"},
       "--moe-router-load-balancing-type sinkhorn routes by itself: give it alone"},
      {{"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0", "--moe-router-score-function", "sigmoid"},
       "--moe-router-score-function cannot be set with --moe-router-load-balancing-type sinkhorn"},
      {{"--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0", "--moe-grouped-gemm", "--bf16",
        "--cuda-graph-impl", "local"},
       "--moe-router-load-balancing-type sinkhorn reads on the host whether it has converged"},
      {{"--moe-router-load-balancing-type", "aux_loss", "global_aux_loss"},
       "--moe-aux-loss-coeff gives 1 coefficient(s) for 2 --moe-router-load-balancing-type(s)"},
      {{"--moe-shared-expert-overlap"}, "--moe-shared-expert-overlap works with --moe-token-dispatcher-type alltoall only"},
      {{"--moe-token-dispatcher-type", "flex"}, "--moe-token-dispatcher-type must be allgather or alltoall"},
      {{"--moe-token-drop-policy", "random"}, "--moe-token-drop-policy must be probs or position"},
      {{"--moe-pad-expert-input-to-capacity"}, "--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"train"};
    for (const auto& a : moe_flags(1)) args.push_back(a);
    for (const auto& a : flags) args.push_back(a);
    const auto r = test::run_megatron(args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  // EP must divide the experts.
  std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0", "train"};
  for (const auto& a : moe_flags(1)) args.push_back(a);
  for (const auto& a : {"--num-experts", "3", "--expert-model-parallel-size", "2"}) args.push_back(a);
  const auto r = test::run_megatron(args);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--expert-model-parallel-size 2 does not divide --num-experts 3"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron
