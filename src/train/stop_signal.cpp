#include "train/stop_signal.h"

#include <ATen/ATen.h>

#include <atomic>
#include <csignal>
#include <utility>

#include "core/streams.h"

namespace megatron {
namespace {

// Set by the signal handler, read between iterations. A handler can reach only a global.
std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int signal) { g_stop_signal.store(signal); }

}  // namespace

int exit_signal_number(const std::string& name) {
  static const std::pair<const char*, int> names[] = {{"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT},
                                                      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM},
                                                      {"SIGTERM", SIGTERM}, {"SIGXCPU", SIGXCPU}};
  for (const auto& [n, number] : names) {
    if (name == n) return number;
  }
  return -1;
}

StopSignal::StopSignal(const dist::ParallelState& ps, const at::Device& device, double exit_after_minutes,
                       std::chrono::steady_clock::time_point started, int exit_signal)
    : ps_(ps), device_(device), exit_after_minutes_(exit_after_minutes), started_(started) {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(exit_signal, on_stop_signal);
}

int StopSignal::signal() const { return seen_ != 0 ? seen_ : g_stop_signal.load(); }

double StopSignal::minutes_elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count() / 60.0;
}

int StopSignal::local_reason() const {
  if (const int signal = g_stop_signal.load(); signal != 0) return signal;
  return exit_after_minutes_ > 0 && minutes_elapsed() > exit_after_minutes_ ? kOutOfTime : 0;
}

void StopSignal::launch_poll() {
  if (ps_.world_size == 1) return;
  // Ranks may see a signal at different iterations and must stop at the same one. Each
  // iteration all-reduces (max) this rank's signal and copies the result to host memory without
  // waiting for it; requested() reads the result of kPollLag iterations ago. That collective
  // finished long before (the GPU runs at most about one iteration behind the host), so the
  // read does not stall the host as reading this iteration's would, and every rank reads the
  // same value at the same iteration.
  at::Tensor flag = at::full({1}, double(local_reason()), at::TensorOptions().device(device_).dtype(at::kFloat));
  ps_.world.all_reduce(flag, dist::ReduceOp::Max);
  Poll poll;
  if (device_.is_cpu()) {
    poll.host = flag;
  } else {
    poll.host = at::empty({1}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
    poll.host.copy_(flag, /*non_blocking=*/true);
    poll.ready.emplace(device_.type());
    poll.ready->record(current_stream(device_));
  }
  polls_.push_back(std::move(poll));
}

bool StopSignal::requested() {
  if (ps_.world_size == 1) {
    seen_ = local_reason();
    return seen_ != 0;
  }
  if (polls_.size() <= kPollLag) return false;
  Poll due = std::move(polls_.front());
  polls_.pop_front();
  if (due.ready) due.ready->synchronize();
  seen_ = static_cast<int>(due.host.data_ptr<float>()[0]);
  return seen_ != 0;
}

}  // namespace megatron
