#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

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

double WeightDecaySchedule::at_samples(int64_t samples) const {
  if (style_ == "constant" || double(samples) > samples_) return end_;
  const double ratio = double(samples) / samples_;
  const double coeff = style_ == "linear" ? ratio : 0.5 * (std::cos(M_PI * (1.0 - ratio)) + 1.0);
  return start_ + coeff * (end_ - start_);
}

std::optional<LearningRateSchedule> decoupled_lr_schedule(const TrainConfig& config) {
  if (config.decoupled_lr < 0.0) return std::nullopt;
  TrainConfig decoupled = config;
  decoupled.lr = config.decoupled_lr;
  if (config.decoupled_min_lr >= 0.0) decoupled.min_lr = config.decoupled_min_lr;
  return LearningRateSchedule(decoupled);
}

}  // namespace megatron
