// Parallel equivalence, the core test of the distributed layer: a tiny fp32 model trained for
// 20 steps as real processes over Gloo (`megatron launch`) under TP=2, TP=2 + SP, DP=2,
// DP=2 + distributed optimizer, TP=2 x DP=2, pipelines (PP=2, PP=4, uneven, interleaved,
// PP x TP, PP x DP with the distributed optimizer) and context parallelism (CP=2 and CP=4 with
// each exchange, CP x TP + SP, CP x PP, CP x DP with the distributed optimizer) reproduces the single-process losses,
// validation losses and final parameters (TP shards and pipeline stages reassembled from the
// per-rank checkpoint files) to 1e-5 relative, and the weights stay identical across
// data-parallel replicas.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "support/test_support.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace {

constexpr int kSteps = 20;
constexpr double kTolerance = 1e-5;

// Two tiny architectures between them cover every sharded and every partially-reduced parameter:
// GQA + SwiGLU + RoPE + q/k norm + qkv bias + untied output ("llama"), and LayerNorm + GELU +
// all biases + learned positions + tied output ("gpt"). A trailing 4 ("llama4") means four
// layers instead of two, for pipelines (a trailing 6: six).
std::vector<std::string> model_flags(const std::string& model) {
  const std::string layers = std::isdigit(static_cast<unsigned char>(model.back())) ? std::string(1, model.back()) : "2";
  std::vector<std::string> common = {"--num-layers", layers, "--hidden-size", "64", "--num-attention-heads", "4",
                                     "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
                                     "--train-iters", std::to_string(kSteps), "--lr", "1e-3", "--lr-decay-style", "cosine",
                                     "--lr-warmup-iters", "2", "--mock-data", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "200", "--log-interval", "5", "--eval-interval", "10",
                                     "--eval-iters", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
                                     "--cpu-threads", "1", "--device", "cpu", "--seed", "7"};
  std::vector<std::string> arch;
  if (model.rfind("llama", 0) == 0) {
    arch = {"--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--swiglu",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--qk-layernorm", "--disable-bias-linear",
            "--add-qkv-bias", "--untie-embeddings-and-output-weights"};
  } else {
    arch = {"--ffn-hidden-size", "96", "--normalization", "LayerNorm", "--position-embedding-type", "learned_absolute"};
  }
  common.insert(common.end(), arch.begin(), arch.end());
  return common;
}

struct TrainingRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // Adam hides gradients off by a constant factor; their norm does not
  std::vector<double> validation_losses;
  std::string output;
  std::string save_dir;
};

TrainingRun train(const test::TempDir& dir, const std::string& name, const std::string& model, int nproc,
          const std::vector<std::string>& layout) {
  std::vector<std::string> args;
  if (nproc > 1) args = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
  args.push_back("train");
  for (const auto& a : model_flags(model)) args.push_back(a);
  for (const auto& a : layout) args.push_back(a);
  TrainingRun run;
  run.save_dir = dir / name;
  for (const auto& a : {std::string("--save"), run.save_dir, std::string("--metrics-jsonl"), dir / (name + ".jsonl")}) {
    args.push_back(a);
  }
  auto result = test::run_megatron(args);
  run.output = result.output;
  EXPECT_EQ(result.status, 0) << name << "\n" << result.output;
  run.losses = test::jsonl_series(dir / (name + ".jsonl"));
  run.grad_norms = test::jsonl_series(dir / (name + ".jsonl"), "grad_norm");
  std::regex validation(R"(validation loss at iteration \d+ \| lm loss value: ([0-9.eE+-]+))");
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), validation); it != std::sregex_iterator(); ++it) {
    run.validation_losses.push_back(std::stod((*it)[1]));
  }
  return run;
}

