// One forward_backward() entry for every pipeline schedule (Megatron-Core's
// get_forward_backward_func): no pipelining (gradient accumulation over micro-batches), 1F1B
// (warm-up forwards, one-forward-one-backward steady state, cool-down backwards) and
// interleaved 1F1B over several model chunks per rank. The caller supplies the forward of one
// micro-batch through one chunk; the schedule moves activations and gradients between stages
// and runs the backwards.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "distributed/process_group.h"

namespace megatron::pipeline {

struct ScheduleOptions {
  int64_t micro_batches = 1;
  int chunks = 1;             // model chunks on this rank (virtual stages); > 1: interleaved
  bool forward_only = false;  // evaluation: no backward, nothing kept
  std::vector<int64_t> activation_shape;  // [s(/tp with SP), b, h], exchanged between stages
  at::TensorOptions activation_options;   // dtype and device of the activations
};

struct StageFunctions {
  // Micro-batch `micro_batch` through model chunk `chunk`. `input` is the previous stage's
  // output (undefined for the chunk that begins the model). Returns the output for the next
  // stage, or, from the chunk that ends the model, the micro-batch's loss as a scalar scaled
  // so that backward starts from it.
  std::function<at::Tensor(int chunk, int64_t micro_batch, const at::Tensor& input)> forward;
  // Before each backward: whether it is the chunk's last micro-batch of the step (gradient
  // reductions for that chunk may start as its gradients are produced). Optional.
  std::function<void(int chunk, bool last_micro_batch)> before_backward;
  // After each forward, e.g. to sample memory. Optional.
  std::function<void()> after_forward;
};

struct ScheduleStats {
  int max_in_flight = 0;  // the most micro-batches whose activations this rank held at once
};

// The forwards stage `stage` of `stages` runs before its first backward in a training step of
// `micro_batches` through `chunks` model chunks a stage (Megatron's warm-up): 1F1B (one chunk)
// stages - stage - 1; interleaved 2 (stages - stage - 1) + (chunks - 1) stages, or every forward
// when there are as many micro-batches as stages; never more than the step has. One forward more
// follows before the first backward, so min(warm-up + 1, forwards) are in flight at the peak.
int64_t warmup_forwards(int stages, int stage, int chunks, int64_t micro_batches);

// Collective over the pipeline group: every stage calls it with the same options.
ScheduleStats forward_backward(const StageFunctions& functions, const ScheduleOptions& options, const dist::Group& pp);

}  // namespace megatron::pipeline
