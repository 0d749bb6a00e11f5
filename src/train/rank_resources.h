// What one training rank runs on: its device (one GPU per local rank, or the CPU), its CPU
// threads, and the high-priority stream the training loop queues its work on.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <optional>

#include "core/config.h"
#include "distributed/launch_env.h"

namespace megatron {

// One GPU per local rank (made the current device, which NCCL uses); CPU otherwise. UserError
// for --device cuda without one, or more local ranks than GPUs.
at::Device pick_device(const TrainConfig& t, const dist::LaunchEnv& env);

// --cpu-threads, else OMP_NUM_THREADS (what `megatron launch` and torchrun give each rank, so
// ranks sharing a node do not each take every core), else one per core.
int cpu_threads(const TrainConfig& t);

// The most intra-op threads a flag may ask for: OpenMP aborts (no error to catch) starting
// billions, and no machine has more cores than this.
constexpr int kMaxCpuThreads = 1024;

// The training loop on a high-priority stream of its own, for its lifetime: with the optimizer
// step overlapped, the block scheduler then dispatches the forward's kernels before the updates
// (queued on a normal-priority stream), which fill the SMs those leave idle. It starts after the
// work queued on the stream it replaces, and that stream resumes after it.
class HighPriorityStream {
 public:
  explicit HighPriorityStream(const at::Device& device);
  ~HighPriorityStream();
  HighPriorityStream(const HighPriorityStream&) = delete;
  HighPriorityStream& operator=(const HighPriorityStream&) = delete;

 private:
  c10::Stream previous_, stream_;
  std::optional<c10::StreamGuard> current_;
};

}  // namespace megatron
