// Megatron's FP8 recipes as the linear layers apply them (tensor_parallel/fp8_linear.h):
//   tensorwise  each GEMM input cast with a scale from its own amax, computed just before the
//               cast (Transformer Engine's Float8CurrentScaling)
//   delayed     each input cast with a scale from the amaxes its tensor had in earlier steps: a
//               history of --fp8-amax-history-len amaxes per tensor, reduced with --fp8-amax-compute-algo
//               (max or most_recent), scale = fp8_max / amax / 2^--fp8-margin (DelayedScaling)
//   blockwise   1 x 128 tiles of activations and gradients, 128 x 128 tiles of weights, each with
//               a power-of-two scale of its own (Float8BlockScaling; DeepSeek-V3's recipe)
// --fp8-format e4m3 casts every tensor to e4m3; hybrid casts the output gradients to e5m2 (more
// range, less precision) and the rest to e4m3.
//
// One Fp8Context serves the FP8 layers of a model chunk: the options, the step count that keys
// each layer's cast weights (cast once per step, reused by every micro-batch), and the delayed
// recipe's amax histories and scales, one column per tensor, kept as one tensor so that the step's
// update is one all-reduce and a few kernels. Deviation from Transformer Engine: the delayed
// scales move once per optimizer step (after the step's last backward), not after every
// micro-batch's forward and backward; within a step the amaxes of all micro-batches are pooled.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <utility>
#include <vector>

#include "core/config.h"

namespace megatron::fp8 {

enum class Recipe { Tensorwise, Delayed, Blockwise };

struct Options {
  Recipe recipe = Recipe::Delayed;
  at::ScalarType forward_type = at::kFloat8_e4m3fn;   // activations and weights
  at::ScalarType backward_type = at::kFloat8_e4m3fn;  // output gradients (e5m2 under hybrid)
  int margin = 0;
  int64_t history_len = 1;
  bool history_max = false;  // --fp8-amax-compute-algo max (else most_recent)
  bool wgrad = true;         // false: the weight gradient from the high-precision inputs
};
// The options --fp8-format and friends give (config.fp8 not empty; finalize_config checked them).
Options options_for(const ModelConfig& config);

// The delayed recipe's state: amax_history [L, n] (row 0 collects this step's amaxes) and
// scale [n] for n tensors, as Transformer Engine's fp8_meta holds them.
class DelayedScaling {
 public:
  DelayedScaling(int64_t history_len, bool history_max, int margin);
  // A new tensor cast to a format whose largest value is fp8_max; returns its column.
  int add(double fp8_max);
  // Column i's scale ([] fp32 view) on `device`, where the state moves at its first use.
  at::Tensor scale(int i, const at::Device& device);
  // Column i's slot of the current history row ([] fp32 view): the step's casts pool their
  // amaxes into it (max). Valid after scale(i, device).
  at::Tensor current_amax(int i) {
    TORCH_CHECK(history_.defined(), "DelayedScaling::current_amax before the first scale()");
    return history_.select(0, 0).select(0, i);
  }
  // The step's update: `reduce_max` all-reduces the current row (max over the ranks sharing the
  // tensors), then each scale is recomputed from the history (kept where the amax is 0 or not
  // finite) and the history rolls one row, the current row cleared. Device work only.
  void update(const std::function<void(at::Tensor&)>& reduce_max);
  // For checkpoints: column i's history [L] and scale [] (undefined before the first use), and
  // back (a history of another length is dropped: it starts empty, the scale carries over).
  std::pair<at::Tensor, at::Tensor> column(int i) const;
  void set_column(int i, const at::Tensor& history, const at::Tensor& scale, const at::Device& device);

 private:
  void ensure(const at::Device& device);
  int64_t history_len_;
  bool history_max_;
  int margin_;
  std::vector<double> fp8_max_;
  at::Tensor history_;  // [L, n] fp32
  at::Tensor scale_;    // [n] fp32
  at::Tensor limits_;   // [n] fp32: each column's fp8_max
};

class Fp8Context {
 public:
  explicit Fp8Context(const Options& options);
  const Options& options() const { return options_; }
  // Bumped after each step's last backward: the layers cast their weights again at the next use.
  int64_t step() const { return step_; }
  void next_step() { ++step_; }
  DelayedScaling& delayed() { return delayed_; }

 private:
  Options options_;
  int64_t step_ = 0;
  DelayedScaling delayed_;
};

}  // namespace megatron::fp8
