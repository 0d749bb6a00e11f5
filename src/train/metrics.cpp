#include "train/metrics.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "core/memory.h"
#include "train/log_line.h"

namespace megatron {
namespace {

// %.17g (exact), and for values JSON has no number for, the tokens Python's json module writes
// and reads (NaN, Infinity), which %g would print as nan / inf.
std::string json_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

}  // namespace

TrainingMetrics::TrainingMetrics(const Config& config, const dist::ParallelState& ps, const at::Device& device,
                                 double flops_per_token, std::vector<std::string> loss_terms)
    : c_(config),
      ps_(ps),
      device_(device),
      flops_per_token_(flops_per_token),
      peak_tflops_(config.train.peak_tflops > 0 ? config.train.peak_tflops : (device.is_cuda() ? 989.0 : 0.0)),
      loss_terms_(std::move(loss_terms)),
      interval_terms_(at::zeros({int64_t(loss_terms_.size())}, at::TensorOptions().device(device).dtype(at::kDouble))),
      interval_start_(std::chrono::steady_clock::now()) {
  const TrainConfig& t = config.train;
  if (!t.tensorboard_dir.empty() && prints()) tensorboard_ = std::make_unique<TensorBoardWriter>(t.tensorboard_dir);
  if (!t.metrics_jsonl.empty() && prints()) {
    jsonl_ = std::fopen(t.metrics_jsonl.c_str(), "a");
    if (jsonl_ == nullptr) throw UserError("--metrics-jsonl: cannot open " + t.metrics_jsonl + " for appending");
  }
}

TrainingMetrics::~TrainingMetrics() {
  try {
    write_tensorboard_steps();  // the iterations after the last log interval
  } catch (const std::exception& e) {
    std::fprintf(stderr, "WARNING: the last iterations' TensorBoard scalars were not written: %s\n", e.what());
  }
  if (jsonl_ != nullptr) std::fclose(jsonl_);
}

void TrainingMetrics::add_step(int64_t iteration, double lr, double next_lr, int64_t consumed_samples, int64_t global_batch,
                               const StepOutcome& step) {
  const at::Tensor &loss = step.loss, &grad_norm = step.grad_norm, &applied = step.applied, &terms = step.terms;
  last_step_ = step;
  interval_samples_ += global_batch;
  last_global_batch_ = global_batch;
  if (tensorboard_) {
    std::vector<double> memory;
    if (c_.train.log_memory_to_tensorboard) {
      if (const auto m = allocator_statistics(device_)) {
        memory = {double(m->reserved_bytes), double(m->allocated_bytes), double(m->max_allocated_bytes), double(m->allocation_count)};
      }
    }
    tensorboard_steps_.push_back({iteration, consumed_samples, global_batch, next_lr, step, std::move(memory)});
  }
  // Nothing so far waited for the GPU: a loss or norm that is not finite skipped the update on
  // the device (parameters stay as they were) and is counted when the statistics are read back.
  statistics_.add(loss, grad_norm, applied);
  if (!loss_terms_.empty()) interval_terms_ += terms * applied.to(at::kDouble);
  if (jsonl_ != nullptr) {  // reading the values back waits for the step
    const double loss_value = loss.item<double>(), norm = grad_norm.item<double>();
    // %a prints doubles exactly, so runs can be compared bit for bit.
    std::string terms_json;  // the named loss terms (an MoE balancing loss, ...) after the loss
    if (!loss_terms_.empty()) {
      const at::Tensor values = terms.to(at::kCPU, at::kDouble);
      for (size_t i = 0; i < loss_terms_.size(); ++i) {
        terms_json += ", \"" + loss_terms_[i] + "\": " + json_number(values[int64_t(i)].item<double>());
      }
    }
    std::fprintf(jsonl_, "{\"iteration\": %lld, \"lm_loss\": %s%s, \"grad_norm\": %s, \"lr\": %.17g, \"lm_loss_hex\": \"%a\"}\n",
                 static_cast<long long>(iteration), json_number(loss_value).c_str(), terms_json.c_str(), json_number(norm).c_str(), lr,
                 loss_value);
    std::fflush(jsonl_);
  }
}

void TrainingMetrics::settle(TrainingProgress& progress) {
  const StepStatistics::Totals t = statistics_.take();
  interval_loss_ += t.applied_loss_sum;
  interval_all_loss_ += t.loss_sum;
  interval_iterations_ += t.iterations;
  interval_skipped_ += t.skipped;
  interval_nan_ += t.nan;
  progress.skipped_iterations += t.skipped;
  progress.nan_iterations += t.nan;
  if (t.iterations > 0) {
    last_grad_norm_ = t.last_grad_norm;
    last_applied_ = t.last_applied;
  }
}

void TrainingMetrics::log_iteration(TrainingProgress& progress, double next_lr, bool first_iteration) {
  settle(progress);
  const TrainConfig& t = c_.train;
  // Megatron logs its first iteration without resetting the interval's accumulators, so the
  // interval's line still covers it; a first iteration that ends an interval resets as any.
  const bool reset = !first_iteration || progress.iteration % t.log_interval == 0;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - interval_start_).count();
  const double per_iteration = elapsed / double(interval_iterations_);
  // The interval's samples (its global batches vary under --step-batch-size-schedule).
  const double tokens_per_second = double(interval_samples_) * c_.model.seq_length / elapsed / double(ps_.world_size);
  IterationLog l;
  l.timestamp = megatron_timestamp(std::chrono::system_clock::now());
  l.log_throughput = t.log_throughput;
  l.iteration = progress.iteration;
  l.train_iters = t.train_iters;
  l.consumed_samples = progress.consumed_train_samples;
  l.elapsed_ms_per_iteration = per_iteration * 1e3;
  l.tflops_per_device = tokens_per_second * flops_per_token_ / 1e12;
  l.tokens_per_second_per_device = tokens_per_second;
  l.mfu_percent = peak_tflops_ > 0 ? 100.0 * l.tflops_per_device / peak_tflops_ : -1;
  // As Megatron, the learning rate shown is the one the next step will use.
  l.learning_rate = next_lr;
  l.global_batch_size = last_global_batch_;
  // Averaged over the applied iterations, as Megatron's "advanced iterations".
  const int64_t counted = interval_iterations_ - interval_skipped_;
  // With every iteration of the interval skipped, the mean of their losses (NaN if one was)
  // rather than Megatron's 0 over none: a diverged run never reads as a loss of 0.
  l.lm_loss = counted > 0 ? interval_loss_ / double(counted) : interval_all_loss_ / double(std::max<int64_t>(1, interval_iterations_));
  if (last_step_.loss_scale.defined()) l.loss_scale = last_step_.loss_scale.item<double>();
  // A skipped step has no gradient norm or zero count in Megatron's line.
  if (last_applied_) l.grad_norm = last_grad_norm_;
  if (last_applied_ && last_step_.grad_zeros.defined()) l.num_zeros = last_step_.grad_zeros.item<double>();
  if (last_step_.params_norm.defined()) l.params_norm = last_step_.params_norm.item<double>();
  if (!loss_terms_.empty()) {
    const at::Tensor sums = interval_terms_.cpu();
    for (size_t i = 0; i < loss_terms_.size(); ++i) {
      l.loss_terms.emplace_back(loss_terms_[i], counted > 0 ? sums[int64_t(i)].item<double>() / double(counted) : 0.0);
    }
    if (reset) interval_terms_.zero_();
  }
  l.skipped_iterations = interval_skipped_;
  l.nan_iterations = interval_nan_;
  if (prints()) std::printf("%s\n", format_iteration_log(l).c_str());
  std::fflush(stdout);
  write_tensorboard_steps();
  if (tensorboard_) {
    tensorboard_->add_scalar("throughput (tokens/s/GPU)", float(tokens_per_second), l.iteration);  // ours
    // Megatron's timer series at the log interval (its default --timing-log-level 0 adds no
    // per-region timers), not at the run's first iteration, whose time is the set-up's.
    if (t.log_timers_to_tensorboard && !first_iteration) {
      tensorboard_->add_scalar("iteration-time", float(per_iteration), l.iteration);
      if (t.log_throughput) tensorboard_->add_scalar("throughput", float(l.tflops_per_device), l.iteration);
    }
  }
  if (!reset) return;
  interval_loss_ = interval_all_loss_ = 0;
  interval_iterations_ = 0;
  interval_skipped_ = interval_nan_ = 0;
  interval_samples_ = 0;
  start_interval();
}