// The whole model from the checkpoint of `run`: every pipeline stage's file read, TP shards
// concatenated back. A tied embedding is held by the first and the last stage; the copies
// must be equal.
std::map<std::string, at::Tensor> full_parameters(const std::string& save_dir, int tp) {
  const std::string dir = latest_checkpoint_directory(save_dir);
  std::map<std::string, at::Tensor> full;
  if (tp == 1 && std::ifstream(dir + "/model.safetensors").good()) {
    SafetensorsFile file(dir + "/model.safetensors");
    for (const auto& name : file.names()) full[name] = file.load(name);
    return full;
  }
  const nlohmann::json state = read_checkpoint_state(dir);
  const int pp = state["parallel"].value("pipeline_model_parallel_size", 1);
  for (int stage = 0; stage < pp; ++stage) {
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    for (int r = 0; r < tp; ++r) files.push_back(std::make_unique<SafetensorsFile>(dir + "/" + checkpoint_part_name("model", r, stage)));
    for (const auto& name : files[0]->names()) {
      std::vector<at::Tensor> parts;
      for (auto& f : files) parts.push_back(f->load(name));
      // How the tensor splits, as the checkpoint's tensor table records it.
      const nlohmann::json& entry = state.at("tensors").at(name);
      const tp::ShardSpec spec{entry.at("split_dim").is_null() ? -1 : entry.at("split_dim").get<int>(), entry.at("gated").get<bool>()};
      at::Tensor whole = tp::unshard(parts, spec);
      if (full.count(name)) {
        EXPECT_TRUE(at::equal(full[name], whole)) << name << ": the copy on pipeline stage " << stage << " differs";
        continue;
      }
      full[name] = whole;
    }
  }
  return full;
}

class ParallelEquivalence : public ::testing::Test {
 protected:
  // The single-process reference runs, trained once per test process and shared by its tests;
  // their directory goes with the suite.
  static const TrainingRun& reference(const std::string& model) {
    std::unique_ptr<test::TempDir>& dir = reference_dir();
    if (!dir) dir = std::make_unique<test::TempDir>();
    static std::map<std::string, TrainingRun> runs;
    if (!runs.count(model)) runs[model] = train(*dir, "single_" + model, model, 1, {});
    return runs[model];
  }
  static void TearDownTestSuite() { reference_dir().reset(); }
  static std::unique_ptr<test::TempDir>& reference_dir() {
    static std::unique_ptr<test::TempDir> dir;
    return dir;
  }

