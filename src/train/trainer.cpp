#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <memory>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "core/errors.h"
#include "data/batch.h"
#include "data/prefetcher.h"
#include "data/samples.h"
#include "model/gpt_model.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "train/log_line.h"
#include "train/tensorboard_writer.h"

namespace megatron {
namespace {

std::atomic<int> g_stop_signal{0};  // set by the signal handler, read between iterations

extern "C" void on_stop_signal(int signal) { g_stop_signal.store(signal); }

at::Device pick_device(const TrainConfig& t) {
  if (t.device == "cuda" && !at::hasCUDA()) {
    throw UserError("--device cuda: this build or machine has no CUDA device; use --device cpu");
  }
  if (t.device == "cuda" || (t.device == "auto" && at::hasCUDA())) return at::Device(at::kCUDA, 0);
  return at::Device(at::kCPU);
}

Batch to_device(Batch b, const at::Device& device) {
  if (device.is_cpu()) return b;
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device, /*non_blocking=*/true) : t; };
  return {move(b.tokens), move(b.labels), move(b.loss_mask), move(b.position_ids), move(b.attention_mask)};
}

// Model FLOPs per token as the baseline counts them: 6 per parameter (forward + backward) plus
// causal attention's 6 * layers * hidden * seq.
double flops_per_token(const ModelConfig& m, int64_t parameters) {
  return 6.0 * double(parameters) + 6.0 * m.num_layers * double(m.hidden_size) * m.seq_length;
}

