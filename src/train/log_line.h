// Megatron-shaped log lines, so the log parsers users already have keep working.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megatron {

struct IterationLog {
  std::string timestamp;  // megatron_timestamp(): Megatron's " [YYYY-MM-DD HH:MM:SS.ffffff]" prefix ("" for none)
  bool log_throughput = false;  // --log-throughput: Megatron's TFLOP/s field
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iteration = 0;
  double tflops_per_device = 0;
  double tokens_per_second_per_device = 0;
  double mfu_percent = -1;  // < 0: not reported (no known peak for the device)
  double learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  std::vector<std::pair<std::string, double>> loss_terms;  // the family's named terms, after "lm loss"
  double loss_scale = 1.0;  // fp16's current loss scale; 1 without one
  std::optional<double> grad_norm;  // none when the iteration's update was skipped, as Megatron
  std::optional<double> num_zeros;    // --log-num-zeros-in-grad
  std::optional<double> params_norm;  // --log-params-norm
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
};

// Megatron's training_log line, field by field in its order, then megatron.cpp's own fields:
// " [2026-12-02 01:02:03.045678] iteration       10/     100 | consumed samples:          320 |
// elapsed time per iteration (ms): 812.3 | [throughput per GPU (TFLOP/s/GPU): 1.2 |] learning rate:
// 3.000000E-04 | global batch size:    32 | lm loss: 7.123456E+00 | [<term>: 1.000000E-02 | ...]
// loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan
// iterations:   0 | throughput (tokens/s/GPU): 512.0 | MFU: 40.1% |" (one line)
std::string format_iteration_log(const IterationLog& log);

// Local time as Python's datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f'), Megatron's prefix.
std::string megatron_timestamp(std::chrono::system_clock::time_point when);

// Megatron's validation block: a dashed rule, " validation loss at iteration N | lm loss value:
// X | lm loss PPL: Y | ", a dashed rule. `which` names the data after the iteration ("for test
// data"), as `megatron eval` prints each split.
std::string format_validation_log(const std::string& label, int64_t iteration, double loss, const std::string& which = "");

}  // namespace megatron
