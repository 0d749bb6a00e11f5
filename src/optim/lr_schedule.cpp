#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/errors.h"

namespace megatron {

LearningRateSchedule::LearningRateSchedule(const TrainConfig& config) : c_(config) {
  const double batch = c_.global_batch_size;
  if (c_.train_samples > 0) {
    decay_ = double(c_.lr_decay_samples);
    warmup_ = double(c_.lr_warmup_samples);
    wsd_decay_ = double(c_.lr_wsd_decay_samples);
  } else {
    decay_ = double(c_.lr_decay_iters) * batch;
    warmup_ = double(c_.lr_warmup_iters) * batch;
    wsd_decay_ = double(c_.lr_wsd_decay_iters) * batch;
  }
  if (c_.lr_warmup_fraction >= 0) warmup_ = c_.lr_warmup_fraction * decay_;
}

LearningRateSchedule::LearningRateSchedule(const TrainConfig& config, const OptParamSchedulerState& state)
    : LearningRateSchedule(config) {
  c_.lr = state.max_lr;
  c_.min_lr = state.min_lr;
  c_.lr_decay_style = state.lr_decay_style;
  warmup_ = state.lr_warmup_steps;
  decay_ = state.lr_decay_steps;
}

double LearningRateSchedule::at_samples(int64_t samples) const {
  const double max_lr = c_.lr, min_lr = c_.min_lr;
  const double step = double(samples);  // as Megatron's scheduler steps
  const double warmup = warmup_, decay = decay_;
  if (warmup > 0 && step <= warmup) return c_.lr_warmup_init + (max_lr - c_.lr_warmup_init) * step / warmup;
  if (c_.lr_decay_style == "constant") return max_lr;
  if (step > decay) return min_lr;
  if (c_.lr_decay_style == "inverse-square-root") {
    const double w = std::max(warmup, 1.0), n = std::max(step, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(n));
  }
  const double ratio = (step - warmup) / (decay - warmup);
  double coeff = 1.0;
  if (c_.lr_decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (c_.lr_decay_style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else {  // WSD: stable at max_lr, then the final decay over lr_wsd_decay_iters
    const double anneal_start = decay - wsd_decay_;
    if (step > anneal_start) {
      const double r = (step - anneal_start) / wsd_decay_;
      const std::string& s = c_.lr_wsd_decay_style;
      if (s == "linear") coeff = 1.0 - r;
      else if (s == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (s == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      else coeff = 1.0 - std::sqrt(r);  // minus_sqrt
    }
  }
  return min_lr + coeff * (max_lr - min_lr);
}

WeightDecaySchedule::WeightDecaySchedule(const TrainConfig& config) : style_(config.weight_decay_incr_style) {
  const bool constant = style_ == "constant";
  start_ = constant ? config.weight_decay : config.start_weight_decay;
  end_ = constant ? config.weight_decay : config.end_weight_decay;
  samples_ = config.train_samples > 0 ? double(config.train_samples) : double(config.train_iters) * double(config.global_batch_size);
}

WeightDecaySchedule::WeightDecaySchedule(const OptParamSchedulerState& state)
    : style_(state.wd_incr_style), start_(state.start_wd), end_(state.end_wd), samples_(state.wd_incr_steps) {}

double WeightDecaySchedule::at_samples(int64_t samples) const {
  if (style_ == "constant" || double(samples) > samples_) return end_;
  const double ratio = double(samples) / samples_;
  const double coeff = style_ == "linear" ? ratio : 0.5 * (std::cos(M_PI * (1.0 - ratio)) + 1.0);
  return start_ + coeff * (end_ - start_);
}

std::optional<LearningRateSchedule> decoupled_lr_schedule(const TrainConfig& config,
                                                          const std::optional<OptParamSchedulerState>& state) {
  if (config.decoupled_lr < 0.0) return std::nullopt;
  TrainConfig decoupled = config;
  decoupled.lr = config.decoupled_lr;
  if (config.decoupled_min_lr >= 0.0) decoupled.min_lr = config.decoupled_min_lr;
  if (!state) return LearningRateSchedule(decoupled);
  OptParamSchedulerState shape = *state;  // the checkpoint's shape, this group's own peak and floor
  shape.max_lr = decoupled.lr;
  shape.min_lr = decoupled.min_lr;
  return LearningRateSchedule(decoupled, shape);
}

OptParamSchedulerState opt_param_scheduler_state(const TrainConfig& config) {
  const LearningRateSchedule lr(config);
  const WeightDecaySchedule wd(config);
  OptParamSchedulerState s;
  s.max_lr = config.lr;
  s.min_lr = config.min_lr;
  s.lr_warmup_steps = lr.warmup_samples();
  s.lr_decay_steps = lr.decay_samples();
  s.lr_decay_style = config.lr_decay_style;
  s.start_wd = wd.start();
  s.end_wd = wd.end();
  s.wd_incr_steps = wd.increment_samples();
  s.wd_incr_style = config.weight_decay_incr_style;
  return s;
}

namespace {

// The shortest form that reads back exactly (3e-4, not 0.00029999999999999997).
std::string number(double x) {
  char buf[32];
  double back = 0;
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
    if (std::sscanf(buf, "%lf", &back) == 1 && back == x) break;
  }
  return buf;
}

}  // namespace

OptParamSchedulerState resume_opt_param_scheduler(const OptParamSchedulerState& flags, const OptParamSchedulerState& saved,
                                                  const TrainConfig& config, const std::string& checkpoint_dir) {
  const OptParamSchedulerState out = config.use_checkpoint_opt_param_scheduler ? saved : flags;
  if (config.override_opt_param_scheduler || config.use_checkpoint_opt_param_scheduler) return out;
  const bool constant_lr = flags.lr_decay_style == "constant" && saved.lr_decay_style == "constant";
  const bool constant_wd = flags.wd_incr_style == "constant" && saved.wd_incr_style == "constant";
  std::vector<std::string> differ;
  auto compare = [&](const char* what, const char* from, double here, double there) {
    if (here != there) differ.push_back(std::string(what) + " (" + from + ") is " + number(here) + " here, " + number(there) + " in the checkpoint");
  };
  auto compare_text = [&](const char* what, const char* from, const std::string& here, const std::string& there) {
    if (here != there) differ.push_back(std::string(what) + " (" + from + ") is " + here + " here, " + there + " in the checkpoint");
  };
  compare("the learning rate", "--lr", flags.max_lr, saved.max_lr);
  compare("the minimum learning rate", "--min-lr", flags.min_lr, saved.min_lr);
  compare("the warm-up in samples", "--lr-warmup-iters/-samples/-fraction x --global-batch-size", flags.lr_warmup_steps,
          saved.lr_warmup_steps);
  if (!constant_lr) {
    compare("the decay in samples", "--lr-decay-iters (default --train-iters) or --lr-decay-samples, x --global-batch-size",
            flags.lr_decay_steps, saved.lr_decay_steps);
  }
  compare_text("the decay style", "--lr-decay-style", flags.lr_decay_style, saved.lr_decay_style);
  compare("the starting weight decay", "--start-weight-decay, or --weight-decay", flags.start_wd, saved.start_wd);
  compare("the final weight decay", "--end-weight-decay, or --weight-decay", flags.end_wd, saved.end_wd);
  if (!constant_wd) {
    compare("the weight-decay increment in samples", "--train-iters x --global-batch-size, or --train-samples",
            flags.wd_incr_steps, saved.wd_incr_steps);
  }
  compare_text("the weight-decay increment style", "--weight-decay-incr-style", flags.wd_incr_style, saved.wd_incr_style);
  if (differ.empty()) return out;
  std::ostringstream e;
  e << checkpoint_dir << ": the flags' learning-rate schedule differs from the one the checkpoint was saved with:";
  for (const auto& d : differ) e << "\n  " << d;
  e << "\npass --override-opt-param-scheduler to go on with the flags' schedule from this point, or "
       "--use-checkpoint-opt-param-scheduler to keep the checkpoint's (Megatron refuses the difference too)";
  throw UserError(e.str());
}

}  // namespace megatron