class Trainer {
 public:
  explicit Trainer(const Config& c)
      : c_(c), t_(c.train), schedule_(c.train), device_(pick_device(c.train)), ltor_(ltor_options(c)) {}
  ~Trainer() {
    if (metrics_ != nullptr) std::fclose(metrics_);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int run();

 private:
  double evaluate();
  void save(const char* why);
  void log_iteration(double grad_norm);

  const Config& c_;
  const TrainConfig& t_;
  LearningRateSchedule schedule_;
  at::Device device_;
  LtorOptions ltor_;
  std::unique_ptr<GPTModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<SampleSource> train_data_, valid_data_;
  std::unique_ptr<BatchPrefetcher> train_batches_;  // declared after the sources it reads
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::FILE* metrics_ = nullptr;
  TrainingProgress progress_;
  int64_t last_saved_ = -1;

  // Accumulated over the current log interval.
  double interval_loss_ = 0;
  int64_t interval_iterations_ = 0;
  std::chrono::steady_clock::time_point interval_start_;
  double peak_tflops_ = 0;
  double flops_per_token_ = 0;
};

int Trainer::run() {
  const ModelConfig& m = c_.model;
  at::set_num_threads(t_.cpu_threads > 0 ? t_.cpu_threads : std::max(1u, std::thread::hardware_concurrency()));
  at::manual_seed(static_cast<uint64_t>(t_.seed));  // dropout draws from the default generators

  model_ = std::make_unique<GPTModel>(m);
  model_->initialize(static_cast<uint64_t>(t_.seed));
  model_->to(device_, t_.bf16 ? at::kBFloat16 : at::kFloat);
  model_->train();
  const int64_t parameters = model_->num_parameters();
  flops_per_token_ = flops_per_token(m, parameters);
  peak_tflops_ = t_.peak_tflops > 0 ? t_.peak_tflops : (device_.is_cuda() ? 989.0 : 0.0);

  std::vector<NamedTensor> named;
  for (const auto& p : model_->named_parameters()) named.push_back({p.key(), p.value()});
  optimizer_ = std::make_unique<AdamW>(named, t_);

  train_data_ = make_sample_source(c_, Split::Train);
  valid_data_ = make_sample_source(c_, Split::Valid);
  train_batches_ = std::make_unique<BatchPrefetcher>(
      [this](int64_t first) {
        return make_batch(*train_data_, first, t_.micro_batch_size, c_.model.seq_length, c_.model.vocab_size, ltor_);
      },
      t_.micro_batch_size);

  std::printf("> model: %d layers, hidden %d, %d heads (%d query groups), ffn %d, vocab %d (padded %d), seq %d\n",
              m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size, m.vocab_size,
              m.padded_vocab_size, m.seq_length);
  std::printf("> number of parameters: %lld, %s on %s, %d CPU threads\n", static_cast<long long>(parameters),
              t_.bf16 ? "bf16 (fp32 master weights)" : "fp32", device_.str().c_str(), at::get_num_threads());
  std::printf("> training data: %s\n", train_data_->describe().c_str());

  if (!t_.load.empty()) {
    if (auto loaded = load_checkpoint(t_.load, *model_, *optimizer_, c_)) {
      progress_ = *loaded;
      last_saved_ = progress_.iteration;
    }
  }
  if (!t_.tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(t_.tensorboard_dir);
  if (!t_.metrics_jsonl.empty()) {
    metrics_ = std::fopen(t_.metrics_jsonl.c_str(), "a");
    if (metrics_ == nullptr) throw UserError("--metrics-jsonl: cannot open " + t_.metrics_jsonl + " for appending");
  }

  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);

  const int64_t micro_batches = t_.global_batch_size / (t_.micro_batch_size * c_.parallel.data_parallel_size);
  interval_start_ = std::chrono::steady_clock::now();
  std::fflush(stdout);
  while (progress_.iteration < t_.train_iters) {
    optimizer_->zero_grad();
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().device(device_));
    for (int64_t k = 0; k < micro_batches; ++k) {
      const int64_t first = progress_.consumed_train_samples + k * t_.micro_batch_size;
      Batch batch = to_device(train_batches_->get(first), device_);
      at::Tensor loss = model_->loss(batch) / double(micro_batches);
      loss.backward();
      optimizer_->accumulate_grads();
      loss_sum += loss.detach();
    }
    const double grad_norm = optimizer_->grad_norm();
    const double loss_value = loss_sum.item<double>();
    if (!std::isfinite(grad_norm) || !std::isfinite(loss_value)) {
      ++progress_.nan_iterations;  // the update is skipped; parameters stay as they were
      ++progress_.skipped_iterations;
    } else {
      optimizer_->clip(grad_norm);
      optimizer_->step(schedule_.at(progress_.iteration));
      interval_loss_ += loss_value;
    }
    ++interval_iterations_;
    ++progress_.iteration;
    progress_.consumed_train_samples += t_.global_batch_size;
    if (metrics_ != nullptr) {
      // %a prints doubles exactly, so runs can be compared bit for bit.
      std::fprintf(metrics_, "{\"iteration\": %lld, \"lm_loss\": %.17g, \"grad_norm\": %.17g, \"lr\": %.17g, "
                             "\"lm_loss_hex\": \"%a\"}\n",
                   static_cast<long long>(progress_.iteration), loss_value, grad_norm, schedule_.at(progress_.iteration - 1),
                   loss_value);
      std::fflush(metrics_);
    }

    if (progress_.iteration % t_.log_interval == 0) log_iteration(grad_norm);
    if (t_.eval_interval > 0 && t_.eval_iters > 0 && valid_data_ && progress_.iteration % t_.eval_interval == 0) {
      const double valid_loss = evaluate();
      std::printf("%s\n", format_validation_log("validation", progress_.iteration, valid_loss).c_str());
      if (tensorboard_) tensorboard_->add_scalar("lm loss validation", float(valid_loss), progress_.iteration);
      std::fflush(stdout);
    }
    if (!t_.save.empty() && t_.save_interval > 0 && progress_.iteration % t_.save_interval == 0) save("save-interval");
    if (const int signal = g_stop_signal.load()) {
      std::printf("received signal %d: stopping after iteration %lld\n", signal, static_cast<long long>(progress_.iteration));
      if (!t_.save.empty()) save("signal");
      return 0;
    }
    if (t_.exit_interval > 0 && progress_.iteration % t_.exit_interval == 0) {
      std::printf("exiting program at iteration %lld (--exit-interval)\n", static_cast<long long>(progress_.iteration));
      if (!t_.save.empty()) save("exit-interval");
      return 0;
    }
  }
  if (!t_.save.empty()) save("end of training");
  return 0;
}