  // name: the run's files in this test's directory (one per run of a test).
  void check(const std::string& model, int nproc, int tp, const std::vector<std::string>& layout,
             const std::string& name = "parallel") {
    const TrainingRun& single = reference(model);
    ASSERT_EQ(single.losses.size(), size_t(kSteps)) << single.output;
    TrainingRun run = train(dir_, name, model, nproc, layout);
    ASSERT_EQ(run.losses.size(), size_t(kSteps)) << run.output;
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_LE(std::abs(run.losses[i] - single.losses[i]), kTolerance * std::abs(single.losses[i]))
          << "iteration " << i + 1 << ": " << run.losses[i] << " vs single-process " << single.losses[i];
    }
    ASSERT_EQ(run.grad_norms.size(), size_t(kSteps)) << run.output;
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_LE(std::abs(run.grad_norms[i] - single.grad_norms[i]), 1e-4 * single.grad_norms[i])
          << "iteration " << i + 1 << ": grad norm " << run.grad_norms[i] << " vs single-process " << single.grad_norms[i];
    }
    ASSERT_EQ(run.validation_losses.size(), single.validation_losses.size()) << run.output;
    for (size_t i = 0; i < single.validation_losses.size(); ++i) {
      EXPECT_LE(std::abs(run.validation_losses[i] - single.validation_losses[i]), kTolerance * single.validation_losses[i])
          << "validation " << i << ": " << run.validation_losses[i] << " vs single-process " << single.validation_losses[i];
    }
    // The layouts must really differ from one process: TP shards on disk, DP ranks in the log.
    EXPECT_NE(run.output.find("> parallel layout: tensor " + std::to_string(tp)), std::string::npos) << run.output;

    const bool swiglu = model.rfind("llama", 0) == 0;
    auto expected = full_parameters(single.save_dir, 1);
    auto actual = full_parameters(run.save_dir, tp);
    ASSERT_EQ(actual.size(), expected.size());
    for (const auto& [name, want] : expected) {
      ASSERT_TRUE(actual.count(name)) << name;
      const at::Tensor& got = actual[name];
      ASSERT_TRUE(got.sizes().equals(want.sizes())) << name << " " << got.sizes() << " vs " << want.sizes();
      at::Tensor got_compared = got, want_compared = want;
      if (!swiglu && name.find("linear_qkv.bias") != std::string::npos) {
        // Without RoPE the key bias has an exactly zero gradient (it adds q.b_k to every score
        // of a query, which softmax ignores), so what it holds is rounding noise that Adam normalises into
        // steps of ~1e-6. Both runs must keep it at noise level; the query and value biases
        // are compared exactly as everything else.
        const int64_t groups = 4, head_dim = 16, per_group = 1;
        at::Tensor g = got.view({groups, per_group + 2, head_dim}), w = want.view({groups, per_group + 2, head_dim});
        EXPECT_LT(g.select(1, per_group).abs().max().item<double>(), 1e-4) << name;
        EXPECT_LT(w.select(1, per_group).abs().max().item<double>(), 1e-4) << name;
        got_compared = at::cat({g.narrow(1, 0, per_group), g.narrow(1, per_group + 1, 1)}, 1);
        want_compared = at::cat({w.narrow(1, 0, per_group), w.narrow(1, per_group + 1, 1)}, 1);
      }
      const double relative = (got_compared - want_compared).norm().item<double>() /
                              std::max(want_compared.norm().item<double>(), 1e-12);
      EXPECT_LE(relative, kTolerance) << name;
    }
  }

  test::TempDir dir_;
};

TEST_F(ParallelEquivalence, TensorParallel2) { check("llama", 2, 2, {"--tensor-model-parallel-size", "2"}); }