void TrainingMetrics::write_tensorboard_steps() {
  if (!tensorboard_ || tensorboard_steps_.empty()) return;
  // One copy to host memory per series, as doubles: [steps] (or [steps, terms]).
  auto host = [&](at::Tensor StepOutcome::*field) {
    std::vector<at::Tensor> values;
    for (const auto& s : tensorboard_steps_) values.push_back(s.values.*field);
    return values.front().defined() ? at::stack(values).to(at::kCPU, at::kDouble).contiguous() : at::Tensor();
  };
  const at::Tensor loss_values = host(&StepOutcome::loss), norm_values = host(&StepOutcome::grad_norm);
  const at::Tensor term_values = loss_terms_.empty() ? at::Tensor() : host(&StepOutcome::terms);
  const at::Tensor zeros_values = host(&StepOutcome::grad_zeros), params_norm_values = host(&StepOutcome::params_norm);
  const at::Tensor applied_values = host(&StepOutcome::applied), scale_values = host(&StepOutcome::loss_scale);
  const double* loss_at = loss_values.data_ptr<double>();
  const double* norm_at = norm_values.data_ptr<double>();
  const double* terms_at = loss_terms_.empty() ? nullptr : term_values.data_ptr<double>();
  for (size_t i = 0; i < tensorboard_steps_.size(); ++i) {
    const TensorBoardStep& s = tensorboard_steps_[i];
    // Megatron's training_log: each scalar against the iteration and against consumed samples.
    auto both = [&](const std::string& tag, double value) {
      tensorboard_->add_scalar(tag, float(value), s.iteration);
      tensorboard_->add_scalar(tag + " vs samples", float(value), s.consumed_samples);
    };
    both("learning-rate", s.next_lr);
    both("batch-size", double(s.global_batch));
    both("lm loss", loss_at[i]);
    for (size_t k = 0; k < loss_terms_.size(); ++k) both(loss_terms_[k], terms_at[i * loss_terms_.size() + k]);
    both("loss-scale", scale_values.defined() ? scale_values.data_ptr<double>()[i] : 1.0);  // bf16 and fp32: none
    if (c_.train.log_world_size_to_tensorboard) both("world-size", ps_.world_size);
    // As Megatron, a skipped step has no gradient norm or zero count.
    const bool applied = applied_values.data_ptr<double>()[i] != 0.0;
    if (applied) both("grad-norm", norm_at[i]);
    if (applied && zeros_values.defined()) both("num-zeros", zeros_values.data_ptr<double>()[i]);
    if (params_norm_values.defined()) both("params-norm", params_norm_values.data_ptr<double>()[i]);
    if (!s.memory.empty()) {
      const char* tags[] = {"mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes", "mem-allocated-count"};
      for (size_t k = 0; k < 4; ++k) tensorboard_->add_scalar(tags[k], float(s.memory[k]), s.iteration);
    }
  }
  tensorboard_steps_.clear();
}

void TrainingMetrics::log_validation(int64_t iteration, int64_t consumed_samples, double loss, const std::string& split) {
  if (prints()) {
    std::printf("%s\n", format_validation_log("validation", iteration, loss, split.empty() ? "" : "for " + split + " data").c_str());
  }
  if (tensorboard_) {
    const std::string tag = split.empty() ? "lm loss validation" : "lm loss " + split;
    tensorboard_->add_scalar(tag, float(loss), iteration);
    tensorboard_->add_scalar(tag + " vs samples", float(loss), consumed_samples);
    if (c_.train.log_validation_ppl_to_tensorboard) {
      const double ppl = std::exp(std::min(20.0, loss));  // Megatron's cap, as in the printed PPL
      tensorboard_->add_scalar(tag + " ppl", float(ppl), iteration);
      tensorboard_->add_scalar(tag + " ppl vs samples", float(ppl), consumed_samples);
    }
  }
  std::fflush(stdout);
}

}  // namespace megatron
