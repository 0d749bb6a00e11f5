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

// Megatron's OptimizerParamScheduler state, its state_dict's fields but the position (steps
// count samples): what a checkpoint records and a resume checks the flags against. Where the
// schedule stands (state_dict's num_steps) is TrainingProgress's to say.
struct OptParamSchedulerState {
  double max_lr = 0, min_lr = 0;
  double lr_warmup_steps = 0, lr_decay_steps = 0;
  std::string lr_decay_style;
  double start_wd = 0, end_wd = 0, wd_incr_steps = 0;
  std::string wd_incr_style;
};

// The schedule the flags give.
OptParamSchedulerState opt_param_scheduler_state(const TrainConfig& config);

// The schedule a resume with the optimizer's state goes on with, as Megatron's
// OptimizerParamScheduler.load_state_dict decides it: under --override-opt-param-scheduler the
// flags' (`from_flags`), under --use-checkpoint-opt-param-scheduler the checkpoint's (`saved`),
// else the two must agree: UserError naming `checkpoint_dir`, each differing field with its flags
// and both values, and the two ways out. Fields that cannot change the schedule (the decay length
// of a constant learning rate, the increment length of a constant weight decay) are not compared;
// Megatron compares them too, and so refuses any longer --train-iters under the default constant
// weight decay.
OptParamSchedulerState resume_opt_param_scheduler(const OptParamSchedulerState& from_flags, const OptParamSchedulerState& saved,
                                                  const TrainConfig& config, const std::string& checkpoint_dir);

class LearningRateSchedule {
 public:
  explicit LearningRateSchedule(const TrainConfig& config);
  // The schedule `state` describes (peak, floor, warm-up, decay and style); the WSD decay and the
  // warm-up's initial value, which Megatron does not save, from `config`.
  LearningRateSchedule(const TrainConfig& config, const OptParamSchedulerState& state);

  // The learning rate after `iterations` completed optimizer steps of --global-batch-size.
  double at(int64_t iterations) const { return at_samples(iterations * int64_t(c_.global_batch_size)); }
  // The learning rate once `samples` are consumed (Megatron's scheduler steps by each
  // iteration's global batch, which --step-batch-size-schedule varies).
  double at_samples(int64_t samples) const;
  double warmup_samples() const { return warmup_; }
  double decay_samples() const { return decay_; }

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
  explicit WeightDecaySchedule(const OptParamSchedulerState& state);
  double at_samples(int64_t samples) const;
  double start() const { return start_; }
  double end() const { return end_; }
  double increment_samples() const { return samples_; }

 private:
  std::string style_;
  double start_ = 0, end_ = 0, samples_ = 0;
};

// --decoupled-lr: the embedding's and output layer's schedule, the same shape from that peak down
// to --decoupled-min-lr (or --min-lr, as Megatron when it is not given); nullopt without it.
// With `state`, the shape (warm-up, decay, style) is the state's.
std::optional<LearningRateSchedule> decoupled_lr_schedule(const TrainConfig& config,
                                                          const std::optional<OptParamSchedulerState>& state = std::nullopt);

}  // namespace megatron
