#include "train/profiler.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <vector>

namespace megatron {
namespace {

namespace prof = torch::profiler::impl;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::synchronizeDevice(device.index());
}

}  // namespace

StepProfiler::StepProfiler(const TrainConfig& t, int rank, const c10::Device& device)
    : start_(t.profile_step_start), end_(t.profile_step_end), rank_(rank), device_(device) {
  if (!t.profile) return;
  for (const auto& r : t.profile_ranks) enabled_ = enabled_ || std::stoi(r) == rank;
  dir_ = t.tensorboard_dir.empty() ? "." : t.tensorboard_dir;
}

StepProfiler::~StepProfiler() {
  if (running_) torch::autograd::profiler::disableProfiler();
}

void StepProfiler::before_iteration(int64_t completed) {
  if (!enabled_ || running_ || completed != start_) return;
  std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  synchronize(device_);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  running_ = true;
  wall_start_ = now_seconds();
}

void StepProfiler::after_iteration(int64_t completed) {
  if (running_ && completed >= end_) stop();
}

void StepProfiler::stop() {
  synchronize(device_);
  const double wall = now_seconds() - wall_start_;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
  running_ = false;
  char name[128];
  std::snprintf(name, sizeof(name), "/trace_rank%d_iterations_%lld-%lld.json", rank_, static_cast<long long>(start_),
                static_cast<long long>(end_ - 1));
  const std::string path = dir_ + name;
  result->save(path);

  // Where the time went: kernels on a GPU (they do not overlap on one stream), operators on CPU
  // (inclusive: an operator's time contains the operators it calls).
  const c10::DeviceType wanted = device_.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  std::map<std::string, std::pair<double, int64_t>> totals;  // name -> (seconds, calls)
  double sum = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != wanted || e.durationNs() == 0) continue;
    auto& [seconds, calls] = totals[e.name()];
    seconds += double(e.durationNs()) * 1e-9;
    ++calls;
    if (device_.is_cuda()) sum += double(e.durationNs()) * 1e-9;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const int64_t iterations = end_ - start_;
  std::printf("> profile of iterations %lld-%lld on rank %d: %.1f ms wall per iteration%s; trace in %s\n",
              static_cast<long long>(start_), static_cast<long long>(end_ - 1), rank_, 1e3 * wall / double(iterations),
              device_.is_cuda() ? (", " + std::to_string(int(1e3 * sum / double(iterations))) + " ms of kernels").c_str() : "",
              path.c_str());
  std::printf(">   %-10s %-8s %-8s %s\n", "ms/iter", "share", "calls", device_.is_cuda() ? "CUDA kernel" : "operator (inclusive)");
  const double reference = device_.is_cuda() ? sum : wall;
  for (size_t i = 0; i < std::min<size_t>(25, sorted.size()); ++i) {
    const auto& [op, stat] = sorted[i];
    std::printf(">   %-10.2f %5.1f%%   %-8lld %.100s\n", 1e3 * stat.first / double(iterations), 100.0 * stat.first / reference,
                static_cast<long long>(stat.second / iterations), op.c_str());
  }
  std::fflush(stdout);
}

}  // namespace megatron
