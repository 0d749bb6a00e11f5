// Learning-rate schedules, as Megatron's OptimizerParamScheduler computes them: linear warm-up
// from --lr-warmup-init, then constant, linear, cosine, inverse-square-root or WSD decay to
// --min-lr over --lr-decay-iters. Like Megatron it counts samples (each iteration steps by the
// global batch), so iteration- and sample-based flags and --lr-warmup-fraction share one formula.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/config.h"

namespace megatron {

class LearningRateSchedule {
 public:
  explicit LearningRateSchedule(const TrainConfig& config);

  // The learning rate after `iterations` completed optimizer steps of --global-batch-size.
  double at(int64_t iterations) const { return at_samples(iterations * int64_t(c_.global_batch_size)); }
  // The learning rate once `samples` are consumed (Megatron's scheduler steps by each
  // iteration's global batch, which --step-batch-size-schedule varies).
  double at_samples(int64_t samples) const;

 private:
  TrainConfig c_;
  double warmup_ = 0, decay_ = 0, wsd_decay_ = 0;  // in samples
};

// Megatron's weight-decay schedule (OptimizerParamScheduler.get_wd): --weight-decay throughout
// with --weight-decay-incr-style constant; else from --start-weight-decay to --end-weight-decay
// over the run's samples (--train-iters x --global-batch-size, or --train-samples), linearly or
// along a half cosine, then --end-weight-decay.
class WeightDecaySchedule {
 public:
  explicit WeightDecaySchedule(const TrainConfig& config);
  double at_samples(int64_t samples) const;

 private:
  std::string style_;
  double start_ = 0, end_ = 0, samples_ = 0;
};

// --decoupled-lr: the embedding's and output layer's schedule, the same shape from that peak down
// to --decoupled-min-lr (or --min-lr, as Megatron when it is not given); nullopt without it.
std::optional<LearningRateSchedule> decoupled_lr_schedule(const TrainConfig& config);

}  // namespace megatron
