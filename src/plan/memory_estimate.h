// `megatron plan`'s memory side: what one GPU of a parallel layout holds while it trains.
//
// The parameters are counted, not modelled: the model is built once on the meta device (no
// weights allocated) and every parameter's own description (tensor_parallel/parameters.h) says
// how it splits over TP, whether it is an expert's, and which pipeline stage holds it, so a
// rank's count is what `megatron train` would build there. Weights, gradients and optimizer state
// follow from the precision flags and the distributed optimizer's sharding. Activations are a
// formula over the tensors the layers keep for their backward (shapes below), times the
// micro-batches a pipeline stage holds at once under 1F1B (interleaved too).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/config.h"

namespace megatron::plan {

// Every parameter of a model as built with TP = EP = 1 (full shapes), from which any layout's
// per-rank counts follow.
class ParameterCensus {
 public:
  explicit ParameterCensus(const ModelConfig& finalized);  // builds the model on the meta device

  // Parameters of the whole model (a tied output layer counted once).
  int64_t total() const { return total_; }
  // Of those, what one token passes through (MoE: top-k of the routed experts, the rest whole).
  int64_t active_per_token(const ModelConfig& m) const;

  // What pipeline rank `pp_rank` of `layout` (a finalized config) holds on one of its GPUs.
  struct RankCount {
    int64_t dense = 0;   // reduced and sharded over DP x CP
    int64_t expert = 0;  // reduced and sharded over the expert-data-parallel ranks
  };
  RankCount on_rank(const Config& layout, int pp_rank) const;

 private:
  // The parameters of one part a pipeline stage holds whole (pipeline::stage_holds says which):
  // a decoder layer, named as the layer ("decoder.layers.7"), or one parameter outside the layers.
  struct PartSums {
    int64_t replicated = 0, split = 0;                 // dense: on every TP rank, or split over TP
    int64_t vocab_split_columns = 0;                   // dense, rows = the padded vocabulary, split over TP
    int64_t expert_replicated = 0, expert_split = 0;   // all experts' (split over expert TP)
  };
  std::map<std::string, PartSums> parts_;
  int64_t total_ = 0, experts_ = 0;
  int num_experts_ = 0;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// What a GPU spends outside PyTorch's caching allocator (the CUDA context, NCCL's buffers): an
// allowance, not a measurement of each machine.
constexpr double kOutsideAllocator = 1.5 * kGiB;

// One GPU's memory, bytes. Every term is for the most loaded pipeline stage (`stage`).
struct MemoryEstimate {
  int stage = 0;
  ParameterCensus::RankCount parameters;
  double weights = 0;      // the model's parameters in their training dtype
  double gradients = 0;    // main_grad buffers (fp32, or bf16 with --grad-reduce-in-bf16)
  double optimizer = 0;    // fp32 masters and Adam moments, sharded by the distributed optimizer
  double activations = 0;  // what the layers of the micro-batches in flight keep for their backward
  double logits = 0;       // the last stage's logits and their gradient
  double overhead = 0;     // kOutsideAllocator, and the caching allocator's slack
  // The peak of what is live: what the allocator's max_allocated (Megatron's memory report) says.
  double allocated() const { return weights + gradients + optimizer + activations + logits; }
  double total() const { return allocated() + overhead; }  // what the GPU must have
};

// The estimate for `layout` (a config finalize_config accepted for its world size).
MemoryEstimate estimate_memory(const ParameterCensus& census, const Config& layout);

// Bytes of one element of each kind of state, by the precision flags.
struct StateBytes {
  double activation, weight, grad, master, moments;
};
StateBytes state_bytes(const Config& config);

// The model chunks' forwards whose activations pipeline stage `stage` holds at once, at most:
// the schedule's warm-up (pipeline::warmup_forwards) and one more, never more than the step has.
int64_t chunks_in_flight(int pp, int stage, int chunks, int64_t micro_batches);

// Bytes one decoder layer keeps for its backward for one micro-batch on one GPU of `layout`
// (`layer` picks dense or MoE, and whether --recompute-granularity full covers it).
double layer_activation_bytes(const Config& layout, int layer);

}  // namespace megatron::plan
