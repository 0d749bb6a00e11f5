#include "train/rank_resources.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/errors.h"
#include "core/streams.h"

namespace megatron {

at::Device pick_device(const TrainConfig& t, const dist::LaunchEnv& env) {
  if (t.device == "cuda" && !at::hasCUDA()) {
    throw UserError("--device cuda: this build or machine has no CUDA device; use --device cpu");
  }
  if (t.device == "cuda" || (t.device == "auto" && at::hasCUDA())) {
    const auto* cuda = c10::impl::getDeviceGuardImpl(at::kCUDA);
    const int count = static_cast<int>(cuda->deviceCount());
    if (env.local_rank >= count) {
      throw UserError("local rank " + std::to_string(env.local_rank) + " has no GPU: this node has " +
                      std::to_string(count) + "; start at most that many processes per node");
    }
    const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    cuda->setDevice(device);
    return device;
  }
  return at::Device(at::kCPU);
}

int cpu_threads(const TrainConfig& t) {
  if (t.cpu_threads > 0) return t.cpu_threads;
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && *omp != '\0') {
    char* end = nullptr;
    const long n = std::strtol(omp, &end, 10);
    if (*end != '\0' || n < 1) throw UserError(std::string("OMP_NUM_THREADS='") + omp + "' is not a positive integer");
    return static_cast<int>(n);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

HighPriorityStream::HighPriorityStream(const at::Device& device)
    : previous_(current_stream(device)), stream_(pooled_stream(device, /*high_priority=*/true)) {
  order_after(previous_, stream_);
  current_.emplace(stream_);
}

HighPriorityStream::~HighPriorityStream() {
  current_.reset();
  order_after(stream_, previous_);
}

}  // namespace megatron
