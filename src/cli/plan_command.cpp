// `megatron plan`: the parallel layouts of a model on a cluster, best first, with what each costs
// in memory and time (plan/layout_search.h). Takes train's model flags (or --config, or --load-hf
// for an HF model's architecture) plus the cluster's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/inference_flags.h"
#include "core/errors.h"
#include "plan/layout_search.h"
#include "plan/model_for_plan.h"

namespace megatron::cli {
namespace {

const char* kPlanHelp =
    "usage: megatron plan --num-gpus N [--gpus-per-node 8] [--gpu h100|h200|a100|b200] [cluster flags]\n"
    "                     [--config recipe.yaml | --load-hf DIR] [train's model and batch flags]\n\n"
    "Lists the parallel layouts (TP with SP, PP with interleaving, CP, EP, DP with the distributed\n"
    "optimizer) that `megatron train` accepts for the model on N GPUs, each with its memory per GPU\n"
    "and an estimated step time, best first, and prints the flags of the best. Layout flags given\n"
    "(--tensor-model-parallel-size, ...) are kept; the others are searched. Layouts that do not fit\n"
    "are tried again with full recomputation unless a recomputation is chosen.\n\n"
    "cluster:\n"
    "  --num-gpus N             GPUs in all (required)\n"
    "  --gpus-per-node N        GPUs a node (NVLink inside, the network between; default 8)\n"
    "  --gpu NAME               h100 (default), h200, a100, b200: memory, bf16 peak, NVLink\n"
    "  --gpu-memory-gib X       the card's memory (overrides --gpu's)\n"
    "  --gpu-peak-tflops X      its dense bf16 peak\n"
    "  --nvlink-gb-per-s X      NVLink bandwidth a GPU, one direction\n"
    "  --network-gb-per-s X     bandwidth a GPU between nodes (default 50: 400 Gb/s)\n"
    "  --assumed-mfu X          model FLOPs utilisation of the compute (default 0.45)\n"
    "  --top N                  layouts listed (default 10)\n"
    "  --json                   one JSON document on stdout instead of the table (same exit status)\n\n"
    "model: train's flags (--config, --model-family, --num-layers, ..., --seq-length,\n"
    "--micro-batch-size, --global-batch-size (required), --bf16, --use-precision-aware-optimizer,\n"
    "--recompute-*); the vocabulary from --vocab-size or the tokenizer's files. Estimates, not\n"
    "measurements: docs/plan.md says what each term counts and how it compares with measured runs.\n";

double number(const std::string& flag, const std::string& text) {
  const double v = number_flag(flag, text);  // finite, or a UserError naming the flag
  if (!(v > 0)) throw UserError(flag + " takes a positive number (got '" + text + "')");
  return v;
}

int whole_number(const std::string& flag, const std::string& text) {
  const double v = number(flag, text);
  if (v > 1e7 || v != std::floor(v)) throw UserError(flag + " takes a whole number up to 10 million (got '" + text + "')");
  return int(v);
}

std::string gib(double bytes) {
  char out[32];
  std::snprintf(out, sizeof out, "%.1f", bytes / plan::kGiB);
  return out;
}

std::string billions(int64_t n) {
  char out[32];
  std::snprintf(out, sizeof out, "%.2fB", double(n) / 1e9);
  return out;
}

// The cluster the plan is for, from its flags (each given, or its default).
plan::Cluster cluster_from_flags(std::map<std::string, std::string>& own) {
  plan::Cluster cluster;
  // A card of its own: named anything, given by its three figures.
  const bool own_card = !own["--gpu-memory-gib"].empty() && !own["--gpu-peak-tflops"].empty() && !own["--nvlink-gb-per-s"].empty();
  cluster.gpu = own_card ? plan::Gpu{own["--gpu"]} : plan::gpu_named(own["--gpu"]);
  cluster.num_gpus = whole_number("--num-gpus", own["--num-gpus"]);
  cluster.gpus_per_node = whole_number("--gpus-per-node", own["--gpus-per-node"]);
  if (!own["--gpu-memory-gib"].empty()) cluster.gpu.memory_gib = number("--gpu-memory-gib", own["--gpu-memory-gib"]);
  if (!own["--gpu-peak-tflops"].empty()) cluster.gpu.peak_tflops = number("--gpu-peak-tflops", own["--gpu-peak-tflops"]);
  if (!own["--nvlink-gb-per-s"].empty()) cluster.gpu.nvlink_gb_per_s = number("--nvlink-gb-per-s", own["--nvlink-gb-per-s"]);
  cluster.network_gb_per_s = number("--network-gb-per-s", own["--network-gb-per-s"]);
  cluster.mfu = number("--assumed-mfu", own["--assumed-mfu"]);
  if (cluster.mfu > 1) throw UserError("--assumed-mfu is a fraction of the peak (got " + own["--assumed-mfu"] + ")");
  if (cluster.num_gpus > cluster.gpus_per_node && cluster.num_gpus % cluster.gpus_per_node != 0) {
    throw UserError("--num-gpus " + own["--num-gpus"] + " is not a whole number of nodes of --gpus-per-node " + own["--gpus-per-node"]);
  }
  return cluster;
}

// The plan as one JSON document: what the table and the lines around it say, memory in GiB,
// times in seconds, the top `top` layouts best first.
nlohmann::json plan_json(const plan::Plan& plan, const Config& config, const plan::Cluster& cluster, int top) {
  using nlohmann::json;
  const ModelConfig& m = config.model;
  json out;
  out["model"] = {{"parameters", plan.parameters},
                  {"active_parameters", plan.active_parameters},
                  {"training_flops_per_token", plan.flops_per_token},
                  {"seq_length", m.seq_length},
                  {"global_batch_size", config.train.global_batch_size},
                  {"micro_batch_size", config.train.micro_batch_size}};
  out["cluster"] = {{"num_gpus", cluster.num_gpus},           {"gpu", cluster.gpu.name},
                    {"gpu_memory_gib", cluster.gpu.memory_gib}, {"gpu_peak_tflops", cluster.gpu.peak_tflops},
                    {"gpus_per_node", cluster.gpus_per_node}, {"nvlink_gb_per_s", cluster.gpu.nvlink_gb_per_s},
                    {"network_gb_per_s", cluster.network_gb_per_s}, {"assumed_mfu", cluster.mfu}};
  out["kept_flags"] = plan.kept_flags;
  const double GiB = 1024.0 * 1024.0 * 1024.0;
  json layouts = json::array();
  int64_t fitting = 0;
  for (const auto& c : plan.candidates) fitting += c.fits;
  for (size_t i = 0; i < plan.candidates.size() && int(i) < top; ++i) {
    const plan::Candidate& c = plan.candidates[i];
    const ParallelConfig& p = c.config.parallel;
    const plan::MemoryEstimate& e = c.memory;
    const plan::StepEstimate& t = c.step;
    layouts.push_back({{"tensor_model_parallel_size", p.tensor_model_parallel_size},
                       {"pipeline_model_parallel_size", p.pipeline_model_parallel_size},
                       {"virtual_stages_per_pipeline_rank", p.num_virtual_stages_per_pipeline_rank},
                       {"context_parallel_size", p.context_parallel_size},
                       {"expert_model_parallel_size", p.expert_model_parallel_size},
                       {"expert_tensor_parallel_size", m.num_experts > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size},
                       {"data_parallel_size", p.data_parallel_size},
                       {"recompute_granularity", c.config.model.recompute_granularity},
                       {"memory_gib",
                        {{"weights", e.weights / GiB}, {"gradients", e.gradients / GiB}, {"optimizer", e.optimizer / GiB},
                         {"activations", e.activations / GiB}, {"logits", e.logits / GiB}, {"other", e.overhead / GiB},
                         {"total", e.total() / GiB}}},
                       {"fits", c.fits},
                       {"step_seconds",
                        {{"compute", t.compute}, {"bubble", t.bubble}, {"tensor_parallel", t.tensor_parallel},
                         {"context_parallel", t.context_parallel}, {"expert_parallel", t.expert_parallel}, {"pipeline", t.pipeline},
                         {"data_parallel", t.data_parallel}, {"total", t.total()}}},
                       {"tokens_per_second_per_gpu", t.tokens_per_second_per_gpu},
                       {"mfu", t.mfu},
                       {"flags", c.flags()}});
  }
  out["layouts"] = layouts;
  out["layouts_judged"] = plan.candidates.size();
  out["layouts_fitting"] = fitting;
  out["refused_by_train"] = plan.rejections;
  out["best"] = fitting > 0 ? json{{"nproc_per_node", std::min(cluster.num_gpus, cluster.gpus_per_node)},
                                   {"flags", plan.candidates.front().flags()}}
                            : json(nullptr);
  return out;
}

}  // namespace

int plan_layouts(const Args& args) {
  if (std::find(args.begin(), args.end(), "--help") != args.end() || std::find(args.begin(), args.end(), "-h") != args.end()) {
    std::fputs(kPlanHelp, stdout);
    return 0;
  }
  // The cluster's flags, taken out; the rest are train's.
  std::map<std::string, std::string> own = {{"--num-gpus", ""}, {"--gpus-per-node", "8"}, {"--gpu", "h100"},
                                            {"--gpu-memory-gib", ""}, {"--gpu-peak-tflops", ""}, {"--nvlink-gb-per-s", ""},
                                            {"--network-gb-per-s", "50"}, {"--assumed-mfu", "0.45"}, {"--top", "10"}};
  Args train_args;
  bool as_json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--json") {
      as_json = true;
      continue;
    }
    auto it = own.find(args[i]);
    if (it == own.end()) {
      train_args.push_back(args[i]);
      continue;
    }
    if (i + 1 >= args.size()) throw UserError(args[i] + " needs a value");
    it->second = args[++i];
  }
  if (own["--num-gpus"].empty()) throw UserError("plan needs --num-gpus N: the GPUs of the cluster (megatron plan --help)");
  const plan::Cluster cluster = cluster_from_flags(own);
  const int top = whole_number("--top", own["--top"]);

  const Config config = plan::model_for_plan(train_args);
  const plan::Plan plan = plan::search_layouts(config, cluster);
  if (as_json) {
    const nlohmann::json out = plan_json(plan, config, cluster, top);
    std::printf("%s\n", out.dump(1).c_str());
    return out["best"].is_null() ? 1 : 0;
  }
  const ModelConfig& m = config.model;
  std::printf("model: %s parameters", billions(plan.parameters).c_str());
  if (plan.active_parameters != plan.parameters) std::printf(" (%s active a token)", billions(plan.active_parameters).c_str());
  std::printf(", %.3g training FLOPs a token; seq %d, global batch %d, micro-batch %d\n", plan.flops_per_token, m.seq_length,
              config.train.global_batch_size, config.train.micro_batch_size);
  std::printf("cluster: %d x %s (%.1f GiB, %.0f TFLOP/s bf16), %d a node, NVLink %.0f GB/s, network %.0f GB/s a GPU\n", cluster.num_gpus,
              cluster.gpu.name.c_str(), cluster.gpu.memory_gib, cluster.gpu.peak_tflops, cluster.gpus_per_node,
              cluster.gpu.nvlink_gb_per_s, cluster.network_gb_per_s);
  std::printf("estimates, not measurements: compute at %.0f%% MFU, communication at the link's bandwidth (docs/plan.md)\n",
              cluster.mfu * 100);
  if (!plan.kept_flags.empty()) {
    std::string kept;
    for (const auto& f : plan.kept_flags) kept += " --" + f;
    std::printf("kept as given:%s\n", kept.c_str());
  }
  std::printf("\n| # | TP | PP | VPP | CP | EP | ETP | DP | recompute | GiB a GPU: weights+grads / optimizer / activations+logits / other = total | fits | step (s) | tokens/s/GPU | MFU |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int64_t fitting = 0;
  for (const auto& c : plan.candidates) fitting += c.fits;
  const int shown = std::min<int>(top, int(plan.candidates.size()));
  for (int i = 0; i < shown; ++i) {
    const plan::Candidate& c = plan.candidates[size_t(i)];
    const ParallelConfig& p = c.config.parallel;
    const plan::MemoryEstimate& e = c.memory;
    std::printf("| %d | %d | %d | %d | %d | %d | %d | %d | %s | %s / %s / %s / %s = %s | %s | %.2f | %.0f | %.1f%% |\n", i + 1,
                p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.num_virtual_stages_per_pipeline_rank,
                p.context_parallel_size, p.expert_model_parallel_size,
                m.num_experts > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size, p.data_parallel_size,
                c.config.model.recompute_granularity.empty() ? "-" : c.config.model.recompute_granularity.c_str(),
                gib(e.weights + e.gradients).c_str(), gib(e.optimizer).c_str(), gib(e.activations + e.logits).c_str(),
                gib(e.overhead).c_str(), gib(e.total()).c_str(), c.fits ? "yes" : "no", c.step.total(),
                c.step.tokens_per_second_per_gpu, c.step.mfu * 100);
  }
  int64_t refused = 0;
  for (const auto& [reason, n] : plan.rejections) refused += n;
  std::printf("\n%zu layouts judged, %lld fit in %.1f GiB; %lld more refused by train's checks\n", plan.candidates.size(),
              static_cast<long long>(fitting), cluster.gpu.memory_gib, static_cast<long long>(refused));
  std::vector<std::pair<int64_t, std::string>> reasons;
  for (const auto& [reason, n] : plan.rejections) reasons.emplace_back(n, reason);
  std::sort(reasons.rbegin(), reasons.rend());
  for (size_t i = 0; i < reasons.size() && i < 5; ++i) {
    std::printf("  %lld: %s\n", static_cast<long long>(reasons[i].first), reasons[i].second.c_str());
  }
  if (plan.candidates.empty()) {
    std::printf("\nno layout passes train's checks on %d GPUs (the reasons above): change the GPU count or the flags they name\n",
                cluster.num_gpus);
    return 1;
  }
  if (fitting == 0) {
    std::printf("\nno layout fits: the smallest needs %s GiB a GPU. More GPUs, --use-precision-aware-optimizer --exp-avg-dtype bf16 "
                "--exp-avg-sq-dtype bf16, a smaller --micro-batch-size or --optimizer-cpu-offload bring it down.\n",
                gib(plan.candidates.front().memory.total()).c_str());
    return 1;
  }
  std::printf("\nbest: megatron launch --nproc-per-node %d ... megatron train [model flags] %s\n",
              std::min(cluster.num_gpus, cluster.gpus_per_node), plan.candidates.front().flags().c_str());
  return 0;
}

}  // namespace megatron::cli
