// `megatron plan`: the parameters it counts on each rank against the models the ranks build, its
// memory estimates against the peaks measured on GPUs (docs/performance.md), its layouts against
// train's own checks, and its errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "distributed/parallel_state.h"
#include "model/family.h"
#include "model/gpt_model.h"
#include "pipeline/layout.h"
#include "plan/layout_search.h"
#include "plan/model_for_plan.h"
#include "support/gloo_ranks.h"
#include "support/test_support.h"
#include "train/arguments.h"

namespace megatron {
namespace {

using Flags = std::vector<std::string>;

Flags concat(Flags a, const Flags& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A small Llama of 4 layers; tied or untied embeddings.
const Flags kTinyLlama = {"--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--group-query-attention",
                          "--num-query-groups", "2", "--ffn-hidden-size", "128", "--swiglu", "--normalization", "RMSNorm",
                          "--position-embedding-type", "rope", "--disable-bias-linear", "--vocab-size", "1000", "--seq-length",
                          "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "8",
                          "--attention-dropout", "0", "--hidden-dropout", "0"};
const Flags kTinyMoe = concat(kTinyLlama, {"--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32",
                                           "--moe-layer-freq", "([0]*1+[1]*3)", "--untie-embeddings-and-output-weights"});
const Flags kTinyDeepSeek = {"--model-family", "deepseek_v3", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads",
                             "4", "--q-lora-rank", "32", "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8",
                             "--v-head-dim", "16", "--ffn-hidden-size", "128", "--num-experts", "8", "--moe-router-topk", "2",
                             "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32", "--moe-layer-freq",
                             "([0]*1+[1]*3)", "--mtp-num-layers", "1", "--vocab-size", "1000", "--seq-length", "32",
                             "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "8"};

// What every rank of `layout` (on 8 ranks) builds, on the meta device as the trainer would build
// it, against the census's count for its pipeline stage.
void expect_ranks_hold_the_census(const Flags& model, const Flags& layout) {
  Config config = plan::model_for_plan(concat(model, layout));
  Config single = plan::model_for_plan(model);
  finalize_config(single, 1);
  const plan::ParameterCensus census(single.model);
  finalize_config(config, 8);
  const ParallelConfig& p = config.parallel;
  std::vector<int64_t> built(8, -1), counted(8, -2);
  test::on_gloo_worlds(8, [&](int rank, dist::World& world) {
    const dist::ParallelState ps = dist::ParallelState::build(world, p);
    tp::TensorParallel tensor_parallel{ps.tp, p.sequence_parallel, nullptr};
    tensor_parallel.experts = ps.ep;
    tensor_parallel.expert_group = ps.expert_tp;
    int64_t n = 0;
    for (int v = 0; v < p.num_virtual_stages_per_pipeline_rank; ++v) {
      const GPTModel chunk(config.model, tensor_parallel, pipeline::chunk_layers(p, config.model.num_layers, ps.pp.rank(), v),
                           std::nullopt, at::kMeta);
      for (const auto& param : chunk.parameters()) n += param.numel();
    }
    built[size_t(rank)] = n;
    const plan::ParameterCensus::RankCount c = census.on_rank(config, ps.pp.rank());
    counted[size_t(rank)] = c.dense + c.expert;
  });
  std::string where;
  for (const auto& f : layout) where += f + " ";
  EXPECT_EQ(built, counted) << where;
}

TEST(PlanParameters, EveryRankHoldsWhatTheCensusCounts) {
  // Tied embeddings (the last stage's copy), interleaving, TP's padded vocabulary.
  expect_ranks_hold_the_census(kTinyLlama, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                            "--num-virtual-stages-per-pipeline-rank", "2"});
  expect_ranks_hold_the_census(concat(kTinyLlama, {"--untie-embeddings-and-output-weights"}),
                               {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--pipeline-model-parallel-size",
                                "2", "--sequence-parallel"});
  // An uneven split.
  expect_ranks_hold_the_census(concat(kTinyLlama, {"--num-layers", "5"}),
                               {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "2"});
  // Experts over EP, split over TP or whole (ETP 1).
  expect_ranks_hold_the_census(kTinyMoe, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                                          "--pipeline-model-parallel-size", "2", "--sequence-parallel"});
  expect_ranks_hold_the_census(kTinyMoe, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "4",
                                          "--expert-tensor-parallel-size", "1", "--sequence-parallel"});
  // MLA, shared experts, multi-token prediction on the last stage.
  expect_ranks_hold_the_census(kTinyDeepSeek, {"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "4"});
  expect_ranks_hold_the_census(kTinyDeepSeek, {"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2",
                                               "--pipeline-model-parallel-size", "2", "--sequence-parallel"});
}

// One GPU's estimate for `flags`, the allocator's peak (what max_allocated measured).
double estimated_allocated_gib(const Flags& flags) {
  plan::Cluster cluster;
  cluster.gpu = plan::gpu_named("h200");
  cluster.num_gpus = 1;
  const plan::Plan plan = plan::search_layouts(plan::model_for_plan(flags), cluster);
  EXPECT_EQ(plan.candidates.size(), 1u);
  return plan.candidates.at(0).memory.allocated() / plan::kGiB;
}

TEST(PlanMemory, EstimatesMatchThePeaksMeasuredOnGpus) {
  // Peaks measured on one H200 / H100 (CUDA allocator's max allocated; docs/performance.md's
  // sections named below). The estimate is within 8% of each.
  const Flags two_b = {"--num-layers", "28", "--hidden-size", "2048", "--num-attention-heads", "16", "--group-query-attention",
                       "--num-query-groups", "8", "--kv-channels", "128", "--ffn-hidden-size", "6144", "--swiglu", "--normalization",
                       "RMSNorm", "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                       "--vocab-size", "151936", "--seq-length", "4096", "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16"};
  const Flags bf16_state = {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
                            "--main-grads-dtype", "bf16"};
  const Flags bench_1b = {"--config", test::source_dir() + "/examples/llama-1.1b-bench.yaml"};
  const Flags long_1b = concat(bench_1b, {"--micro-batch-size", "1", "--global-batch-size", "1", "--recompute-granularity", "full",
                                          "--recompute-method", "uniform", "--recompute-num-layers", "1", "--seq-length"});
  const Flags llama8b = {"--config", test::source_dir() + "/examples/llama3-8b.yaml", "--vocab-size", "128256", "--global-batch-size", "1"};
  const Flags qwen_moe = {"--model-family", "qwen3_moe", "--num-layers", "6", "--hidden-size", "2048", "--num-attention-heads", "32",
                          "--num-query-groups", "4", "--kv-channels", "128", "--ffn-hidden-size", "6144", "--num-experts", "128",
                          "--moe-router-topk", "8", "--moe-ffn-hidden-size", "768", "--seq-length", "4096", "--max-position-embeddings",
                          "4096", "--micro-batch-size", "1", "--vocab-size", "151935", "--bf16", "--global-batch-size", "8"};
  const Flags deepseek = {"--model-family", "deepseek_v2", "--num-layers", "6", "--hidden-size", "2048", "--num-attention-heads", "16",
                          "--kv-lora-rank", "512", "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
                          "--ffn-hidden-size", "10944", "--num-experts", "64", "--moe-router-topk", "6", "--moe-ffn-hidden-size", "1408",
                          "--moe-shared-expert-intermediate-size", "2816", "--moe-layer-freq", "([0]*1+[1]*5)", "--seq-length", "4096",
                          "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--vocab-size", "102399", "--bf16",
                          "--global-batch-size", "8"};
  const double gb = 1e9 / plan::kGiB;  // the MoE rows were measured in 10^9 bytes
  const struct {
    Flags flags;
    double measured_gib;
    const char* where;
  } cases[] = {
      {two_b, 43.5, "Memory: the precision-aware optimizer on a 2B Qwen3-sized shape (session 15)"},
      {concat(two_b, bf16_state), 28.3, "the same, precision-aware"},
      {concat(concat(two_b, bf16_state), {"--recompute-granularity", "selective", "--recompute-modules", "mlp"}), 24.4, "the same, mlp recomputed"},
      {concat(concat(two_b, bf16_state), {"--recompute-granularity", "selective", "--recompute-modules", "mlp", "layernorm"}), 23.5,
       "the same, mlp and layernorm recomputed"},
      {concat(concat(two_b, bf16_state), {"--cpu-offloading-num-layers", "7"}), 26.6, "Activation offload on the 2B shape: 7 layers"},
      {concat(concat(two_b, bf16_state), {"--cpu-offloading-num-layers", "14"}), 24.8, "the same, 14 layers"},
      {concat(concat(two_b, bf16_state), {"--cpu-offloading-num-layers", "27"}), 21.6, "the same, 27 layers"},
      {bench_1b, 29.5, "Single H200, Llama 1.1B reference shape"},
      {concat(bench_1b, {"--grad-reduce-in-bf16"}), 27.5, "the same, bf16 gradients"},
      {concat(long_1b, {"32768", "--max-position-embeddings", "32768"}), 28.0, "Llama 1.1B at seq 32k, full recomputation"},
      {concat(long_1b, {"65536", "--max-position-embeddings", "65536"}), 37.6, "Llama 1.1B at seq 64k, full recomputation"},
      {concat(llama8b, {"--num-layers", "8"}), 59.5, "FP8 on the Llama-3-8B layer shape: bf16 at 8 layers (session 16)"},
      {concat(llama8b, {"--num-layers", "20"}), 116.0, "the same at 20 layers"},
      {qwen_moe, 80.9 * gb, "The MoE shapes with bf16 gradients and Adam moments (session 23): Qwen3-30B-A3B, default"},
      {concat(qwen_moe, bf16_state), 47.6 * gb, "the same, bf16 gradients and moments"},
      {deepseek, 65.0 * gb, "the same section: DeepSeek-V2-Lite, default"},
      {concat(deepseek, bf16_state), 38.9 * gb, "the same, bf16 gradients and moments"},
      // Session 50, one H100 (bench/gpu_plan_check.sh): shapes the rows above did not include.
      {concat(bench_1b, {"--bf16", "false", "--micro-batch-size", "2", "--global-batch-size", "2"}), 53563.2 / 1024,
       "Llama 1.1B in fp32, micro-batch 2"},
      {{"--config", test::source_dir() + "/examples/qwen3-8b.yaml", "--vocab-size", "151936", "--num-layers", "6",
        "--micro-batch-size", "2", "--global-batch-size", "2"},
       52597.2 / 1024, "Qwen3-8B shape, 6 layers, micro-batch 2"},
      {{"--config", test::source_dir() + "/examples/deepseek-v3.yaml", "--vocab-size", "129280", "--num-layers", "4", "--hidden-size",
        "2048", "--num-attention-heads", "16", "--q-lora-rank", "768", "--num-experts", "32", "--moe-router-num-groups", "4",
        "--moe-router-group-topk", "2", "--moe-ffn-hidden-size", "1024", "--moe-shared-expert-intermediate-size", "1024",
        "--moe-layer-freq", "([0]*1+[1]*3)", "--ffn-hidden-size", "8192", "--global-batch-size", "1"},
       31553.8 / 1024, "DeepSeek-V3-like, 4 layers, 32 experts, MTP 1"},
      {concat(llama8b, {"--num-layers", "6", "--recompute-granularity", "full", "--recompute-method", "block",
                        "--recompute-num-layers", "3"}),
       48264.4 / 1024, "Llama-3-8B shape, 6 layers, block recompute of 3"},
      {concat(concat(deepseek, bf16_state), {"--global-batch-size", "1", "--recompute-granularity", "selective", "--recompute-modules",
                                             "mla_up_proj", "moe_act", "layernorm"}),
       38198.7 / 1024, "DeepSeek-V2-Lite shape, bf16 state, recompute mla_up_proj moe_act layernorm"},
      {concat(concat(qwen_moe, bf16_state), {"--global-batch-size", "1", "--recompute-granularity", "selective", "--recompute-modules",
                                             "moe"}),
       45091.4 / 1024, "Qwen3-30B-A3B shape, bf16 state, recompute moe"},
      {concat({"--config", test::source_dir() + "/examples/qwen2-57b-a14b.yaml", "--vocab-size", "151936", "--num-layers", "2",
               "--global-batch-size", "1", "--micro-batch-size", "1", "--seq-length", "4096"},
              bf16_state),
       55028.7 / 1024, "Qwen2-57B-A14B shape, 2 layers, bf16 state (gated shared experts)"},
      {concat(bench_1b, {"--hidden-dropout", "0.1", "--micro-batch-size", "2", "--global-batch-size", "2"}), 24924.5 / 1024,
       "Llama 1.1B shape, hidden dropout 0.1, micro-batch 2"},
  };
  for (const auto& c : cases) {
    const double estimate = estimated_allocated_gib(c.flags);
    EXPECT_NEAR(estimate / c.measured_gib, 1.0, 0.08) << c.where << ": estimated " << estimate << " GiB, measured " << c.measured_gib;
  }
}

// What the trainer's schedule held at its peak, per pipeline stage (its memory report counts
// chunk forwards not yet run backward), on 2 real processes over Gloo.
std::map<int, int> schedule_in_flight(const Flags& pipeline, int micro_batches) {
  Flags model = kTinyLlama;
  *(std::find(model.begin(), model.end(), "--global-batch-size") + 1) = std::to_string(micro_batches);
  Flags args = {"launch", "--nproc-per-node", "2", "--master-port", "0", "train"};
  args = concat(concat(args, model), pipeline);
  args = concat(args, {"--train-iters", "1", "--lr", "1e-3", "--mock-data",
                       "--tokenizer-type", "NullTokenizer", "--log-interval", "1", "--cpu-threads", "1", "--device", "cpu"});
  const auto run = test::run_megatron(args);
  EXPECT_EQ(run.status, 0) << run.output;
  std::regex line(R"(micro-batches in flight at peak: (\d+) \| pipeline stage: (\d))");
  std::map<int, int> stages;
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), line); it != std::sregex_iterator(); ++it) {
    stages[std::stoi((*it)[2])] = std::stoi((*it)[1]);
  }
  EXPECT_EQ(stages.size(), 2u) << run.output;
  return stages;
}

TEST(PlanMemory, MicroBatchesInFlightAreTheSchedules) {
  for (const auto& [chunks, micro_batches] : {std::pair{1, 8}, {1, 1}, {2, 8}, {2, 4}, {2, 2}}) {
    Flags pipeline = {"--pipeline-model-parallel-size", "2"};
    if (chunks > 1) pipeline = concat(pipeline, {"--num-virtual-stages-per-pipeline-rank", std::to_string(chunks)});
    const std::map<int, int> held = schedule_in_flight(pipeline, micro_batches);
    for (int stage = 0; stage < 2; ++stage) {
      EXPECT_EQ(held.count(stage) ? held.at(stage) : -1, plan::chunks_in_flight(2, stage, chunks, micro_batches))
          << "stage " << stage << ", " << chunks << " chunks, " << micro_batches << " micro-batches";
    }
  }
}

TEST(PlanSearch, ProposesOnlyLayoutsTrainAcceptsAndKeepsTheGivenFlags) {
  const Flags llama8b = {"--config", test::source_dir() + "/examples/llama3-8b.yaml", "--vocab-size", "128256"};
  plan::Cluster cluster;
  cluster.gpu = plan::gpu_named("h100");
  cluster.num_gpus = 32;
  cluster.gpus_per_node = 16;  // TP 16 is searched: 8 query groups do not divide over it
  const plan::Plan plan = plan::search_layouts(plan::model_for_plan(llama8b), cluster);
  ASSERT_FALSE(plan.candidates.empty());
  EXPECT_TRUE(plan.candidates.front().fits);
  bool refused_groups = false;
  for (const auto& [reason, n] : plan.rejections) refused_groups |= reason.find("--num-query-groups") != std::string::npos;
  EXPECT_TRUE(refused_groups) << "TP 16 with 8 query groups was not refused";
  bool fitting_then_not = true, seen_unfit = false;
  for (const plan::Candidate& c : plan.candidates) {
    // The flags it prints give train the same layout.
    Flags flags = llama8b;
    std::istringstream words(c.flags());
    for (std::string w; words >> w;) flags.push_back(w);
    Config again = plan::model_for_plan(flags);
    ASSERT_NO_THROW(finalize_config(again, 32)) << c.flags();
    EXPECT_EQ(again.parallel.data_parallel_size, c.config.parallel.data_parallel_size) << c.flags();
    EXPECT_EQ(again.parallel.num_virtual_stages_per_pipeline_rank, c.config.parallel.num_virtual_stages_per_pipeline_rank) << c.flags();
    EXPECT_LE(c.config.parallel.tensor_model_parallel_size, 16);
    if (!c.fits) seen_unfit = true;
    if (c.fits && seen_unfit) fitting_then_not = false;
  }
  EXPECT_TRUE(fitting_then_not) << "layouts that fit come first";
  for (size_t i = 1; i < plan.candidates.size() && plan.candidates[i].fits; ++i) {
    EXPECT_GE(plan.candidates[i - 1].step.tokens_per_second_per_gpu, plan.candidates[i].step.tokens_per_second_per_gpu);
  }

  // A layout flag given is kept.
  const plan::Plan pinned = plan::search_layouts(plan::model_for_plan(concat(llama8b, {"--tensor-model-parallel-size", "4"})), cluster);
  ASSERT_FALSE(pinned.candidates.empty());
  EXPECT_EQ(pinned.kept_flags, std::vector<std::string>{"tensor-model-parallel-size"});
  for (const plan::Candidate& c : pinned.candidates) EXPECT_EQ(c.config.parallel.tensor_model_parallel_size, 4);
}

TEST(PlanSearch, RecomputesWhereNothingElseFits) {
  // Llama 1.1B at 64k on one H100 fits only with its layers recomputed.
  const Flags flags = {"--config", test::source_dir() + "/examples/llama-1.1b-bench.yaml", "--seq-length", "65536",
                       "--max-position-embeddings", "65536", "--micro-batch-size", "1", "--global-batch-size", "1"};
  plan::Cluster cluster;
  cluster.gpu = plan::gpu_named("h100");
  cluster.num_gpus = 1;
  const plan::Plan plan = plan::search_layouts(plan::model_for_plan(flags), cluster);
  ASSERT_EQ(plan.candidates.size(), 1u);
  EXPECT_TRUE(plan.candidates[0].fits);
  EXPECT_EQ(plan.candidates[0].config.model.recompute_granularity, "full");
  EXPECT_NE(plan.candidates[0].flags().find("--recompute-granularity full"), std::string::npos);
}

// The step estimate of `flags` finalized on `world` ranks of `cluster`.
plan::StepEstimate step_of(const Flags& flags, const plan::Cluster& cluster) {
  Config single = plan::model_for_plan(flags);
  Config layout = single;
  single.parallel = ParallelConfig();
  finalize_config(single, 1);
  finalize_config(layout, cluster.num_gpus);
  const plan::ParameterCensus census(single.model);
  const double flops = family_of(single.model).flops_per_token(single.model, census.total());
  return plan::estimate_step(layout, cluster, flops, census.on_rank(layout, 0));
}

TEST(PlanStep, TermsFollowTheLayout) {
  plan::Cluster cluster;
  cluster.gpu = plan::gpu_named("h100");
  cluster.num_gpus = 8;
  const Flags llama8b = {"--config", test::source_dir() + "/examples/llama3-8b.yaml", "--vocab-size", "128256",
                         "--global-batch-size", "16", "--use-distributed-optimizer"};
  // The bubble: (PP - 1) / chunks of the 8 micro-batches each DP rank runs.
  const plan::StepEstimate pp4 = step_of(concat(llama8b, {"--pipeline-model-parallel-size", "4"}), cluster);
  EXPECT_NEAR(pp4.bubble / pp4.compute, 3.0 / 8.0, 1e-9);
  const plan::StepEstimate interleaved =
      step_of(concat(llama8b, {"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"}), cluster);
  EXPECT_NEAR(interleaved.bubble / interleaved.compute, 1.5 / 8.0, 1e-9);
  // TP moves its activations at NVLink speed within a node and at the network's beyond it.
  const Flags tp8 = concat(llama8b, {"--tensor-model-parallel-size", "8", "--sequence-parallel"});
  const plan::StepEstimate inside = step_of(tp8, cluster);
  cluster.gpus_per_node = 4;
  const plan::StepEstimate across = step_of(tp8, cluster);
  EXPECT_GT(inside.tensor_parallel, 0);
  EXPECT_NEAR(across.tensor_parallel / inside.tensor_parallel, cluster.gpu.nvlink_gb_per_s / cluster.network_gb_per_s, 1e-9);
  // Overlapped, the distributed optimizer's traffic hides under a step's compute; not, it shows.
  cluster.gpus_per_node = 8;
  const Flags dp8 = llama8b;
  EXPECT_EQ(step_of(concat(dp8, {"--overlap-grad-reduce", "--overlap-param-gather"}), cluster).data_parallel, 0);
  EXPECT_GT(step_of(dp8, cluster).data_parallel, 0);
  // CP's ring costs more the shorter its chunks.
  const plan::StepEstimate cp2 = step_of(concat(llama8b, {"--context-parallel-size", "2"}), cluster);
  const plan::StepEstimate cp8 = step_of(concat(llama8b, {"--context-parallel-size", "8"}), cluster);
  EXPECT_GT(cp8.compute * 8, cp2.compute * 2 * 1.01);  // the same work spread over 4x the ranks, and more
  // Micro-batches of two sequences do the work of two of one.
  const Flags overlapped = concat(llama8b, {"--context-parallel-size", "2", "--overlap-grad-reduce", "--overlap-param-gather"});
  EXPECT_NEAR(step_of(concat(overlapped, {"--micro-batch-size", "2"}), cluster).total(), step_of(overlapped, cluster).total(), 1e-9);

  // On one H200, the 1.1B shape at seq 32k and 64k with every layer recomputed: within 10% of
  // the tokens/s measured (20.3k / 13.1k; docs/performance.md, context parallelism, session 27).
  cluster.gpu = plan::gpu_named("h200");
  cluster.num_gpus = 1;
  const Flags long_1b = {"--config", test::source_dir() + "/examples/llama-1.1b-bench.yaml", "--micro-batch-size", "1",
                         "--global-batch-size", "1", "--recompute-granularity", "full", "--recompute-method", "uniform",
                         "--recompute-num-layers", "1"};
  for (const auto& [seq, measured] : {std::pair<const char*, double>{"32768", 20286}, {"65536", 13116}}) {
    const plan::StepEstimate s = step_of(concat(long_1b, {"--seq-length", seq, "--max-position-embeddings", seq}), cluster);
    EXPECT_NEAR(s.tokens_per_second_per_gpu / measured, 1.0, 0.10) << seq;
  }
}

TEST(PlanCommand, PrintsTheBestLayoutAndNamesWhatIsWrong) {
  const std::string recipe = test::source_dir() + "/examples/llama3-8b.yaml";
  auto best = test::run_megatron({"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "16", "--gpu", "h200"});
  EXPECT_EQ(best.status, 0) << best.output;
  for (const char* part : {"model: 8.03B parameters", "cluster: 16 x h200", "| 1 |", "best: megatron launch --nproc-per-node 8",
                           "--use-distributed-optimizer"}) {
    EXPECT_NE(best.output.find(part), std::string::npos) << part << " not in\n" << best.output;
  }
  // The same plan as JSON: the table's best row, the same flags, nothing else on stdout.
  auto json = test::run_megatron({"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "16", "--gpu", "h200", "--json",
                                  "--top", "3"});
  ASSERT_EQ(json.status, 0) << json.output;
  const nlohmann::json doc = nlohmann::json::parse(json.output);
  EXPECT_EQ(doc.at("model").at("parameters").get<int64_t>() / 10000000, 803) << doc.at("model");
  EXPECT_EQ(doc.at("cluster").at("gpu"), "h200");
  ASSERT_EQ(doc.at("layouts").size(), 3u);
  const nlohmann::json& first = doc.at("layouts")[0];
  EXPECT_TRUE(first.at("fits").get<bool>());
  EXPECT_EQ(first.at("tensor_model_parallel_size").get<int>() * first.at("pipeline_model_parallel_size").get<int>() *
                first.at("context_parallel_size").get<int>() * first.at("data_parallel_size").get<int>(),
            16);
  EXPECT_NEAR(first.at("memory_gib").at("total").get<double>(),
              first.at("memory_gib").at("weights").get<double>() + first.at("memory_gib").at("gradients").get<double>() +
                  first.at("memory_gib").at("optimizer").get<double>() + first.at("memory_gib").at("activations").get<double>() +
                  first.at("memory_gib").at("logits").get<double>() + first.at("memory_gib").at("other").get<double>(),
              1e-9);
  EXPECT_EQ(doc.at("best").at("flags"), first.at("flags"));
  EXPECT_NE(best.output.find(first.at("flags").get<std::string>()), std::string::npos) << "the table's best is the JSON's";
  EXPECT_GT(doc.at("layouts_judged").get<int64_t>(), 3);

  // Nothing fits: Llama-3-8B's weights and optimizer alone on one A100.
  auto none = test::run_megatron({"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "1", "--gpu", "a100"});
  EXPECT_EQ(none.status, 1) << none.output;
  EXPECT_NE(none.output.find("no layout fits"), std::string::npos) << none.output;
  auto none_json = test::run_megatron({"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "1", "--gpu", "a100", "--json"});
  EXPECT_EQ(none_json.status, 1) << none_json.output;
  EXPECT_TRUE(nlohmann::json::parse(none_json.output).at("best").is_null()) << none_json.output;
  // Nothing train accepts: on 3 GPUs the global batch of 128 does not divide over DP 3, and TP 3 not the heads.
  auto refused = test::run_megatron({"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "3"});
  EXPECT_EQ(refused.status, 1) << refused.output;
  EXPECT_NE(refused.output.find("no layout passes train's checks on 3 GPUs"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("is not divisible by --tensor-model-parallel-size"), std::string::npos) << refused.output;

  // An HF model's architecture and vocabulary from its config.json alone, as the same flags give them.
  test::TempDir dir;
  {
    std::ofstream config(dir.path() + "/config.json");
    config << R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512,
                  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
                  "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": false,
                  "attention_bias": false, "hidden_act": "silu"})";
  }
  auto hf = test::run_megatron({"plan", "--load-hf", dir.path(), "--seq-length", "1024", "--global-batch-size", "8", "--bf16",
                                "--num-gpus", "8"});
  auto flags = test::run_megatron({"plan", "--model-family", "qwen3", "--num-layers", "4", "--hidden-size", "256",
                                   "--ffn-hidden-size", "512", "--num-attention-heads", "8", "--num-query-groups", "2",
                                   "--kv-channels", "64", "--vocab-size", "1000", "--seq-length", "1024", "--global-batch-size", "8",
                                   "--bf16", "--num-gpus", "8"});
  EXPECT_EQ(hf.status, 0) << hf.output;
  EXPECT_EQ(hf.output.substr(0, hf.output.find('\n')), flags.output.substr(0, flags.output.find('\n'))) << hf.output << flags.output;

  const struct {
    Flags args;
    const char* message;
  } bad[] = {
      {{"plan", "--config", recipe, "--vocab-size", "128256"}, "plan needs --num-gpus"},
      {{"plan", "--config", recipe, "--num-gpus", "8"}, "plan needs the vocabulary's size"},
      {{"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "8", "--gpu", "v100"}, "--gpu v100 is not one"},
      {{"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "12"}, "--num-gpus 12 is not a whole number of nodes"},
      {{"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "8.5"}, "--num-gpus takes a whole number"},
      {{"plan", "--config", recipe, "--vocab-size", "128256", "--num-gpus", "8", "--assumed-mfu", "45"}, "--assumed-mfu is a fraction"},
      {{"plan", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--vocab-size", "100", "--seq-length", "16",
        "--num-gpus", "1"},
       "plan needs --global-batch-size"},
  };
  for (const auto& b : bad) {
    auto r = test::run_megatron(b.args);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(b.message), std::string::npos) << b.message << " not in\n" << r.output;
  }
}

}  // namespace
}  // namespace megatron
