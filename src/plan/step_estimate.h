// `megatron plan`'s time side: a training step of a layout on a cluster, from the model's FLOPs,
// the GPU's peak, an assumed model FLOPs utilisation, and the bytes each kind of parallelism moves
// over the link its group spans. An estimate for ranking layouts against each other, not a
// measurement: the terms (and the constants they use) are printed with the plan.
#pragma once

#include <string>

#include "core/config.h"
#include "plan/memory_estimate.h"

namespace megatron::plan {

struct Gpu {
  std::string name;
  double memory_gib = 0;       // what the card has
  double peak_tflops = 0;      // dense bf16
  double nvlink_gb_per_s = 0;  // per GPU, one direction (what a collective inside a node moves at)
};

// h100, h200, a100 (80 GB), b200; UserError listing them otherwise.
Gpu gpu_named(const std::string& name);

struct Cluster {
  Gpu gpu;
  int num_gpus = 0;
  int gpus_per_node = 8;
  double network_gb_per_s = 50;  // per GPU between nodes (400 Gb/s InfiniBand or RoCE a GPU)
  double mfu = 0.45;             // the model FLOPs utilisation the GEMMs and attention reach
};

// Seconds of one training step (one global batch) on every GPU of `layout`, by term.
struct StepEstimate {
  double compute = 0;  // the micro-batches' forward and backward at the assumed MFU (recompute included)
  double bubble = 0;   // the pipeline's warm-up and cool-down: (PP - 1) / chunks micro-batches
  double tensor_parallel = 0;   // TP's all-gathers / reduce-scatters (all-reduces without SP), not overlapped
  double context_parallel = 0;  // CP's key/value exchange beyond what the attention hides (p2p)
  double expert_parallel = 0;   // the MoE dispatch and combine all-to-alls
  double pipeline = 0;          // activations between stages
  double data_parallel = 0;     // gradient reduce-scatter + parameter all-gather beyond the step's compute
  double total() const { return compute + bubble + tensor_parallel + context_parallel + expert_parallel + pipeline + data_parallel; }
  double tokens_per_second_per_gpu = 0;
  double mfu = 0;  // the model FLOPs over the step's time, as the log line reports it
};

// `flops_per_token`: the family's training FLOPs (forward and backward) per token;
// `parameters`: the most loaded rank's (the data-parallel reduction's size).
StepEstimate estimate_step(const Config& layout, const Cluster& cluster, double flops_per_token,
                           const ParameterCensus::RankCount& parameters);

}  // namespace megatron::plan