void Trainer::log_iteration(double grad_norm) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - interval_start_).count();
  const double per_iteration = elapsed / double(interval_iterations_);
  const double tokens_per_second = double(t_.global_batch_size) * c_.model.seq_length / per_iteration /
                                   double(c_.parallel.data_parallel_size);
  IterationLog l;
  l.iteration = progress_.iteration;
  l.train_iters = t_.train_iters;
  l.consumed_samples = progress_.consumed_train_samples;
  l.elapsed_ms_per_iteration = per_iteration * 1e3;
  l.tflops_per_device = tokens_per_second * flops_per_token_ / 1e12;
  l.tokens_per_second_per_device = tokens_per_second;
  l.mfu_percent = peak_tflops_ > 0 ? 100.0 * l.tflops_per_device / peak_tflops_ : -1;
  // As Megatron, the learning rate shown is the one the next step will use.
  l.learning_rate = schedule_.at(progress_.iteration);
  l.global_batch_size = t_.global_batch_size;
  const int64_t counted = interval_iterations_;
  l.lm_loss = counted > 0 ? interval_loss_ / double(counted) : 0.0;
  l.grad_norm = grad_norm;
  l.skipped_iterations = progress_.skipped_iterations;
  l.nan_iterations = progress_.nan_iterations;
  std::printf("%s\n", format_iteration_log(l).c_str());
  std::fflush(stdout);
  if (tensorboard_) {
    tensorboard_->add_scalar("lm loss", float(l.lm_loss), l.iteration);
    tensorboard_->add_scalar("learning-rate", float(l.learning_rate), l.iteration);
    tensorboard_->add_scalar("grad-norm", float(grad_norm), l.iteration);
    tensorboard_->add_scalar("throughput (tokens/s/GPU)", float(tokens_per_second), l.iteration);
  }
  interval_loss_ = 0;
  interval_iterations_ = 0;
  interval_start_ = std::chrono::steady_clock::now();
}

double Trainer::evaluate() {
  const ModelConfig& m = c_.model;
  model_->eval();
  at::NoGradGuard no_grad;
  const int64_t micro_batches = t_.global_batch_size / (t_.micro_batch_size * c_.parallel.data_parallel_size);
  at::Tensor total = at::zeros({}, at::TensorOptions().device(device_).dtype(at::kDouble));
  for (int64_t i = 0; i < t_.eval_iters * micro_batches; ++i) {
    Batch batch = to_device(make_batch(*valid_data_, progress_.consumed_valid_samples, t_.micro_batch_size, m.seq_length,
                                       m.vocab_size, ltor_), device_);
    progress_.consumed_valid_samples += t_.micro_batch_size;
    total += model_->loss(batch).to(at::kDouble);
  }
  model_->train();
  return total.item<double>() / double(t_.eval_iters * micro_batches);
}

void Trainer::save(const char* why) {
  if (last_saved_ == progress_.iteration) return;
  const auto start = std::chrono::steady_clock::now();
  save_checkpoint(t_.save, progress_, *model_, *optimizer_, c_);
  last_saved_ = progress_.iteration;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("saved checkpoint at iteration %lld to %s (%s, %.2f s)\n", static_cast<long long>(progress_.iteration),
              t_.save.c_str(), why, seconds);
  std::fflush(stdout);
  interval_start_ += std::chrono::steady_clock::now() - start;  // keep saving out of the step time
}

}  // namespace

int run_training(const Config& config) {
  Trainer trainer(config);
  return trainer.run();
}

}  // namespace megatron