TEST_F(ParallelEquivalence, TensorParallel2SequenceParallel) {
  check("llama", 2, 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
}

TEST_F(ParallelEquivalence, TensorParallel2SequenceParallelLayerNormBiasesTied) {
  check("gpt", 2, 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
}

TEST_F(ParallelEquivalence, DataParallel2) { check("llama", 2, 1, {}); }

TEST_F(ParallelEquivalence, DataParallel2DistributedOptimizer) {
  check("llama", 2, 1, {"--use-distributed-optimizer"});
}

// Small buckets, overlapped reduction and parameter gather: several reduce-scatters in flight
// during backward, all-gathers into the next forward.
TEST_F(ParallelEquivalence, TensorParallel2DataParallel2DistributedOptimizerOverlapped) {
  check("llama", 4, 2, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                        "--ddp-bucket-size", "4000"});
}

TEST_F(ParallelEquivalence, TensorParallel2DataParallel2) {
  check("gpt", 4, 2, {"--tensor-model-parallel-size", "2"});
}

// Four tensor-parallel ranks (the 4-GPU layout's Gloo form), with the cross entropy through the
// fused path: per-slice statistics combined over four vocabulary slices. Vocabulary padding as
// the single process's (200 -> 256).
TEST_F(ParallelEquivalence, TensorParallel4CrossEntropyFusion) {
  check("gpt", 4, 4, {"--tensor-model-parallel-size", "4", "--make-vocab-size-divisible-by", "32",
                      "--cross-entropy-loss-fusion"});
}

// Pipelines. Stages hold contiguous layers; the embedding is on the first, the output layer on
// the last; the tied "gpt" model keeps a copy of the embedding on the last stage whose gradient
// is summed with the first stage's.
TEST_F(ParallelEquivalence, PipelineParallel2) { check("llama4", 2, 1, {"--pipeline-model-parallel-size", "2"}); }

TEST_F(ParallelEquivalence, PipelineParallel4Tied) { check("gpt4", 4, 1, {"--pipeline-model-parallel-size", "4"}); }

TEST_F(ParallelEquivalence, PipelineParallel2Uneven) {
  check("llama4", 2, 1, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"});
}

// Uneven and interleaved: stage 0 holds 2 of 6 layers, stage 1 four; each splits its layers over
// 2 chunks (virtual stages of 1, 2, 1, 2 layers).
TEST_F(ParallelEquivalence, PipelineParallel2UnevenInterleaved) {
  check("llama6", 2, 1, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "2",
                         "--num-virtual-stages-per-pipeline-rank", "2"});
}

// Two model chunks per rank (layers 0 and 2 on stage 0, 1 and 3 on stage 1); the last stage's
// first chunk feeds the first stage's second chunk.
TEST_F(ParallelEquivalence, PipelineParallel2InterleavedTied) {
  check("gpt4", 2, 1, {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"});
}

TEST_F(ParallelEquivalence, PipelineParallel2TensorParallel2SequenceParallel) {
  check("llama4", 4, 2, {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"});
}

// With the distributed optimizer the tied embedding gets a bucket of its own on both stages, so
// their DP shards of it line up when the stages sum its gradient.
TEST_F(ParallelEquivalence, PipelineParallel2DataParallel2DistributedOptimizerTied) {
  check("gpt4", 4, 1, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce",
                       "--overlap-param-gather", "--ddp-bucket-size", "4000"});
}

// Every axis at once on eight ranks: TP=2 (sequence parallel) x PP=2 x DP=2, distributed optimizer
// with overlapped reduction, fused cross entropy.
TEST_F(ParallelEquivalence, TensorParallel2PipelineParallel2DataParallel2DistributedOptimizer) {
  check("llama4", 8, 2, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
                         "--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "4000",
                         "--cross-entropy-loss-fusion"});
}

// Context parallelism: each rank holds 2 of 2 x CP sequence chunks (an early and a late one) and
// its attention sees every rank's keys by ring exchange (p2p), all-gather, or heads traded for
// the sequence (a2a; on 4 ranks the 2 key/value groups are copied per query head first).
TEST_F(ParallelEquivalence, ContextParallel2EachExchange) {
  for (const char* type : {"p2p", "all_gather", "a2a"}) {
    SCOPED_TRACE(type);
    check("llama", 2, 1, {"--context-parallel-size", "2", "--cp-comm-type", type}, type);
  }
  // Megatron's list form: one type per layer.
  check("llama", 2, 1, {"--context-parallel-size", "2", "--cp-comm-type", "a2a", "p2p"}, "per_layer");
}

TEST_F(ParallelEquivalence, ContextParallel4EachExchange) {
  for (const char* type : {"p2p", "all_gather", "a2a"}) {
    SCOPED_TRACE(type);
    check("llama", 4, 1, {"--context-parallel-size", "4", "--cp-comm-type", type}, type);
  }
  // Hierarchical: heads traded among pairs of adjacent ranks, the ring over the two pairs.
  check("llama", 4, 1, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"},
        "a2a_p2p");
}

TEST_F(ParallelEquivalence, ContextParallel2TensorParallel2SequenceParallel) {
  check("llama", 4, 2, {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"});
}

// Learned absolute positions read the true positions of each rank's chunks.
TEST_F(ParallelEquivalence, ContextParallel2PipelineParallel2Tied) {
  check("gpt4", 4, 1, {"--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"});
  check("gpt4", 4, 1, {"--context-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                       "--num-virtual-stages-per-pipeline-rank", "2"}, "interleaved");
}

// The distributed optimizer shards over DP x CP (4 shards) and gradients are averaged there.
// Per-token loss: the gradients summed over every CP rank's tokens, divided by their count (every
// micro-batch of mock data has as many loss tokens, so it equals the default).
TEST_F(ParallelEquivalence, ContextParallel2DataParallel2DistributedOptimizer) {
  check("llama", 4, 1, {"--context-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce",
                        "--ddp-bucket-size", "4000"});
  check("llama", 2, 1, {"--context-parallel-size", "2", "--calculate-per-token-loss"}, "per_token");
}

// Resharding on load: a checkpoint saved at iteration 10 under one layout resumes under another
// (optimizer state included) and the last 10 losses equal the uninterrupted single-process run's.
// Pipeline stages are joined by parameter name and split again for the new stages.
TEST_F(ParallelEquivalence, CheckpointsReshardToAnyLayout) {
  const TrainingRun& single = reference("llama");
  ASSERT_EQ(single.losses.size(), size_t(kSteps));
  struct Case {
    std::string name;
    int save_nproc;
    std::vector<std::string> save_layout;
    int load_nproc;
    std::vector<std::string> load_layout;
  };
  const std::vector<Case> cases = {
      {"tp2dp2_zero1_to_single", 4, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}, 1, {}},
      {"tp2dp2_zero1_to_dp2_zero1", 4, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer"}, 2,
       {"--use-distributed-optimizer"}},
      {"single_to_tp2_sp", 1, {}, 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_to_tp2", 2, {}, 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2pp2_zero1_to_single", 4,
       {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}, 1, {}},
      {"pp2dp2_zero1_to_dp2", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}, 2, {}},
      // CP is not part of the saved layout: its ranks' optimizer shards are read as DP shards.
      {"cp2tp2_sp_zero1_to_single", 4,
       {"--context-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}, 1, {}},
      {"single_to_pp2_uneven_tp2", 1, {}, 4,
       {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "1"}},
  };
  for (const auto& c : cases) {
    test::TempDir dir;
    auto args = [&](int nproc, const std::vector<std::string>& layout, const std::vector<std::string>& extra) {
      std::vector<std::string> a;
      if (nproc > 1) a = {"launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0"};
      a.push_back("train");
      for (const auto& f : model_flags("llama")) a.push_back(f);
      a.insert(a.end(), layout.begin(), layout.end());
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    auto first = test::run_megatron(args(c.save_nproc, c.save_layout, {"--save", dir / "ckpt", "--exit-interval", "10"}));
    ASSERT_EQ(first.status, 0) << c.name << "\n" << first.output;
    auto second = test::run_megatron(args(c.load_nproc, c.load_layout, {"--load", dir / "ckpt", "--metrics-jsonl", dir / "rest.jsonl"}));
    ASSERT_EQ(second.status, 0) << c.name << "\n" << second.output;
    EXPECT_NE(second.output.find("resharded to"), std::string::npos) << c.name << "\n" << second.output;
    const auto rest = test::jsonl_series(dir / "rest.jsonl");
    ASSERT_EQ(rest.size(), size_t(kSteps - 10)) << c.name << "\n" << second.output;
    for (int i = 0; i < kSteps - 10; ++i) {
      EXPECT_LE(std::abs(rest[i] - single.losses[10 + i]), kTolerance * std::abs(single.losses[10 + i]))
          << c.name << ": iteration " << 11 + i << ": " << rest[i] << " vs uninterrupted " << single.losses[10 + i];
    }
  }
}

// Every replica prints the hash of its weights; the replicas of each TP rank must agree (the
// trainer also compares them itself and fails on a mismatch).
TEST(DataParallelReplicas, WeightsIdenticalAfterTraining) {
  test::TempDir dir;
  std::vector<std::string> args = {"launch", "--nproc-per-node", "4", "--master-port", "0", "train"};
  for (const auto& a : model_flags("llama")) args.push_back(a);
  for (const auto& a : {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer",
                        "--check-weight-hash-across-dp-replicas-interval", "10"}) {
    args.push_back(a);
  }
  auto run = test::run_megatron(args);
  ASSERT_EQ(run.status, 0) << run.output;
  std::regex pattern(R"(iteration (\d+): weight hash ([0-9a-f]+) \(tensor-parallel rank (\d), data-parallel rank (\d)\))");
  std::map<std::pair<std::string, std::string>, std::vector<std::string>> hashes;  // (iteration, tp rank) -> per DP rank
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), pattern); it != std::sregex_iterator(); ++it) {
    hashes[{(*it)[1], (*it)[3]}].push_back((*it)[2]);
  }
  ASSERT_EQ(hashes.size(), 4u) << run.output;  // iterations 10 and 20, two TP ranks
  for (const auto& [key, values] : hashes) {
    ASSERT_EQ(values.size(), 2u) << run.output;
    EXPECT_EQ(values[0], values[1]) << "iteration " << key.first << ", TP rank " << key.second;
  }
  // The two TP ranks hold different shards.
  const auto tp0 = std::make_pair(std::string("20"), std::string("0"));
  const auto tp1 = std::make_pair(std::string("20"), std::string("1"));
  EXPECT_NE(hashes[tp0][0], hashes[tp1][0]);
}

// Recomputation across processes: under TP=2 + SP with dropout on (the model-parallel generator
// draws the attention masks, the sequence-parallel hidden masks), under PP=2 (block) and under
// CP=2 (selective and full: the exchanges run again in the backward), the
// losses are bitwise those of the same layout keeping its activations.
TEST(ParallelRecompute, EqualsKeepingActivations) {
  test::TempDir dir;
  const std::vector<std::string> tp2 = {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-dropout", "0.1",
                                        "--attention-dropout", "0.1", "--train-iters", "6", "--eval-interval", "0"};
  const std::vector<std::string> pp2 = {"--pipeline-model-parallel-size", "2", "--hidden-dropout", "0.1", "--train-iters", "6",
                                        "--eval-interval", "0"};
  // Recomputing core attention under CP runs the ring again in the backward.
  const std::vector<std::string> cp2 = {"--context-parallel-size", "2", "--hidden-dropout", "0.1", "--train-iters", "6",
                                        "--eval-interval", "0"};
  struct Case {
    std::string name, model;
    const std::vector<std::string>* layout;
    std::vector<std::string> recompute;
    std::string setup_line;  // what the trainer says it recomputes
  };
  const std::vector<Case> cases = {
      {"tp_full", "llama", &tp2, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
       "> activation recomputation: full, groups of 1 layer(s)"},
      {"tp_selective", "llama", &tp2, {"--recompute-activations"}, "> activation recomputation: selective (core attention)"},
      {"pp_block", "llama4", &pp2, {"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"},
       "the first 1 layer(s) of each model chunk"},
      {"cp_selective", "llama", &cp2, {"--recompute-activations"}, "> activation recomputation: selective (core attention)"},
      {"cp_full", "llama", &cp2, {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"},
       "> activation recomputation: full, groups of 1 layer(s)"},
  };
  std::map<const std::vector<std::string>*, TrainingRun> plain;  // per layout, keeping activations
  for (const Case& c : cases) {
    if (!plain.count(c.layout)) plain[c.layout] = train(dir, c.name + "_plain", c.model, 2, *c.layout);
    const TrainingRun& reference = plain[c.layout];
    ASSERT_EQ(reference.losses.size(), 6u) << reference.output;
    std::vector<std::string> layout = *c.layout;
    layout.insert(layout.end(), c.recompute.begin(), c.recompute.end());
    const TrainingRun run = train(dir, c.name, c.model, 2, layout);
    EXPECT_EQ(run.losses, reference.losses) << c.name << "\n" << run.output;
    EXPECT_NE(run.output.find(c.setup_line), std::string::npos) << c.name << "\n" << run.output;
  }
}

// Checkpoints under TP x DP with the distributed optimizer (written asynchronously, so publishing
// waits for every rank): every rank saves its part; a run
// stopped at iteration 4 and resumed prints exactly the uninterrupted run's losses (dropout on, so
// the default and model-parallel generator states must come back too), and a different model is
// refused.
TEST(ParallelCheckpoints, ResumeUnderTensorAndDataParallelEqualsUninterrupted) {
  test::TempDir dir;
  auto args = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"launch", "--nproc-per-node", "4", "--master-port", "0", "train"};
    for (const auto& f : model_flags("llama")) a.push_back(f);
    for (const auto& f : {"--train-iters", "8", "--tensor-model-parallel-size", "2", "--sequence-parallel",
                          "--use-distributed-optimizer", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"}) {
      a.push_back(f);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto whole = test::run_megatron(args({"--metrics-jsonl", dir / "whole.jsonl"}));
  ASSERT_EQ(whole.status, 0) << whole.output;
  auto first = test::run_megatron(args({"--save", dir / "ckpt", "--exit-interval", "4", "--save-interval", "2", "--async-save",
                                        "--metrics-jsonl", dir / "resumed.jsonl"}));
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string iter4 = dir / "ckpt/iter_0000004";
  for (const char* part : {"model_tp00_pp000", "model_tp01_pp000", "optimizer_tp00_pp000_dp000", "optimizer_tp01_pp000_dp001",
                           "rng_rank00000", "rng_rank00003"}) {
    EXPECT_TRUE(std::ifstream(iter4 + "/" + part + ".safetensors").good()) << part;
  }
  {  // state.json describes every file's slice of every tensor
    const nlohmann::json state = read_checkpoint_state(iter4);
    const nlohmann::json& fc1 = state.at("tensors").at("decoder.layers.1.mlp.linear_fc1.weight");
    EXPECT_EQ(fc1.at("shape"), nlohmann::json({256, 64}));  // [gate; up] of ffn 128, hidden 64
    EXPECT_EQ(fc1.at("dtype"), "F32");
    EXPECT_EQ(fc1.at("split_dim"), 0);
    EXPECT_TRUE(fc1.at("gated").get<bool>());
    ASSERT_EQ(fc1.at("files").size(), 2u);
    EXPECT_EQ(fc1.at("files")[1].at("file"), "model_tp01_pp000.safetensors");
    EXPECT_TRUE(state.at("tensors").at("decoder.final_layernorm.weight").at("split_dim").is_null());
    // The distributed optimizer: each TP shard's state in DP slices that tile it.
    const nlohmann::json& moments = state.at("optimizer_tensors").at("decoder.layers.1.mlp.linear_fc1.weight.exp_avg");
    int64_t covered[2] = {0, 0};
    for (const auto& part : moments.at("files")) covered[part.at("tp_rank").get<int>()] += part.at("numel").get<int64_t>();
    EXPECT_EQ(covered[0], 128 * 64);
    EXPECT_EQ(covered[1], 128 * 64);
  }
  auto second = test::run_megatron(args({"--load", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"}));
  ASSERT_EQ(second.status, 0) << second.output;
  std::ifstream a(dir / "whole.jsonl"), b(dir / "resumed.jsonl");
  std::vector<std::string> la, lb;
  for (std::string l; std::getline(a, l);) la.push_back(l);
  for (std::string l; std::getline(b, l);) lb.push_back(l);
  ASSERT_EQ(la.size(), 8u);
  EXPECT_EQ(la, lb);

  // A different model is refused (a different layout is resharded: CheckpointsReshardToAnyLayout).
  std::vector<std::string> other = {"train"};
  for (const auto& f : model_flags("llama")) other.push_back(f);
  for (const auto& f : {"--ffn-hidden-size", "96", "--load"}) other.push_back(f);
  other.push_back(dir / "ckpt");
  auto refused = test::run_megatron(other);
  EXPECT_EQ(refused.status, 2) << refused.output;
  EXPECT_NE(refused.output.find("differs from the configured one"), std::string::npos) << refused.output;
}

}  // namespace
}  // namespace megatron
