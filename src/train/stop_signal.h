// SIGTERM / SIGINT (or --exit-signal's) during training, or the run's time running out
// (--exit-duration-in-mins): the run stops after an iteration that every rank agrees on (and the
// caller saves a checkpoint first). One process reads the signal directly; several
// all-reduce it each iteration and act on the result of an earlier iteration, so the read never
// stalls the host on the step in flight.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <chrono>
#include <deque>
#include <optional>
#include <string>

#include "distributed/parallel_state.h"

namespace megatron {

// The number of a signal --exit-signal may name (Megatron takes signal.Signals' names: SIGTERM,
// SIGUSR1, ...), -1 for any other name.
int exit_signal_number(const std::string& name);

class StopSignal {
 public:
  // What signal() reports when the time given to the constructor has run out.
  static constexpr int kOutOfTime = 1000;
  // Installs the handlers for SIGTERM, SIGINT and `exit_signal` (Megatron's --exit-signal, e.g.
  // SIGUSR1). With `exit_after_minutes` > 0 the run also stops once that long has passed since
  // `started` (Megatron's --exit-duration-in-mins).
  StopSignal(const dist::ParallelState& ps, const at::Device& device, double exit_after_minutes = 0,
             std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(), int exit_signal = 15);
  // Each iteration, inside the step on multi-rank runs: this rank's signal all-reduced (max)
  // over the world, copied to host memory without waiting.
  void launch_poll();
  // Between iterations: whether to stop now (the same answer on every rank at the same
  // iteration; multi-rank runs see a signal kPollLag iterations after it arrived).
  bool requested();
  int signal() const;  // the signal seen (kOutOfTime: the time ran out), 0 if none
  double minutes_elapsed() const;

 private:
  struct Poll {
    at::Tensor host;                  // [1] fp32: the world's max signal, in host memory once ready
    std::optional<c10::Event> ready;  // recorded after the copy (GPU runs)
  };
  static constexpr size_t kPollLag = 2;
  // This rank's reason to stop: its signal, else kOutOfTime once the time has run out.
  int local_reason() const;
  const dist::ParallelState& ps_;
  at::Device device_;
  double exit_after_minutes_;
  std::chrono::steady_clock::time_point started_;
  int seen_ = 0;  // the agreed reason, once requested() has returned true
  std::deque<Poll> polls_;
};

}  // namespace megatron
