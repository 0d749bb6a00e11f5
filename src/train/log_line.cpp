#include "train/log_line.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace megatron {
namespace {

template <typename... T>
void append(std::string& out, const char* format, T... values) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), format, values...);
  out += buffer;
}

}  // namespace

std::string format_iteration_log(const IterationLog& l) {
  std::string s = l.timestamp.empty() ? std::string() : " [" + l.timestamp + "]";
  append(s, " iteration %8lld/%8lld |", (long long)l.iteration, (long long)l.train_iters);
  append(s, " consumed samples: %12lld |", (long long)l.consumed_samples);
  append(s, " elapsed time per iteration (ms): %.1f |", l.elapsed_ms_per_iteration);
  if (l.log_throughput) append(s, " throughput per GPU (TFLOP/s/GPU): %.1f |", l.tflops_per_device);
  append(s, " learning rate: %.6E |", l.learning_rate);
  append(s, " global batch size: %5lld |", (long long)l.global_batch_size);
  append(s, " lm loss: %.6E |", l.lm_loss);
  for (const auto& [name, value] : l.loss_terms) append(s, " %s: %.6E |", name.c_str(), value);
  append(s, " loss scale: %.1f |", l.loss_scale);
  if (l.grad_norm) append(s, " grad norm: %.3f |", *l.grad_norm);
  // Python prints the float count as "123.0".
  if (l.num_zeros) append(s, " num zeros: %.1f |", *l.num_zeros);
  if (l.params_norm) append(s, " params norm: %.3f |", *l.params_norm);
  append(s, " number of skipped iterations: %3lld |", (long long)l.skipped_iterations);
  append(s, " number of nan iterations: %3lld |", (long long)l.nan_iterations);
  // megatron.cpp's own fields after all of Megatron's, so `split('|')` parsers keep their indices.
  append(s, " throughput (tokens/s/GPU): %.1f |", l.tokens_per_second_per_device);
  if (l.mfu_percent >= 0) append(s, " MFU: %.1f%% |", l.mfu_percent);
  return s;
}

std::string megatron_timestamp(std::chrono::system_clock::time_point when) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count() % 1000000;
  std::tm local{};
  localtime_r(&seconds, &local);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S", &local);
  std::string out = text;
  append(out, ".%06lld", static_cast<long long>(micros < 0 ? micros + 1000000 : micros));
  return out;
}

std::string format_validation_log(const std::string& label, int64_t iteration, double loss, const std::string& which) {
  std::string body;
  append(body, " %s loss at iteration %lld%s%s | lm loss value: %.6E | lm loss PPL: %.6E | ", label.c_str(),
         (long long)iteration, which.empty() ? "" : " ", which.c_str(), loss, std::exp(std::min(20.0, loss)));
  const std::string rule(body.size() + 1, '-');
  return rule + "\n" + body + "\n" + rule;
}

}  // namespace megatron
