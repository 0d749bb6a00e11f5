// --profile: Megatron's PyTorch-profiler window. On the ranks in --profile-ranks, iterations
// [--profile-step-start, --profile-step-end) are recorded with Kineto (CPU operators and, on
// CUDA, every kernel); a Chrome trace (chrome://tracing, Perfetto) is written to
// --tensorboard-dir (else the working directory) and a table of where the time went is printed:
// CUDA kernels by total time on GPU, operators by inclusive time on CPU.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/config.h"

namespace megatron {

class StepProfiler {
 public:
  StepProfiler(const TrainConfig& config, int rank, const c10::Device& device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each training iteration; `completed` counts iterations done before it.
  void before_iteration(int64_t completed);
  void after_iteration(int64_t completed);

 private:
  void stop();
  bool enabled_ = false;
  bool running_ = false;
  int64_t start_ = 0, end_ = 0;
  int rank_ = 0;
  c10::Device device_;
  std::string dir_;
  double wall_start_ = 0;
};

}  // namespace megatron
