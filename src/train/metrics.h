// What training reports: Megatron's iteration log line and validation block (from the last
// rank, which holds the last stage's loss), TensorBoard scalars with Megatron's tags (every
// iteration, and each against consumed samples: "lm loss vs samples"), and one --metrics-jsonl
// line per iteration with the exact loss. A step's loss, norm and skip flag stay on the device
// (StepStatistics) until a log interval, a checkpoint or the exit reads them.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "distributed/parallel_state.h"
#include "train/step_statistics.h"
#include "train/tensorboard_writer.h"

namespace megatron {

// What one training step leaves on the device, none of it read back yet.
struct StepOutcome {
  at::Tensor loss;         // [] fp64: the global batch's loss
  at::Tensor terms;        // [loss terms] fp64: the family's named loss terms, averaged as the loss
  at::Tensor grad_norm;    // [] fp32
  at::Tensor applied;      // [] bool: false when the update was skipped (loss or norm not finite)
  at::Tensor params_norm;  // [] fp32 after the update, with --log-params-norm (else undefined)
  at::Tensor grad_zeros;   // [] fp32, with --log-num-zeros-in-grad (else undefined)
  at::Tensor loss_scale;   // [] fp32: --fp16's loss scale after the step's update (else undefined: 1)
};

class TrainingMetrics {
 public:
  // `loss_terms`: the names of the family's loss terms, reported after "lm loss".
  TrainingMetrics(const Config& config, const dist::ParallelState& ps, const at::Device& device, double flops_per_token,
                  std::vector<std::string> loss_terms);
  ~TrainingMetrics();
  TrainingMetrics(const TrainingMetrics&) = delete;
  TrainingMetrics& operator=(const TrainingMetrics&) = delete;

  // After iteration `iteration` of `global_batch` samples, run at learning rate `lr` (the next
  // one runs at `next_lr`), with `consumed_samples` consumed by its end. Nothing is read back but
  // for --metrics-jsonl; TensorBoard gets the iteration's scalars at the next log interval (or
  // the end).
  void add_step(int64_t iteration, double lr, double next_lr, int64_t consumed_samples, int64_t global_batch, const StepOutcome& step);
  // The statistics since the last call (one host synchronisation) into the interval's totals and
  // `progress`'s skipped and nan counts.
  void settle(TrainingProgress& progress);
  // Megatron's line for the interval ending now (`next_lr`: the rate the next step will use),
  // and its TensorBoard scalars; a new interval starts. `first_iteration`: the run's first
  // iteration, which Megatron logs whatever the interval, without starting a new one (unless
  // the interval ends there anyway) and without timer scalars.
  void log_iteration(TrainingProgress& progress, double next_lr, bool first_iteration = false);
  // Megatron's validation block; `split` names the data in `megatron eval` ("val", "test"), empty
  // during training.
  // `consumed_samples`: the training samples consumed by then (the "vs samples" tag's step).
  void log_validation(int64_t iteration, int64_t consumed_samples, double loss, const std::string& split = "");
  void start_interval() { interval_start_ = std::chrono::steady_clock::now(); }
  // Time the interval spent outside training steps (saving a checkpoint), left out of its figures.
  void exclude(std::chrono::steady_clock::duration d) { interval_start_ += d; }

 private:
  bool prints() const { return ps_.is_last_rank(); }
  // The scalars Megatron's training_log writes each iteration, for the iterations added since
  // the last call (their values read back in one copy).
  void write_tensorboard_steps();
  const Config& c_;
  const dist::ParallelState& ps_;
  at::Device device_;
  double flops_per_token_;
  double peak_tflops_;
  std::vector<std::string> loss_terms_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // last rank, with --tensorboard-dir
  std::FILE* jsonl_ = nullptr;                      // last rank, with --metrics-jsonl

  StepStatistics statistics_;   // on the device, not read yet
  at::Tensor interval_terms_;   // [loss terms] fp64 on the device: the applied iterations' sums
  double interval_loss_ = 0;      // the applied iterations' losses, summed
  double interval_all_loss_ = 0;  // every iteration's
  int64_t interval_samples_ = 0;  // the interval's global batches together
  int64_t last_global_batch_ = 0;
  int64_t interval_iterations_ = 0;
  // Megatron's per-interval "number of skipped iterations"; the others are its "advanced
  // iterations", which the loss averages over.
  int64_t interval_skipped_ = 0;
  int64_t interval_nan_ = 0;      // ... and "number of nan iterations"
  double last_grad_norm_ = 0;
  bool last_applied_ = true;      // the latest iteration's update was applied (else no grad norm shown)
  StepOutcome last_step_;       // the latest step's values (params norm, zeros: read at the log line)
  std::chrono::steady_clock::time_point interval_start_;
  struct TensorBoardStep {
    int64_t iteration, consumed_samples, global_batch;
    double next_lr;
    StepOutcome values;  // on the device until written
    // --log-memory-to-tensorboard on an accelerator: reserved, allocated, peak allocated bytes
    // and live allocations after the step (host counters, no device wait).
    std::vector<double> memory;
  };
  std::vector<TensorBoardStep> tensorboard_steps_;
};

}  // namespace megatron
